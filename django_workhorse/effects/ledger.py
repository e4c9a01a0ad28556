"""The effect ledger: run an effect in your own database at most once per operation key.

``once(key, fn)`` claims the operation in the ledger table (``workhorse_effect``) and runs ``fn``
in the same transaction, so the claim, the effect and its stored result commit together or not at
all. The unique constraint on ``(scope, key_hash)`` arbitrates racing attempts: a concurrent
duplicate waits for the first to commit and then gets its stored result, or for it to roll back
and then runs the effect itself. Keys are stored hashed, as for enqueue (``fingerprint.key_hash``),
and an entry is kept for its retention window, after which a repeat runs the effect again.

Only effects written through the same database alias as the ledger are covered; see docs/effects.md.
A result can be stored sealed (decision 0024): ``{"workhorse:sealed": "<envelope>"}`` in place of
the result, bound to its row by the scope and the key hash.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.db import router, transaction

from django_workhorse import conf, sql
from django_workhorse.conf import app_settings
from django_workhorse.encryption import keys as encryption_keys
from django_workhorse.encryption import sealed_json
from django_workhorse.enqueueing.fingerprints import key_digest, key_hash, key_preview
from django_workhorse.enqueueing.storable import check_json
from django_workhorse.enqueueing.validation import check_duration, check_key_text
from django_workhorse.exceptions import (
    EffectAlreadyDoneError,
    EffectInFlightError,
    EffectValidationError,
    KeyNotSettledError,
)
from django_workhorse.models import EffectRecord
from django_workhorse.types import DEFAULT_SCOPE

logger = logging.getLogger(__name__)

# Long enough to cover the defaults: a 24 h enqueue key, a job's ~13 h of retries (25 attempts,
# exponential back-off capped at 1 h) and a redrive of the dead job within WORKHORSE_JOB_RETENTION
# (14 days). See docs/effects.md, "The two retention windows".
DEFAULT_EFFECT_RETENTION = timedelta(days=30)
MIN_EFFECT_RETENTION = timedelta(milliseconds=1)
MAX_EFFECT_RETENTION = timedelta(days=365)
# An entry can change hands between our statements (expired and taken over, pruned); each round
# reads it again. Needing more than a few rounds means something is badly wrong.
MAX_ROUNDS = 8


class Operation:
    """One operation of the ledger, as a ``once_block`` sees it.

    ``done`` is True when the effect already ran (committed by an earlier or a concurrent
    attempt): ``result`` is then its stored result, and the block must not run the effect again.
    Otherwise this transaction holds the operation: run the effect and set ``result``. ``result``
    is in clear; ``encrypted`` says whether the result this operation stores is sealed.
    """

    def __init__(
        self,
        *,
        scope: str,
        hashed: bytes,
        preview: str,
        done: bool,
        result_json: str | None,
        encrypted: bool = False,
    ) -> None:
        self.scope = scope
        self.key_preview = preview
        self.key_digest = key_digest(hashed)
        self.done = done
        self.encrypted = encrypted
        self._associated_data = result_associated_data(scope, hashed)
        self._result_json = "null" if result_json is None else result_json
        self._result: Any = json.loads(self._result_json)
        self._stored_json = self._stored_form(self._result_json)

    @property
    def result(self) -> Any:
        """The result in its stored JSON form (a ``Decimal`` reads back as a string), ``None`` if unset."""
        return self._result

    @result.setter
    def result(self, value: Any) -> None:
        if self.done:
            raise EffectAlreadyDoneError(
                f"operation {self.key_preview} [{self.key_digest}] in scope {self.scope!r} is already done; "
                "check op.done and skip the effect"
            )
        result_json = _result_json(value)
        result = json.loads(result_json)
        if sealed_json.holds_reserved_field(result):
            raise EffectValidationError(
                field="result",
                bound=f'not an object with the field "{sealed_json.SEALED_FIELD}" (reserved for encrypted results)',
            )
        self._stored_json = self._stored_form(result_json)
        self._result_json, self._result = result_json, result

    @property
    def result_json(self) -> str:
        """The result as canonical JSON text (in clear, also when it is stored sealed)."""
        return self._result_json

    @property
    def stored_json(self) -> str:
        """The JSON text that is stored: ``result_json``, or its sealed form when ``encrypted``."""
        return self._stored_json

    def _stored_form(self, result_json: str) -> str:
        if not self.encrypted or self.done:
            return result_json
        stored = sealed_json.seal_json(result_json, associated_data=self._associated_data)
        size, bound = len(stored), app_settings.MAX_RESULT_BYTES  # the stored form is ASCII
        if size > bound:
            raise EffectValidationError(
                field="result", bound=f"at most {bound} bytes stored (sealed)", value=f"{size} bytes"
            )
        return stored

    def __repr__(self) -> str:  # never show the raw key
        state = "done" if self.done else "claimed"
        return f"<Operation {self.scope}:{self.key_preview} [{self.key_digest}] {state}>"


def once(
    key: str,
    fn: Callable[[], Any],
    *,
    scope: str = DEFAULT_SCOPE,
    retention: timedelta = DEFAULT_EFFECT_RETENTION,
    using: str | None = None,
    encrypted: bool | None = None,
) -> Any:
    """Run ``fn`` unless operation ``key`` (in ``scope``) is already done; return the stored result.

    The claim, ``fn``'s writes and its result (JSON, ``DjangoJSONEncoder``) commit together: inside
    the caller's transaction as a savepoint, or in a transaction of their own in autocommit mode.
    Every caller, the first included, gets the result in its stored JSON form. A concurrent
    duplicate waits for the first attempt's transaction to end. If ``fn`` raises, the exception
    propagates and nothing is recorded; the caller's transaction stays usable.

    ``fn``'s writes must go through ``using`` (default: the router's choice for the ledger), the
    ledger's alias; anything else it does (an HTTP call, an email) is not undone by a rollback.

    The result is stored sealed (``WORKHORSE_ENCRYPTION``) when ``encrypted`` is True, or when it
    is None and ``scope`` is among ``encrypted_scopes`` or ``encrypt_all`` is on; a stored result is
    read, sealed or clear, whatever ``encrypted`` says.

    Raise ``EffectValidationError`` for a key (1..512 UTF-8 bytes), scope (1..256) or retention
    (1 ms..365 days) out of bounds, or a result that cannot be stored as JSON (or is an object with
    the field ``"workhorse:sealed"``); ``EncryptionNotConfiguredError`` for ``encrypted=True``
    without ``WORKHORSE_ENCRYPTION``; ``DecryptionError`` (naming the scope and the key id) for a
    sealed result that does not open.
    """
    if not callable(fn):
        raise EffectValidationError(field="fn", bound="a callable taking no arguments", value=type(fn).__name__)
    with once_block(key, scope=scope, retention=retention, using=using, encrypted=encrypted) as op:
        if not op.done:
            op.result = fn()
        return op.result


@contextmanager
def once_block(
    key: str,
    *,
    scope: str = DEFAULT_SCOPE,
    retention: timedelta = DEFAULT_EFFECT_RETENTION,
    using: str | None = None,
    encrypted: bool | None = None,
) -> Iterator[Operation]:
    """The block form of :func:`once`, for an effect that is more than a function call::

        with once_block(f"invoice:{invoice.pk}:capture", scope="billing") as op:
            if op.done:
                return op.result
            ...  # the effect, written through the ledger's database alias
            op.result = {"capture_id": capture.pk}

    The block runs in a savepoint (or a transaction of its own) holding the operation. When
    ``op.done`` is False, this transaction holds the operation: the result set on ``op`` (or
    ``None``) is stored when the block ends. When ``op.done`` is True the block must skip the
    effect; setting ``op.result`` then raises ``EffectAlreadyDoneError``. An exception leaving the
    block rolls back the claim and the block's writes, and propagates. ``encrypted`` is as for
    :func:`once`; ``op.result`` is always the result in clear.
    """
    _check(key, scope, retention)
    sealed = _encrypts(scope, encrypted)
    alias = using or router.db_for_write(EffectRecord)
    hashed, preview = key_hash(scope, key), key_preview(key)
    with transaction.atomic(using=alias):
        entry = _claim(alias, scope, hashed, preview, retention)
        result_json = entry.result_json
        if result_json is not None:
            result_json = _opened(result_json, scope, hashed, preview)
        op = Operation(
            scope=scope,
            hashed=hashed,
            preview=preview,
            done=not entry.claimed,
            result_json=result_json,
            encrypted=sealed,
        )
        logger.debug("Effect %s scope=%s key=%s", "claimed" if entry.claimed else "done", scope, op.key_digest)
        yield op
        if entry.claimed:
            sql.effects.store_effect(alias, entry_id=entry.id, result_json=op.stored_json, retention=retention)


def result_associated_data(scope: str, hashed: bytes) -> bytes:
    """The associated data of a sealed ``once()`` result: the ledger row's scope and key hash."""
    return b"workhorse.effect\x1fresult\x1f" + scope.encode() + b"\x1f" + hashed


