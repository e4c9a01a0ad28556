"""Pure functions: key hashing, display previews, canonical JSON and request fingerprints.

Raw keys never leave this module: callers keep the SHA-256 of ``scope + "\\x1f" + key`` (an HTTP
record: of its kind, scope, owner and key, framed), a bounded preview and a 12-hex digest.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_workhorse.encryption.keys import FingerprintKey, fingerprint_hmac

# One encoder instance: building it per call costs more than encoding a small value.
_CANONICAL = DjangoJSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
KEY_HASH_SEPARATOR = "\x1f"
# The first bytes of an HTTP record's hashed form: 0xFF (in no UTF-8 text), its kind, a NUL.
HTTP_KEY_DOMAIN = b"\xffhttp\x00"
DIGEST_HEX_CHARS = 12
FIELD_DIGEST_HEX_CHARS = 16
PREVIEW_MASK = "•"
PREVIEW_ELLIPSIS = "…"
DERIVED_KEY_PREFIX = "auto:"
DERIVED_KEY_HEX_CHARS = 32


def key_hash(scope: str, key: str) -> bytes:
    """Return SHA-256 of ``scope + "\\x1f" + key`` (UTF-8): the only form a key is stored in."""
    return hashlib.sha256((scope + KEY_HASH_SEPARATOR + key).encode()).digest()


def http_key_hash(scope: str, owner: str, key: str) -> bytes:
    """Return the stored form of an HTTP ``Idempotency-Key``: SHA-256 over its kind, scope, owner and key.

    HTTP records share the effect ledger's table (and its ``(scope, key_hash)`` constraint) with
    ``once()`` effects, so the two kinds must never hash alike. ``key_hash`` hashes UTF-8 text,
    which never holds the byte 0xFF; these bytes start with it, then name the kind and carry each
    part with its length (``_framed``): no ``once()`` key, and no other scope, owner and key, gives
    the same bytes.
    """
    return hashlib.sha256(HTTP_KEY_DOMAIN + _framed(scope, owner, key)).digest()


def _framed(*parts: str) -> bytes:
    """Each part as its UTF-8 length (4 bytes, big-endian) and bytes: no two lists read alike."""
    return b"".join(len(encoded).to_bytes(4, "big") + encoded for encoded in (part.encode() for part in parts))


def derived_http_key(hashed: bytes, step: str) -> str:
    """Return a key derived from an HTTP record's hash for one job (``step``), revealing nothing of it."""
    return _derived_from_hash("http:", hashed, step)


def derived_step_key(hashed: bytes, step_name: str, *, encrypted: bool = False) -> str:
    """Return the ``ctx.idempotency_key`` of step ``step_name`` of a workflow whose key hashed to ``hashed``.

    ``"wf:" + sha256(key_hash + b"\\x1f" + utf8(step_name))``, first 32 hex characters (decision
    0022 §3): the same for every attempt, replay and redrive of the step, and for a later workflow
    under the same key; it reveals nothing of the key. An ``encrypted`` step's is HMAC-SHA256 under
    the fingerprint key instead (decision 0024), as every digest of an encrypted request is.
    """
    return _derived_from_hash("wf:", hashed, step_name, keyed=encrypted)


def _derived_from_hash(prefix: str, hashed: bytes, step: str, *, keyed: bool = False) -> str:
    data = hashed + KEY_HASH_SEPARATOR.encode() + step.encode()
    digest = fingerprint_hmac(data).hex() if keyed else hashlib.sha256(data).hexdigest()
    return prefix + digest[:DERIVED_KEY_HEX_CHARS]


def key_digest(hashed: bytes) -> str:
    """Return the 12-hex digest shown to operators and used to search for a key."""
    return hashed.hex()[:DIGEST_HEX_CHARS]


def key_preview(key: str) -> str:
    """Return a bounded preview: 1-4 characters masked, 5-8 as ``ab…yz``, longer as ``abcdefgh…wxyz``."""
    if len(key) <= 4:
        return PREVIEW_MASK * len(key)
    if len(key) <= 8:
        return key[:2] + PREVIEW_ELLIPSIS + key[-2:]
    return key[:8] + PREVIEW_ELLIPSIS + key[-4:]


