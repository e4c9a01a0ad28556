"""Seal values into text envelopes and open them (decision 0024).

An envelope is ``wh1:<key id>:<data>``: ``wh1`` names the format and the algorithm (AES-256-GCM),
the key id stands in clear at a fixed place (so ``LIKE 'wh1:K:%'`` finds the values under key K),
and ``<data>`` is base64url without padding of the 12-byte random nonce, the ciphertext and the
16-byte tag. The caller's associated data binds the value to its row and field; the envelope's
header (``wh1:<key id>:``) is authenticated with it, so neither can be swapped.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import string
from collections.abc import Callable

from django_workhorse.encryption.keys import configured_keyring, keyring
from django_workhorse.encryption.validation import is_key_id
from django_workhorse.exceptions import DecryptionError

FORMAT = "wh1"
NONCE_BYTES = 12
TAG_BYTES = 16
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")
_BASE64URL_VALUE = {
    char: value for value, char in enumerate(string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_")
}


def _random_source() -> Callable[[int], bytes]:
    try:
        import ssl
    except ImportError:  # a Python built without OpenSSL
        return os.urandom
    return ssl.RAND_bytes


# Nonces and salts: OpenSSL's CSPRNG (ssl.RAND_bytes, reseeded in a forked child by OpenSSL itself),
# not os.urandom: os.urandom releases the GIL for its system call, and taking it back behind a busy
# thread costs 50-150 us (measured: 1.5 us against 150 us per call beside one busy thread), which cut
# an 8-thread worker's throughput by a fifth when every result was sealed (decision 0024, increment 7).
random_bytes: Callable[[int], bytes] = _random_source()


def seal(plaintext: bytes | str, *, associated_data: bytes) -> str:
    """Encrypt ``plaintext`` (text as UTF-8) under the active key, bound to ``associated_data``.

    Return the envelope; each call draws a fresh nonce, so sealing one value twice gives two
    envelopes. Raise ``EncryptionNotConfiguredError`` if ``WORKHORSE_ENCRYPTION`` is not set.
    """
    key = configured_keyring().active
    data = plaintext.encode() if isinstance(plaintext, str) else plaintext
    header = f"{FORMAT}:{key.key_id}:"
    nonce = random_bytes(NONCE_BYTES)
    sealed = key.encrypt(nonce, data, header.encode("ascii") + associated_data)
    return header + base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=").decode("ascii")


def unseal(envelope: str, *, associated_data: bytes, what: str) -> bytes:
    """Decrypt ``envelope`` with the configured key it names, checking ``associated_data``.

    ``what`` names the value in the error (``payload of job 17``). Raise ``DecryptionError`` if it is
    not an envelope, names a key id that is not configured, or does not decrypt under that key.
    """
    key_id, data = _parse(envelope, what=what)
    parsed = keyring()
    key = None if parsed is None else parsed.keys.get(key_id)
    if key is None:
        raise DecryptionError(what=what, reason=DecryptionError.UNKNOWN_KEY, key_id=key_id)
    header = f"{FORMAT}:{key_id}:".encode("ascii")
    plaintext = key.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], header + associated_data)
    if plaintext is None:
        raise DecryptionError(what=what, reason=DecryptionError.WRONG_KEY_OR_TAMPERED, key_id=key_id)
    return plaintext


def is_envelope(value: object) -> bool:
    """Whether ``value`` is an envelope of a format this version reads (checked without decrypting)."""
    return _split(value) is not None


def envelope_key_id(envelope: str, *, what: str = "the value") -> str:
    """Return the id of the key ``envelope`` was sealed under, without decrypting it.

    Raise ``DecryptionError`` if it is not an envelope.
    """
    return _parse(envelope, what=what)[0]


def describe(envelope: str, *, what: str = "the value") -> str:
    """Describe ``envelope`` for display: ``encrypted (N bytes, key K)``, N the plaintext's size.

    AES-GCM does not hide the size, so this shows nothing the stored value does not. Raise
    ``DecryptionError`` if it is not an envelope.
    """
    _parse(envelope, what=what)
    return described(envelope)


def described(value: object) -> str:
    """Describe a stored value that should be an envelope, never raising: ``describe``'s text, or
    ``encrypted (not a readable envelope)`` for anything else (which is then not shown either)."""
    parts = _split(value)
    if parts is None:
        return "encrypted (not a readable envelope)"
    key_id, data = parts
    return f"encrypted ({len(data) - NONCE_BYTES - TAG_BYTES} bytes, key {key_id})"


def described_head(head: str, length: int) -> str:
    """Describe an envelope from its first characters (``head``, its header at least) and its length
    in characters, never raising: for a listing that reads only the start of a long value."""
    if len(head) >= length:
        return described(head)
    header = _header(head)
    if header is None or header[1] is None:
        return described(None)
    key_id = header[0]
    data_bytes = (length - len(f"{FORMAT}:{key_id}:")) * 3 // 4
    return f"encrypted ({data_bytes - NONCE_BYTES - TAG_BYTES} bytes, key {key_id})"


def _parse(envelope: object, *, what: str) -> tuple[str, bytes]:
    parts = _split(envelope)
    if parts is None:
        raise DecryptionError(what=what, reason=DecryptionError.UNKNOWN_FORMAT, key_id=_readable_key_id(envelope))
    return parts


def _header(value: object) -> tuple[str, str | None] | None:
    """The key id a ``wh1:<key id>:<data>`` text names and its data part (None when the second colon
    is missing); None if the text does not start with this format and a valid key id."""
    if not isinstance(value, str):
        return None
    version, _, rest = value.partition(":")
    key_id, colon, data = rest.partition(":")
    if version != FORMAT or not is_key_id(key_id):
        return None
    return key_id, data if colon else None


def _split(value: object) -> tuple[str, bytes] | None:
    """The key id and the decoded nonce, ciphertext and tag of an envelope; None if it is not one."""
    header = _header(value)
    if header is None or header[1] is None:
        return None
    key_id, text = header[0], header[1]
    data = _decode(text)
    return None if data is None or len(data) < NONCE_BYTES + TAG_BYTES else (key_id, data)


def _decode(text: str) -> bytes | None:
    """Decode base64url without padding, spelled one way only (every changed character changes the bytes).

    The alphabet is checked by the pattern; the one other way to spell the same bytes is a last
    character whose unused low bits are not zero (4 of them after 2 characters of a group, 2 after 3),
    refused here without encoding the bytes again.
    """
    tail = len(text) % 4
    if tail == 1 or _BASE64URL.fullmatch(text) is None:
        return None
    if tail and _BASE64URL_VALUE[text[-1]] & (0b1111 if tail == 2 else 0b11):
        return None
    try:
        return base64.urlsafe_b64decode(text + "=" * (-tail % 4))
    except binascii.Error:
        return None


def _readable_key_id(value: object) -> str | None:
    """The key id a malformed ``wh1`` envelope names, when it names a valid one: for the error."""
    header = _header(value)
    return None if header is None else header[0]
