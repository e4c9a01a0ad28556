"""What makes two HTTP requests the same request: method, route and its arguments, query, content type, body.

Each part is reduced to canonical text and digested (``fingerprint.field_digest``), so a reused key
with a different request names the parts that differ without storing or echoing any of them.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings
from django.http.request import RawPostDataException

from django_workhorse.enqueueing.fingerprints import (
    FIELD_DIGEST_HEX_CHARS,
    canonical_json,
    field_digest,
    request_digest,
)
from django_workhorse.exceptions import IdempotentViewError

PARTS = ("method", "route", "arguments", "query", "content_type", "body")
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
# Content-Encoding values decoded before the body is fingerprinted, and zlib's window for each.
DECODED_ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# The most a decoded body may hold when DATA_UPLOAD_MAX_MEMORY_SIZE is None (no limit of Django's).
MAX_DECODED_BODY_BYTES = 16 * 1024 * 1024


# What a duplicate-key JSON object raises, inside the parse (a ValueError json.loads passes on).
_DUPLICATE_KEY = "duplicate key"


@dataclass(frozen=True)
class BodyRefusal:
    """A body that cannot be fingerprinted as the request it is: answered with this 4xx problem."""

    status: int
    code: str
    detail: str


def request_fingerprint(request: Any) -> tuple[bytes, dict[str, str]] | BodyRefusal:
    """Return the request's digest and a digest per part (``PARTS``); the body is read, never kept.

    A body with ``Content-Encoding: gzip`` or ``deflate`` is fingerprinted decoded, so a retry that
    compresses it again (differently) is the same request. Return a ``BodyRefusal`` for a JSON body
    with a key twice in one object (its meaning depends on the parser), or one that decodes to
    more than ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes.
    """
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
    if content_type == MULTIPART:
        digests["body"] = _form_digest(request)
    else:
        decoded = _decoded(_body(request), request.META.get("HTTP_CONTENT_ENCODING", ""))
        body = decoded if isinstance(decoded, BodyRefusal) else _body_digest(decoded, content_type)
        if isinstance(body, BodyRefusal):
            return body
        digests["body"] = body
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


def _body_digest(body: bytes, content_type: str) -> str | BodyRefusal:
    """JSON bodies by their canonical JSON (key order and spacing do not matter); forms by their sorted
    fields; anything else, or a body that does not parse as its type says, by its bytes."""
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            return field_digest(canonical_json(json.loads(body, object_pairs_hook=_unique_keys)))
        except ValueError as exc:
            if exc.args[:1] == (_DUPLICATE_KEY,):
                return BodyRefusal(
                    400,
                    "idempotency-body-duplicate-keys",
                    f"The JSON body has the key {exc.args[1]!r} twice in one object; send each key once.",
                )
        except (TypeError, RecursionError):
            pass
    elif content_type == FORM:
        try:
            pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=bool(body))
        except (UnicodeDecodeError, ValueError):
            pass
        else:
            return field_digest(canonical_json(sorted(pairs)))
    return hashlib.sha256(body).hexdigest()[:FIELD_DIGEST_HEX_CHARS]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise ValueError(_DUPLICATE_KEY, name[:64])
            seen.add(name)
    return found


def _decoded(body: bytes, encoding_header: str) -> bytes | BodyRefusal:
    """The body with its ``Content-Encoding`` undone (last applied, first undone), at most the
    configured size; as sent when an encoding is unknown or its bytes do not decode."""
    codings = [coding.strip().lower() for coding in encoding_header.split(",") if coding.strip()]
    if not codings or any(coding not in DECODED_ENCODINGS and coding != "identity" for coding in codings):
        return body
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE or MAX_DECODED_BODY_BYTES
    decoded = body
    for coding in reversed(codings):
        if coding == "identity":
            continue
        inflater = zlib.decompressobj(DECODED_ENCODINGS[coding])
        try:
            out = inflater.decompress(decoded, limit + 1)
        except zlib.error:
            return body
        if len(out) > limit or inflater.unconsumed_tail:
            return BodyRefusal(
                413, "idempotency-body-too-large", f"The request body decodes to more than {limit} bytes."
            )
        if not inflater.eof:
            return body  # truncated: not the encoding it claims
        decoded = out
    return decoded
