"""Sealed JSON values in ``jsonb`` columns: ``{"workhorse:sealed": "<envelope>"}`` (decision 0024).

A value that may be stored in clear or sealed in one column (a ``once()`` result, a stored
response's headers) is told apart by this one-field object: the field name is reserved, so no clear
value is ever stored in that shape (``once()`` refuses a result that is an object with that field,
and the headers are stored in clear as a list). A bare envelope string would not do: a clear
result may be any string, one that looks like an envelope included.
"""

from __future__ import annotations

import json

from django_workhorse.encryption.envelope import seal, unseal

SEALED_FIELD = "workhorse:sealed"


def seal_json(text: str, *, associated_data: bytes) -> str:
    """Return the stored form of the JSON text ``text``, sealed: ``{"workhorse:sealed": "<envelope>"}``.

    Raise ``EncryptionNotConfiguredError`` if ``WORKHORSE_ENCRYPTION`` is not set.
    """
    return json.dumps({SEALED_FIELD: seal(text, associated_data=associated_data)})


def is_sealed(value: object) -> bool:
    """Whether a decoded stored value is the sealed form (a one-field object with the reserved field)."""
    return isinstance(value, dict) and len(value) == 1 and SEALED_FIELD in value


def holds_reserved_field(value: object) -> bool:
    """Whether a decoded clear value is an object using the reserved field, which cannot be stored."""
    return isinstance(value, dict) and SEALED_FIELD in value


def open_json(value: object, *, associated_data: bytes, what: str) -> str:
    """Return the JSON text a sealed stored value holds.

    Raise ``DecryptionError`` if its envelope is not one, names a key that is not configured, or
    does not open with ``associated_data``.
    """
    assert isinstance(value, dict)
    return unseal(value[SEALED_FIELD], associated_data=associated_data, what=what).decode()
