"""``@idempotent``: a view answers each ``Idempotency-Key`` once, and replays that answer to retries.

The record of a key and the view's writes (rows, enqueued jobs, ``once()`` effects) share one
transaction: the response is stored exactly when the view's writes commit. The effect ledger's
unique constraint arbitrates; the key's advisory lock, held from the claim to the commit, tells a
retry that arrives while the first request still runs that it is running (409), instead of making
it wait for the first to commit. The record is written once, with the response, when the view is done.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from django.db import connections, router, transaction
from django.http import HttpResponseBase

from django_workhorse import conf, sql
from django_workhorse.conf import app_settings
from django_workhorse.enqueueing.fingerprints import canonical_json
from django_workhorse.enqueueing.validation import check_duration, check_key_text
from django_workhorse.exceptions import (
    DecryptionError,
    EncryptionNotConfiguredError,
    IdempotencyKeyError,
    IdempotentViewError,
    KeyNotSettledError,
)
from django_workhorse.http import fingerprints, placement, responses, sealing
from django_workhorse.http.keys import (
    ANONYMOUS_OWNER,
    CREDENTIALS_HEADER,
    META_HEADER,
    RequestIdempotency,
    parse_key,
    resolve_owner,
)
from django_workhorse.models import EffectRecord
from django_workhorse.sql.http_records import HttpRecord, RecordKey

logger = logging.getLogger(__name__)

View = TypeVar("View", bound=Callable[..., Any])
DEFAULT_METHODS = ("POST", "PATCH")
ALLOWED_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_WAIT = timedelta(seconds=60)
# While waiting for a running request with the same key: the first pause, and the longest.
FIRST_POLL, LONGEST_POLL = 0.01, 0.25
RETRY_AFTER_SECONDS = 1


def idempotent(
    scope: str,
    *,
    ttl: timedelta = conf.DEFAULT_IDEMPOTENT_TTL,
    required: bool = True,
    owner: Callable[[Any], str] | None = None,
    wait: timedelta | float = 0,
    methods: Iterable[str] = DEFAULT_METHODS,
    using: str | None = None,
    anonymous: bool = False,
    encrypted: bool | None = None,
) -> Callable[[View], View]:
    """Make a view answer each ``Idempotency-Key`` (per ``scope`` and owner) once, for ``ttl``.

    Decorates a function view, a view method (``def post(self, request)``, or through
    ``method_decorator``), a DRF ``@api_view`` function (below ``@api_view``) or a DRF view or
    viewset handler (``def create(self, request)``). Only ``methods`` (default POST and PATCH) are
    keyed; others run the view as is. ``owner(request) -> str`` says whose record it is (default:
    the authenticated user, ``user:<pk>``). Without ``owner``, a keyed request with no authenticated
    user is refused (403), unless ``anonymous=True``: then such requests share one owner, so any
    client that sends the key gets its response. A request with the
    key of a request still running waits up to ``wait`` (a ``timedelta`` or seconds, at most 60 s)
    for it, then gets its response, or a 409. The stored body and headers are sealed
    (``WORKHORSE_ENCRYPTION``) when ``encrypted`` is True, or when it is None and ``scope`` is among
    ``encrypted_scopes`` or ``encrypt_all`` is on; a replay opens them, and answers a 500 (logged)
    if they do not open. Raise ``IdempotentViewError`` for an argument out of its bounds, and
    ``EncryptionNotConfiguredError`` for ``encrypted=True`` while ``WORKHORSE_ENCRYPTION`` is not
    set; see docs/http-idempotency.md for every response.
    """
    check_key_text(scope, "scope", conf.MAX_SCOPE_BYTES, error=IdempotentViewError)
    check_duration(ttl, "ttl", conf.MIN_KEY_TTL, conf.MAX_KEY_TTL, error=IdempotentViewError)
    if not isinstance(required, bool):
        raise IdempotentViewError(field="required", bound="True or False", value=required)
    if owner is not None and not callable(owner):
        raise IdempotentViewError(field="owner", bound="a callable taking the request", value=type(owner).__name__)
    if not isinstance(anonymous, bool):
        raise IdempotentViewError(field="anonymous", bound="True or False", value=anonymous)
    if anonymous and owner is not None:
        raise IdempotentViewError(field="anonymous", bound="False when owner is given (owner says whose record it is)")
    sealing.check_argument(encrypted)
    waited = _wait(wait)
    keyed = _methods(methods)
    if using is not None and using not in list(connections):
        raise IdempotentViewError(field="using", bound="a database alias of settings.DATABASES", value=using)

    def decorate(view: View) -> View:
        if not callable(view):
            raise IdempotentViewError(field="view", bound="a callable", value=type(view).__name__)
        if inspect.iscoroutinefunction(view):
            raise IdempotentViewError(field="view", bound="a synchronous view (async views are not supported)")
        placement.check_view(view)
        guard = _Guard(
            scope=scope,
            ttl=ttl,
            required=required,
            owner=owner,
            wait=waited,
            using=using,
            anonymous=anonymous,
            encrypted=encrypted,
        )

        @functools.wraps(view)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            request = _request_of(args)
            placement.check_request(view, args, request)
            if request is None or request.method not in keyed:
                if request is not None:
                    request.idempotency = None
                return view(*args, **kwargs)
            return guard.answer(request, lambda: view(*args, **kwargs))

        return wrapped  # type: ignore[return-value]

    return decorate


@dataclass(frozen=True)
class _Guard:
    """One decorated view's settings, and how it answers one keyed request."""

    scope: str
    ttl: timedelta
    required: bool
    owner: Callable[[Any], str] | None
    wait: float
    using: str | None
    anonymous: bool
    encrypted: bool | None

    def answer(self, request: Any, run_view: Callable[[], Any]) -> Any:
        header = request.META.get(META_HEADER)
        if header is None:
            if not self.required:
                request.idempotency = None
                return run_view()
            return responses.problem(
                400,
                "idempotency-key-missing",
                "This request needs an Idempotency-Key header (a unique value per request).",
            )
        try:
            key = parse_key(header)
        except IdempotencyKeyError as exc:
            return responses.problem(400, "idempotency-key-malformed", exc.reason + ".")
        owner = resolve_owner(request, self.owner)
        if owner == ANONYMOUS_OWNER and self.owner is None:
            refused = self._refuse_anonymous(request)
            if refused is not None:
                return refused
        idempotency = RequestIdempotency(key=key, scope=self.scope, owner=owner)
        fingerprint = fingerprints.request_fingerprint(request)
        if isinstance(fingerprint, fingerprints.BodyRefusal):
            return responses.problem(fingerprint.status, fingerprint.code, fingerprint.detail)
        digest, digests = fingerprint
        record_key = idempotency.record_key
        alias = self.using or router.db_for_write(EffectRecord)
        with transaction.atomic(using=alias):
            record = self._claim(alias, record_key)
            if record.held and (record.id is None or not record.live):
                request.idempotency = idempotency
                return self._run(request, alias, record_key, record.id, digest, digests, run_view)
        return self._answer_seen(record, idempotency, digest, digests)

    def _refuse_anonymous(self, request: Any) -> Any:
        """The 403 for a keyed request without an authenticated user, or None when it may share the
        anonymous owner (the view opted in, and the request carries no credentials)."""
        if CREDENTIALS_HEADER in request.META:
            # Credentials no authentication accepted here: most often authentication runs after the
            # decorator. Never answered from (or stored as) the record every anonymous client shares.
            logger.warning(
                "@idempotent(%r) refused a request with an Authorization header but no authenticated user: "
                "put the decorator where authentication has run (see docs/http-idempotency.md)",
                self.scope,
            )
            return responses.problem(
                403,
                "idempotency-owner-unauthenticated",
                "This request carries credentials, but no authenticated user: its Idempotency-Key is not used.",
            )
        if not self.anonymous:
            return responses.problem(
                403,
                "idempotency-owner-anonymous",
                "This view keeps Idempotency-Keys per user, and this request has no authenticated user.",
            )
        return None

    def _claim(self, alias: str, key: RecordKey) -> HttpRecord:
        """Take the key's lock and read its record; while another request holds it, wait up to ``wait``."""
        deadline = time.monotonic() + self.wait
        pause = FIRST_POLL
        record = sql.http_records.claim_http_record(alias, key)
        while not record.held and time.monotonic() < deadline:
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, LONGEST_POLL)
            record = sql.http_records.claim_http_record(alias, key)
        return record

    def _run(
        self,
        request: Any,
        alias: str,
        key: RecordKey,
        expired_id: int | None,
        digest: bytes,
        digests: dict[str, str],
        run_view: Callable[[], Any],
    ) -> Any:
        """Run the view holding the key; store its response (the block's last statement: it may
        commit the transaction), or roll its writes back."""
        response = run_view()
        if not isinstance(response, HttpResponseBase):
            transaction.set_rollback(True, using=alias)
            return response  # not a response: Django raises for it; nothing is stored
        if not responses.is_stored(response.status_code):
            transaction.set_rollback(True, using=alias)
            logger.info("Idempotent view answered %s: not stored, its writes rolled back", response.status_code)
            return response
        max_bytes = app_settings.IDEMPOTENT_RESPONSE_MAX_BYTES
        status, headers_json, body = responses.stored_form(request, response, max_bytes)
        if sealing.seals(self.scope, self.encrypted):
            headers_json, body = sealing.seal_response(key, headers_json, body, max_bytes=max_bytes)
            digest, digests = sealing.keyed_fingerprint(digests)
        stored = sql.http_records.store_http_record(
            alias,
            key,
            expired_id=expired_id,
            request_digest=digest,
            field_digests_json=canonical_json(digests),
            status_code=status,
            headers_json=headers_json,
            body=body,
            ttl=self.ttl,
        )
        if not stored:
            # The claim saw no live record, yet one is there: this transaction's own, written by an
            # @idempotent view nested in this one with the same key. Keep neither.
            raise KeyNotSettledError(
                f"the idempotency record of {key.scope}:{key.key_preview} was written twice in one transaction "
                "(an @idempotent view nested in another with the same key and owner)"
            )
        return response

    def _answer_seen(
        self, record: HttpRecord, idempotency: RequestIdempotency, digest: bytes, digests: dict[str, str]
    ) -> Any:
        if not record.held:
            return _in_flight()
        if record.kind != sql.http_records.KIND:
            # An effect of once() whose key hash is this one: it has no response to give.
            return _in_flight()
        assert record.status_code is not None and record.body is not None
        if sealing.is_sealed_record(record.headers):
            try:
                digest, digests = sealing.keyed_fingerprint(digests)
            except EncryptionNotConfiguredError:
                return _unreadable(idempotency, key_id=None, reason="WORKHORSE_ENCRYPTION is not set")
        if record.request_digest != digest:
            parts = fingerprints.differing_parts(record.field_digests or {}, digests)
            return responses.problem(
                422,
                "idempotency-key-reused",
                "This Idempotency-Key was used for a different request (" + ", ".join(parts) + "); "
                "send a new key for a new request.",
                differing=parts,
            )
        try:
            headers, body = sealing.open_response(idempotency.record_key, record.headers or [], record.body)
        except DecryptionError as exc:
            return _unreadable(idempotency, key_id=exc.key_id, reason=exc.reason)
        logger.debug("Idempotent replay %s:%s", idempotency.scope, idempotency.key_digest)
        return responses.replay(record.status_code, headers, body)


