"""What makes two HTTP requests the same request: method, route and its arguments, query, content type, body.

Each part is reduced to canonical text and digested (``fingerprint.field_digest``), so a reused key
with a different request names the parts that differ without storing or echoing any of them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any
from urllib.parse import parse_qsl

from django.http.request import RawPostDataException

from django_workhorse.exceptions import IdempotentViewError
from django_workhorse.fingerprint import FIELD_DIGEST_HEX_CHARS, canonical_json, field_digest, request_digest

PARTS = ("method", "route", "arguments", "query", "content_type", "body")
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"


def request_fingerprint(request: Any) -> tuple[bytes, dict[str, str]]:
    """Return the request's digest and a digest per part (``PARTS``); the body is read, never kept."""
    match = getattr(request, "resolver_match", None)
    content_type = _media_type(request.META.get("CONTENT_TYPE", ""))
    texts = {
        "method": request.method or "",
        "route": match.route if match is not None and match.route else request.path_info,
        # Converted values as text (an int, a UUID, a slug), so any converter's value has one form.
        "arguments": canonical_json(
            [[str(arg) for arg in match.args], {name: str(arg) for name, arg in match.kwargs.items()}]
            if match is not None
            else []
        ),
        "query": canonical_json(sorted(parse_qsl(request.META.get("QUERY_STRING", ""), keep_blank_values=True))),
        "content_type": content_type,
    }
    digests = {name: field_digest(text) for name, text in texts.items()}
    digests["body"] = _form_digest(request) if content_type == MULTIPART else _body_digest(_body(request), content_type)
    return request_digest(digests), digests


def differing_parts(stored: dict[str, str], current: dict[str, str]) -> list[str]:
    """Return the parts (in ``PARTS`` order) whose digests differ between two fingerprints."""
    return [name for name in PARTS if stored.get(name) != current.get(name)]


def _media_type(header: str) -> str:
    """The media type without its parameters (charset, boundary), lower case."""
    return header.split(";", 1)[0].strip().lower()


def _body(request: Any) -> bytes:
    try:
        return bytes(request.body)
    except RawPostDataException:
        raise IdempotentViewError(
            field="request.body",
            bound="unread when @idempotent runs (decorate the view or handler before anything reads the body)",
        ) from None


def _form_digest(request: Any) -> str:
    """A multipart body by its parsed fields (sorted) and each file's field, name, type and content
    digest: the boundary a client chose is not part of it, so a retry that re-encodes the form is the
    same request, and a body CSRF middleware already parsed can still be fingerprinted."""
    files = []
    for field, uploads in sorted(request.FILES.lists()):
        for upload in uploads:
            content = hashlib.sha256()
            for chunk in upload.chunks():
                content.update(chunk)
            upload.seek(0)
            files.append([field, upload.name, upload.content_type, content.hexdigest()])
    return field_digest(canonical_json([sorted(request.POST.lists()), files]))


def _body_digest(body: bytes, content_type: str) -> str:
    """JSON bodies by their canonical JSON (key order and spacing do not matter); forms by their sorted
    fields; anything else, or a body that does not parse as its type says, by its bytes."""
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            return field_digest(canonical_json(json.loads(body)))
        except (ValueError, TypeError, RecursionError):
            pass
    elif content_type == FORM:
        try:
            pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=bool(body))
        except (UnicodeDecodeError, ValueError):
            pass
        else:
            return field_digest(canonical_json(sorted(pairs)))
    return hashlib.sha256(body).hexdigest()[:FIELD_DIGEST_HEX_CHARS]