def canonical_json(value: Any) -> str:
    """Serialize ``value`` canonically: sorted keys, no spaces, UTF-8 text, no NaN.

    Raise ``TypeError`` or ``ValueError`` if ``value`` is not JSON-serializable.
    """
    if isinstance(value, str) or _c_make_encoder is None:
        return _CANONICAL.encode(value)
    state = _encoders.__dict__
    encode = state.pop("encode", None)  # taken while in use: a nested call builds its own
    if encode is None:
        markers: dict[int, Any] = {}
        encode = (
            markers,
            _c_make_encoder(markers, _CANONICAL.default, _CANONICAL_STRING, None, ":", ",", True, False, False),
        )
    try:
        text = "".join(encode[1](value, 0))
    except BaseException:
        encode[0].clear()  # the circular-reference markers of the value that failed
        raise
    finally:
        state["encode"] = encode
    return text


# ``_CANONICAL.encode`` builds a C encoder for every call, which costs a third of encoding a small
# payload: keep one per thread (its circular-reference markers are per call, so not shared). Same
# arguments as JSONEncoder.iterencode passes for _CANONICAL's options.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_CANONICAL_STRING = json.encoder.encode_basestring
_encoders = threading.local()


def field_digest(canonical_text: str) -> str:
    """Return the short digest of one field's canonical JSON text."""
    return hashlib.sha256(canonical_text.encode()).hexdigest()[:FIELD_DIGEST_HEX_CHARS]


def keyed_field_digest(canonical_text: str, key: FingerprintKey | None = None) -> str:
    """Return the short digest of one field of an encrypted request: HMAC-SHA256 under the fingerprint
    key (``key``, or the configured one).

    Raise ``EncryptionNotConfiguredError`` if ``key`` is None and ``WORKHORSE_ENCRYPTION`` is not set.
    """
    data = canonical_text.encode()
    mac = fingerprint_hmac(data) if key is None else key.digest(data)
    return mac.hex()[:FIELD_DIGEST_HEX_CHARS]


def digest_fields(canonical_fields: Mapping[str, str]) -> dict[str, str]:
    """Return a short digest of each field's canonical JSON text."""
    return {name: field_digest(text) for name, text in canonical_fields.items()}


def request_digest(field_digests: Mapping[str, str]) -> bytes:
    """Return the digest of a whole request: equal digests mean an equivalent request."""
    return hashlib.sha256(";".join(f"{name}={field_digests[name]}" for name in sorted(field_digests)).encode()).digest()


def differing_fields(stored: Mapping[str, str], requested: Mapping[str, str]) -> list[str]:
    """Return the names of fields present in only one request or digested differently."""
    return sorted(name for name in stored.keys() | requested.keys() if stored.get(name) != requested.get(name))


# The field an encrypted request adds to its fingerprint (decision 0024), and its value: a key sent
# encrypted and then in clear (or the reverse) conflicts on this field alone.
ENCRYPTED_FIELD = "encrypted"
ENCRYPTED = "true"


def differs_in_encryption(stored: Mapping[str, str], requested: Mapping[str, str]) -> bool:
    """Whether one of two requests is encrypted and the other is not."""
    return stored.get(ENCRYPTED_FIELD) != requested.get(ENCRYPTED_FIELD)


# A workflow's fingerprint (decision 0022): one field per step, named with this prefix, and its name.
STEP_FIELD_PREFIX = "step:"
# The one field a conflict names when a key held by a plain job meets a workflow, or the reverse.
WORKFLOW_FIELD = "workflow"


def is_workflow_fingerprint(digests: Mapping[str, str]) -> bool:
    """Whether stored field digests are a workflow's (a plain request has no ``step:`` field)."""
    return any(name.startswith(STEP_FIELD_PREFIX) for name in digests)


def derived_key(task_name: str, arguments: Mapping[str, Any], *, encrypted: bool = False) -> str:
    """Return the key an ``idempotent=True`` task derives for a call.

    ``"auto:" + sha256(utf8(task_name) + b"\\x00" + canonical JSON of {parameter: value})``, first
    32 hex characters; the recipe is public (docs/derived-keys.md) so other producers can compute it.
    For an ``encrypted`` call it is HMAC-SHA256 under the fingerprint key instead (decision 0024), so
    the key cannot be checked against guessed arguments without that key.
    """
    data = task_name.encode() + b"\x00" + canonical_json(dict(arguments)).encode()
    digest = fingerprint_hmac(data).hex() if encrypted else hashlib.sha256(data).hexdigest()
    return DERIVED_KEY_PREFIX + digest[:DERIVED_KEY_HEX_CHARS]