def _unreadable(idempotency: RequestIdempotency, *, key_id: str | None, reason: str) -> Any:
    """Fail closed on a sealed record that cannot be read: a 500, never the stored bytes nor a fresh
    run of the view (its writes were committed with the record)."""
    logger.error(
        "Idempotent replay refused: its stored response does not decrypt scope=%s key=%s key_id=%s reason=%s",
        idempotency.scope,
        idempotency.key_digest,
        key_id,
        reason,
    )
    return responses.unreadable()


def _in_flight() -> Any:
    response = responses.problem(
        409,
        "idempotency-key-in-flight",
        "A request with this Idempotency-Key is still being processed; retry after it completes.",
    )
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def _request_of(args: tuple[Any, ...]) -> Any:
    """The request among a view's positional arguments: the first (a function view), or the second (a
    method: ``self`` first). A DRF ``Request`` counts: it has ``META`` and ``method`` as Django's does."""
    for candidate in args[:2]:
        if hasattr(candidate, "META") and hasattr(candidate, "method"):
            return candidate
    return None


def _wait(wait: Any) -> float:
    seconds = wait.total_seconds() if isinstance(wait, timedelta) else wait
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not 0 <= seconds <= MAX_WAIT.total_seconds()
    ):
        raise IdempotentViewError(field="wait", bound="a timedelta or seconds in 0..60 s", value=wait)
    return float(seconds)


def _methods(methods: Iterable[str]) -> frozenset[str]:
    if isinstance(methods, str):
        raise IdempotentViewError(field="methods", bound="a collection of method names, not a string", value=methods)
    chosen = frozenset(methods)
    if not chosen or not chosen <= ALLOWED_METHODS:
        raise IdempotentViewError(
            field="methods", bound="one or more of DELETE, PATCH, POST, PUT", value=sorted(map(str, chosen))
        )
    return chosen
