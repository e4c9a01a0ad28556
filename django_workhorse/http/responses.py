"""The responses of an ``@idempotent`` view: which are stored, how they are stored and replayed, and
the problem responses (RFC 9457) for a missing, malformed, reused or busy key."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from django.http import HttpResponse, HttpResponseBase

from django_workhorse.exceptions import IdempotentViewError

PROBLEM_JSON = "application/problem+json"
REPLAYED_HEADER = "Idempotent-Replayed"
# The headers a replay carries: what describes the response's content and where it points. Never
# Set-Cookie (a replay must not hand out a session) nor anything hop-by-hop.
REPLAYED_HEADERS = (
    "Content-Type",
    "Content-Language",
    "Content-Disposition",
    "Location",
    "ETag",
    "Last-Modified",
    "Link",
    "Cache-Control",
    "Expires",
    "Vary",
)
_REPLAYED = frozenset(name.lower() for name in REPLAYED_HEADERS)
# RFC 9110's reason phrases of the problems we answer (Python before 3.13 names 422 by RFC 4918).
TITLES = {400: "Bad Request", 409: "Conflict", 422: "Unprocessable Content"}
# Statuses a retry should be able to change: "in conflict, try later" and "too many requests".
RETRYABLE_CLIENT_STATUSES = frozenset({409, 429})


def is_stored(status: int) -> bool:
    """Whether a response with ``status`` is stored for replay (and the view's writes commit).

    2xx and 3xx (the redirect after a successful POST) and 4xx other than 409 and 429. A 5xx, a
    409 or a 429 is not: the view's transaction is rolled back and the key is free for a retry.
    """
    return 200 <= status < 500 and status not in RETRYABLE_CLIENT_STATUSES


def stored_form(request: Any, response: HttpResponseBase, max_bytes: int) -> tuple[int, str, bytes]:
    """Return ``(status, headers JSON, body)`` of a response to store; render it first if it defers.

    Raise ``IdempotentViewError`` for a streaming response or a body over ``max_bytes``.
    """
    if getattr(response, "streaming", False):
        raise IdempotentViewError(field="response", bound="not streaming (a streaming response cannot be replayed)")
    _render(request, response)
    body = bytes(response.content)  # type: ignore[attr-defined]
    if len(body) > max_bytes:
        raise IdempotentViewError(
            field="response",
            bound=f"at most {max_bytes} bytes to be stored (WORKHORSE_IDEMPOTENT_RESPONSE_MAX_BYTES)",
            value=f"{len(body)} bytes",
        )
    headers = [[name, value] for name, value in response.items() if name.lower() in _REPLAYED]
    return response.status_code, json.dumps(headers), body


def replay(status: int, headers: list[list[str]], body: bytes) -> HttpResponse:
    """Rebuild a stored response, marked ``Idempotent-Replayed: true``."""
    response = HttpResponse(body, status=status)
    del response["Content-Type"]
    for name, value in headers:
        response[name] = value
    response[REPLAYED_HEADER] = "true"
    return response


def unreadable() -> HttpResponse:
    """The 500 of a stored response that does not decrypt: a problem document with no detail."""
    document = {"type": "about:blank", "title": HTTPStatus(500).phrase, "status": 500}
    return HttpResponse(json.dumps(document), status=500, content_type=PROBLEM_JSON)


def problem(status: int, code: str, detail: str, **extensions: Any) -> HttpResponse:
    """An RFC 9457 problem response (``application/problem+json``, type ``about:blank``, so the title is
    the status phrase); ``code`` tells the problems apart and ``detail`` says what to do."""
    document = {
        "type": "about:blank",
        "title": TITLES.get(status) or HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "code": code,
        **extensions,
    }
    return HttpResponse(json.dumps(document), status=status, content_type=PROBLEM_JSON)


def _render(request: Any, response: HttpResponseBase) -> None:
    """Render a deferred response now (a TemplateResponse, a DRF Response), so its body can be stored.

    A DRF ``Response`` returned by a handler is rendered by the view's ``finalize_response`` after
    the handler returns; here it gets the renderer DRF's content negotiation chose for the request.
    """
    render = getattr(response, "render", None)
    if render is None or getattr(response, "is_rendered", True):
        return
    if not hasattr(response, "accepted_renderer") and hasattr(request, "accepted_renderer"):
        response.accepted_renderer = request.accepted_renderer  # type: ignore[attr-defined]
        response.accepted_media_type = request.accepted_media_type  # type: ignore[attr-defined]
        context = dict(getattr(request, "parser_context", None) or {})
        response.renderer_context = {**context, "request": request, "response": response}  # type: ignore[attr-defined]
    render()
