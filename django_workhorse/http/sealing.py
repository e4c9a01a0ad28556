"""Sealed responses of ``@idempotent`` views (decision 0024): the stored body and headers as envelopes.

The body's envelope is stored as its UTF-8 bytes in ``response_body``, the headers' as
``{"workhorse:sealed": "<envelope>"}`` in ``response_headers``. Headers in clear are a JSON list,
so that object is what says a record is sealed; its body is then an envelope too. Each is bound to
its record (scope, owner, key hash) and its column, so neither opens anywhere else. A sealed
record's request digests are keyed by the fingerprint key.
"""

from __future__ import annotations

import json
from typing import Any

from django_workhorse.encryption import keys as encryption_keys
from django_workhorse.encryption import sealed_json
from django_workhorse.encryption.envelope import seal, unseal
from django_workhorse.enqueueing.fingerprints import FIELD_DIGEST_HEX_CHARS, key_digest, request_digest
from django_workhorse.exceptions import IdempotentViewError
from django_workhorse.sql.http_records import RecordKey

BODY, HEADERS = "response_body", "response_headers"


def check_argument(encrypted: Any) -> None:
    """Refuse ``encrypted`` at decoration: not a bool or None (``IdempotentViewError``), or True
    while ``WORKHORSE_ENCRYPTION`` is not set (``EncryptionNotConfiguredError``)."""
    if encrypted is not None and not isinstance(encrypted, bool):
        raise IdempotentViewError(field="encrypted", bound="True, False or None", value=encrypted)
    encryption_keys.refuse_unconfigured(encrypted)


def seals(scope: str, encrypted: bool | None) -> bool:
    """Whether a response stored now in ``scope`` is sealed: ``encrypted``, or when None the setting's
    ``encrypt_all`` or ``encrypted_scopes``."""
    if encrypted is not None:
        return encrypted
    return encryption_keys.encrypts_all() or scope in encryption_keys.encrypted_scopes()


def associated_data(key: RecordKey, field: str) -> bytes:
    """The associated data of a record's sealed ``field``: its scope, owner and key hash.

    The key hash (32 bytes, last) is SHA-256 over the framed scope, owner and key, so the whole is
    one record's whatever separators the scope or the owner hold.
    """
    record = b"\x1f".join((key.scope.encode(), key.owner.encode(), key.key_hash))
    return b"workhorse.effect\x1f" + field.encode() + b"\x1f" + record


def seal_response(key: RecordKey, headers_json: str, body: bytes, *, max_bytes: int) -> tuple[str, bytes]:
    """Return the stored forms of a response's headers (JSON text) and body, sealed.

    Raise ``IdempotentViewError`` if the body's envelope is over ``max_bytes``.
    """
    envelope = seal(body, associated_data=associated_data(key, BODY)).encode("ascii")
    if len(envelope) > max_bytes:
        raise IdempotentViewError(
            field="response",
            bound=f"at most {max_bytes} bytes to be stored, sealed (WORKHORSE_IDEMPOTENT_RESPONSE_MAX_BYTES)",
            value=f"{len(envelope)} bytes",
        )
    return sealed_json.seal_json(headers_json, associated_data=associated_data(key, HEADERS)), envelope


def is_sealed_record(headers: Any) -> bool:
    """Whether a record's stored headers (decoded) say that it is sealed."""
    return sealed_json.is_sealed(headers)


def keyed_fingerprint(digests: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """Return a request's fingerprint as a sealed record stores it: each part's digest HMAC-SHA256'd
    under the fingerprint key (truncated as before), and the request's digest over those.

    So a stored digest cannot be checked against guessed requests without the key. Raise
    ``EncryptionNotConfiguredError`` if ``WORKHORSE_ENCRYPTION`` is not set.
    """
    keyed = {
        name: encryption_keys.fingerprint_hmac(b"workhorse.http\x1f" + name.encode() + b"\x1f" + value.encode()).hex()[
            :FIELD_DIGEST_HEX_CHARS
        ]
        for name, value in digests.items()
    }
    return request_digest(keyed), keyed


def open_response(key: RecordKey, headers: Any, body: bytes) -> tuple[list[list[str]], bytes]:
    """Return a record's headers and body in clear: as stored, or opened when sealed.

    Raise ``DecryptionError`` (naming the record's scope, key digest and field) if either does not open.
    """
    if not sealed_json.is_sealed(headers):
        return headers, body
    opened = sealed_json.open_json(headers, associated_data=associated_data(key, HEADERS), what=_what(key, HEADERS))
    envelope = body.decode("ascii", errors="replace")  # not ASCII: not an envelope, and unseal says so
    plain = unseal(envelope, associated_data=associated_data(key, BODY), what=_what(key, BODY))
    return json.loads(opened), plain


def _what(key: RecordKey, field: str) -> str:
    return f"the stored {field} of {key.key_preview} [{key_digest(key.key_hash)}] in scope {key.scope!r}"
