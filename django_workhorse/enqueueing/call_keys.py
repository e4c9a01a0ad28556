"""The ``unique`` key of one call: which of the caller's keys wins, and when one is derived.

``@task`` calls (``apply_async(unique_key=..., idempotency_key=..., idempotent=...)``) and
django.tasks calls (``@task(idempotent=True)``) resolve their key here, by the same precedence.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from django_workhorse import conf
from django_workhorse.conf import app_settings
from django_workhorse.encryption.jobs import is_encrypted
from django_workhorse.enqueueing.fingerprints import derived_key
from django_workhorse.enqueueing.storable import check_json
from django_workhorse.enqueueing.validation import check_key_text
from django_workhorse.exceptions import EnqueueValidationError


def call_key(
    derive: Callable[[], str],
    *,
    unique_key: str | None = None,
    idempotency_key: str | None = None,
    idempotent: bool | None = None,
    task_idempotent: bool = False,
    modes: Collection[str] = (),
) -> str | None:
    """Return the ``unique`` key of a call, or None when none of these gives it one.

    First set wins: ``unique_key``, then ``idempotency_key``, then ``derive()`` (the key derived
    from the call) when ``idempotent``, or when it is None and ``task_idempotent`` and the call
    sets no keyed mode (``modes``: the names of the keyed-mode options it sets). A key together
    with a keyed mode raises ``EnqueueValidationError``, as does a key that is not 1..``MAX_KEY_BYTES`` UTF-8 bytes.
    ``derive`` is only called when the derived key is the one used; what it raises propagates.
    """
    if unique_key is not None:
        source, key = "unique_key", unique_key
    elif idempotency_key is not None:
        source, key = "idempotency_key", idempotency_key
    elif idempotent or (idempotent is None and task_idempotent and not modes):
        source, key = "idempotent", derive()
    else:
        return None
    if modes:
        raise EnqueueValidationError(field=f"{source}, {next(iter(modes))}", bound="at most one keyed mode per request")
    check_key_text(key, source, conf.MAX_KEY_BYTES)  # named as the caller spelled it, never echoed
    return key


def checked_derived_key(task_name: str, arguments: Mapping[str, Any], *, encrypted: bool | None = None) -> str:
    """Return the key ``idempotent=True`` derives from a call's bound ``arguments``.

    The arguments are the job's payload, so they are checked as one first: a value PostgreSQL
    cannot store raises ``EnqueueValidationError`` naming where it is, never a bare ``ValueError``.
    An encrypted call (``encrypted``, or ``encrypt_all`` when it is None) derives a keyed digest;
    ``encrypted=True`` without ``WORKHORSE_ENCRYPTION`` raises ``EncryptionNotConfiguredError``.
    """
    check_json(dict(arguments), "payload", max_bytes=app_settings.MAX_PAYLOAD_BYTES, error=EnqueueValidationError)
    return derived_key(task_name, arguments, encrypted=is_encrypted(encrypted))
