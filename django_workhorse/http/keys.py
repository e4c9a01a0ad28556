"""The ``Idempotency-Key`` header, the owner a record belongs to, and what a view gets as ``request.idempotency``."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django_workhorse import conf
from django_workhorse.enqueueing.fingerprints import derived_http_key, http_key_hash, key_digest, key_preview
from django_workhorse.exceptions import IdempotencyKeyError, IdempotentViewError
from django_workhorse.sql.http_records import RecordKey
from django_workhorse.types import Idempotency

HEADER = "Idempotency-Key"
META_HEADER = "HTTP_IDEMPOTENCY_KEY"
ANONYMOUS_OWNER = "anonymous"
# A request that carries this is never keyed as the anonymous owner (its credentials were not accepted).
CREDENTIALS_HEADER = "HTTP_AUTHORIZATION"
# RFC 8941 sf-string: printable ASCII in double quotes, with \" and \\ the only escapes.
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
# A bare token, as clients that skip the quotes send: visible ASCII without quotes, commas or semicolons.
_BARE_TOKEN = re.compile(r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]+")
_ESCAPE = re.compile(r"\\([\"\\])")


def parse_key(value: str) -> str:
    """Return the key an ``Idempotency-Key`` header carries: an sf-string, or a bare token.

    Raise ``IdempotencyKeyError`` for anything else (several values, parameters, control characters)
    and for a key that is empty or longer than ``conf.MAX_KEY_BYTES`` bytes.
    """
    value = value.strip(" \t")
    quoted = _SF_STRING.fullmatch(value)
    if quoted is not None:
        key = _ESCAPE.sub(r"\1", quoted.group(1))
    elif _BARE_TOKEN.fullmatch(value):
        key = value
    else:
        raise IdempotencyKeyError(
            "the Idempotency-Key header must be one string: a quoted structured-field string "
            '("…", printable ASCII) or a bare token, without parameters or a list'
        )
    if not 1 <= len(key) <= conf.MAX_KEY_BYTES:  # printable ASCII: one byte per character
        raise IdempotencyKeyError(f"the Idempotency-Key must be 1..{conf.MAX_KEY_BYTES} characters, got {len(key)}")
    return key


def resolve_owner(request: Any, owner: Callable[[Any], str] | None) -> str:
    """Return whose record a request reads and writes: ``owner(request)``, or the authenticated user.

    Without ``owner``, an authenticated user is ``user:<pk>``; everyone else shares ``anonymous``.
    """
    if owner is None:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return f"user:{user.pk}"
        return ANONYMOUS_OWNER
    value: Any = owner(request)  # a callable of the project: its result is checked, not trusted
    if not isinstance(value, str) or not 1 <= len(value) <= conf.MAX_IDEMPOTENT_OWNER_CHARS:
        raise IdempotentViewError(
            field="owner",
            bound=f"a callable returning a string of 1..{conf.MAX_IDEMPOTENT_OWNER_CHARS} characters",
            value=type(value).__name__,
        )
    if "\x00" in value:
        raise IdempotentViewError(field="owner", bound="a string without NUL characters")
    return value


class RequestIdempotency:
    """What an ``@idempotent`` view finds as ``request.idempotency``: the client's key, its scope and owner.

    ``job_key(step)`` derives from it a key for one job the view enqueues, the same for every
    request with this key, so that job's handler (``ctx.idempotency_key``) and its outbound
    ``Idempotency-Key`` stay the same when the client retries. ``replayed`` is False while the view
    runs (a replay never runs the view).
    """

    __slots__ = ("key", "owner", "replayed", "scope", "_hash")

    def __init__(self, *, key: str, scope: str, owner: str, replayed: bool = False) -> None:
        self.key = key
        self.scope = scope
        self.owner = owner
        self.replayed = replayed
        self._hash = http_key_hash(scope, owner, key)

    @property
    def key_hash(self) -> bytes:
        """The stored form of the key (SHA-256 over scope, owner and key)."""
        return self._hash

    @property
    def key_digest(self) -> str:
        """The 12-hex digest operators see in the admin and the logs."""
        return key_digest(self._hash)

    @property
    def key_preview(self) -> str:
        return key_preview(self.key)

    @property
    def record_key(self) -> RecordKey:
        """The record's key as the statements take it."""
        return RecordKey(scope=self.scope, owner=self.owner, key_hash=self._hash, key_preview=self.key_preview)

    def job_key(self, step: str = "") -> str:
        """Return a key for one job of this request (``step`` names it when the view enqueues several).

        Derived from the record's hash: it reveals neither the client's key nor its owner.
        """
        return derived_http_key(self._hash, step)

    def job_idempotency(self, step: str = "", *, ttl: timedelta | None = None) -> Idempotency:
        """Return ``Idempotency(job_key(step), scope=<this scope>)`` for ``enqueue`` (``ttl``: the key's default)."""
        if ttl is None:
            return Idempotency(self.job_key(step), scope=self.scope)
        return Idempotency(self.job_key(step), scope=self.scope, ttl=ttl)

    def __repr__(self) -> str:  # never show the raw key
        return f"<RequestIdempotency {self.scope}:{self.key_preview} [{self.key_digest}] owner={self.owner!r}>"


def idempotency_of(request: Any) -> RequestIdempotency | None:
    """``request.idempotency`` for typed code: the request's key in an ``@idempotent`` view, or None."""
    value = getattr(request, "idempotency", None)
    return value if isinstance(value, RequestIdempotency) else None
