"""A job's encrypted values (decision 0024): its salt, and each value sealed to its row and field.

An encrypted job carries ``cipher_salt`` (16 random bytes, NULL for a clear job). The associated
data of each of its values is ``workhorse.job\\x1f<field>\\x1f<salt>``, so a ciphertext copied to
another job or another field does not open.
"""

from __future__ import annotations

import json
from typing import Any

from django_workhorse.encryption.envelope import FORMAT, is_envelope, random_bytes, seal, unseal
from django_workhorse.encryption.keys import encrypts_all, refuse_unconfigured
from django_workhorse.exceptions import DecryptionError

SALT_BYTES = 16
PAYLOAD = "payload"
RESULT = "result"
LAST_ERROR = "last_error"
EVENT_ERROR = "event.error"
EVENT_REASON = "event.reason"
# The event details of an encrypted job that hold the handler's text (an error, a Cancel's or a
# Fail's reason): sealed for ``event.<name>``, as its last_error is.
SEALED_EVENT_DETAILS = frozenset(field.removeprefix("event.") for field in (EVENT_ERROR, EVENT_REASON))
CHECKPOINT_PREFIX = "checkpoint:"
_DOMAIN = b"workhorse.job\x1f"


def is_encrypted(requested: bool | None) -> bool:
    """Whether a request is encrypted: ``requested``, or ``encrypt_all`` when it is None.

    Raise ``EncryptionNotConfiguredError`` (field ``encrypted``) if it asks for encryption while
    ``WORKHORSE_ENCRYPTION`` is not set.
    """
    if requested is None:
        return encrypts_all()
    refuse_unconfigured(requested)
    return bool(requested)


def new_salt() -> bytes:
    """Return a fresh salt for an encrypted job."""
    return random_bytes(SALT_BYTES)


def associated_data(field: str, salt: bytes) -> bytes:
    """Return the associated data that binds a job's ``field`` to its salt."""
    return _DOMAIN + field.encode() + b"\x1f" + salt


def seal_value(text: str, *, field: str, salt: bytes) -> str:
    """Seal one of a job's values (text) for ``field``; return the envelope."""
    return seal(text, associated_data=associated_data(field, salt))


def open_value(envelope: str, *, field: str, salt: bytes, job_id: int | None) -> str:
    """Open one of a job's values sealed for ``field``; return its text.

    Raise ``DecryptionError`` naming the field, the job and the key id (never a key) if it does not open.
    """
    what = f"{field} of job {job_id}" if job_id is not None else field
    return unseal(envelope, associated_data=associated_data(field, salt), what=what).decode()


def opened_json(stored: Any, *, field: str, salt: bytes | None, job_id: int | None) -> Any:
    """Return a job's stored JSON value as its user sees it: a clear job's (or a missing value) as
    it is, an encrypted job's envelope opened and parsed.

    Raise ``DecryptionError`` if an encrypted job's value is not an envelope that opens.
    """
    if salt is None or stored is None:
        return stored
    envelope = stored if isinstance(stored, str) else ""  # anything else is no envelope
    return json.loads(open_value(envelope, field=field, salt=salt, job_id=job_id))


def opened_text(stored: str, *, field: str, salt: bytes | None, job_id: int | None) -> str:
    """Return a job's stored text (``last_error``, an event's ``error``) as its user sees it: an
    envelope opened; a clear job's text, or text the library wrote in clear (a reclaim's "lease
    expired"), as it is.

    Raise ``DecryptionError`` if an envelope does not open.
    """
    if salt is None or not is_envelope(stored):
        return stored
    return open_value(stored, field=field, salt=salt, job_id=job_id)


def is_sealed_text(stored: str) -> bool:
    """Whether an encrypted job's stored text is sealed: an envelope, or a damaged one (it starts
    with the format's prefix, which no text the library writes in clear does)."""
    return stored.startswith(f"{FORMAT}:")


def shown_error(error: str, salt: bytes | None, exception: BaseException | None = None) -> str:
    """Return what logs and traces may show of a job's error: an encrypted job's only as its size
    (the handler's text may quote the payload it failed on), unless the attempt failed because a
    value did not open: a ``DecryptionError`` names the value, the job and the key id, and holds
    nothing of any value, and an operator must see it where the job's other failures are seen."""
    if salt is None or not error or isinstance(exception, DecryptionError):
        return error
    return f"encrypted ({len(error.encode())} bytes)"