def _encrypts(scope: str, encrypted: Any) -> bool:
    """Whether a result stored now is sealed; refuse ``encrypted`` that is not a bool or None."""
    if encrypted is not None and not isinstance(encrypted, bool):
        raise EffectValidationError(field="encrypted", bound="True, False or None", value=encrypted)
    if encrypted is None:
        return encryption_keys.encrypts_all() or scope in encryption_keys.encrypted_scopes()
    encryption_keys.refuse_unconfigured(encrypted)
    return encrypted


def _opened(stored_json: str, scope: str, hashed: bytes, preview: str) -> str:
    """The result's JSON text: a clear one as stored, a sealed one opened (``DecryptionError`` if it does not)."""
    if sealed_json.SEALED_FIELD not in stored_json:  # no need to parse a clear result twice
        return stored_json
    stored = json.loads(stored_json)
    if not sealed_json.is_sealed(stored):
        return stored_json
    what = f"the once() result {preview} [{key_digest(hashed)}] in scope {scope!r}"
    return sealed_json.open_json(stored, associated_data=result_associated_data(scope, hashed), what=what)


def _claim(alias: str, scope: str, hashed: bytes, preview: str, retention: timedelta) -> sql.effects.EffectEntry:
    """Return the entry this transaction now holds (``claimed``), or the live entry of a done operation."""
    for _ in range(MAX_ROUNDS):
        entry = sql.effects.claim_effect(alias, scope=scope, key_hash=hashed, key_preview=preview, retention=retention)
        if entry is None:  # committed after the claim's snapshot: read it in a fresh one
            entry = sql.effects.find_effect(alias, scope=scope, key_hash=hashed)
        if entry is None:  # pruned meanwhile: claim again
            continue
        if entry.claimed:
            return entry
        if entry.live:
            if entry.result_json is None:
                # Another transaction's claim is never visible before its result is stored; this
                # transaction's own claim is, when once() is nested with the same key.
                raise EffectInFlightError(
                    f"operation {preview} [{key_digest(hashed)}] in scope {scope!r} is in flight in this very "
                    "transaction: once() was nested with its own key"
                )
            return entry
        if sql.effects.take_over_effect(alias, seen_id=entry.id, key_preview=preview, retention=retention):
            return sql.effects.EffectEntry(claimed=True, id=entry.id, result_json=None, live=True)
    raise KeyNotSettledError(
        f"the effect ledger did not settle after {MAX_ROUNDS} rounds; the entry keeps changing hands"
    )


def _check(key: Any, scope: Any, retention: Any) -> None:
    check_key_text(key, "key", conf.MAX_KEY_BYTES, error=EffectValidationError)
    check_key_text(scope, "scope", conf.MAX_SCOPE_BYTES, error=EffectValidationError)
    check_duration(retention, "retention", MIN_EFFECT_RETENTION, MAX_EFFECT_RETENTION, error=EffectValidationError)


def _result_json(value: Any) -> str:
    return check_json(value, "result", max_bytes=app_settings.MAX_RESULT_BYTES, error=EffectValidationError)
