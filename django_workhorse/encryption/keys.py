"""The keys of ``WORKHORSE_ENCRYPTION``, parsed once into objects that never show them.

The setting is read through ``conf.app_settings``, parsed at first use and kept until Django says
it changed (``setting_changed``). ``cryptography`` is imported here, when a configured setting is
first parsed: never at start-up, and never while the setting is unset.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from django_workhorse.conf import app_settings
from django_workhorse.encryption.validation import SETTING, decode_key, setting_problems
from django_workhorse.exceptions import EncryptionNotConfiguredError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM


class EncryptionKey:
    """An AES-256-GCM key known by its id; its ``repr`` shows the id, and nothing holds the key's bytes."""

    __slots__ = ("_aead", "key_id")

    def __init__(self, key_id: str, material: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self.key_id = key_id
        self._aead: AESGCM = AESGCM(material)

    def __repr__(self) -> str:
        return f"<EncryptionKey {self.key_id!r}>"

    def encrypt(self, nonce: bytes, data: bytes, associated_data: bytes) -> bytes:
        """Return ``data`` encrypted and authenticated with ``associated_data``: ciphertext, then the tag."""
        return self._aead.encrypt(nonce, data, associated_data)

    def decrypt(self, nonce: bytes, sealed: bytes, associated_data: bytes) -> bytes | None:
        """Return the plaintext of ``sealed``, or None if it does not authenticate under this key."""
        from cryptography.exceptions import InvalidTag

        try:
            return self._aead.decrypt(nonce, sealed, associated_data)
        except InvalidTag:
            return None


class FingerprintKey:
    """The HMAC-SHA256 key of fingerprints and derived keys; its ``repr`` shows nothing of it."""

    __slots__ = ("_hmac",)

    def __init__(self, material: bytes) -> None:
        self._hmac = hmac.new(material, digestmod=hashlib.sha256)

    def __repr__(self) -> str:
        return "<FingerprintKey>"

    def digest(self, data: bytes) -> bytes:
        """Return HMAC-SHA256 of ``data`` under this key (32 bytes)."""
        mac = self._hmac.copy()
        mac.update(data)
        return mac.digest()


@dataclass(frozen=True)
class Keyring:
    """``WORKHORSE_ENCRYPTION`` parsed: every key by id, the active one, the fingerprint key and the flags."""

    keys: Mapping[str, EncryptionKey]
    active: EncryptionKey
    fingerprint: FingerprintKey
    encrypt_all: bool
    encrypted_scopes: frozenset[str]


# The parsed setting, under "keyring" once read (None: not configured); forgotten when it changes.
_parsed: dict[str, Keyring | None] = {}


def _forget_keyring(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING:
        _parsed.clear()


setting_changed.connect(_forget_keyring, dispatch_uid="django_workhorse.encryption.keys")


def keyring() -> Keyring | None:
    """Return the parsed setting, or None when ``WORKHORSE_ENCRYPTION`` is not set.

    Raise ``ImproperlyConfigured`` (naming each problem, never a key) if the setting is malformed:
    the system checks workhorse.E014-E022 report the same problems at start-up.
    """
    try:
        return _parsed["keyring"]
    except KeyError:
        pass
    value = app_settings.ENCRYPTION
    parsed = None if value is None else _parse(value)
    _parsed["keyring"] = parsed
    return parsed


def configured_keyring() -> Keyring:
    """Return the parsed setting; raise ``EncryptionNotConfiguredError`` if it is not set."""
    parsed = keyring()
    if parsed is None:
        raise EncryptionNotConfiguredError(
            field=SETTING, bound='set (a dict with "keys", "active" and "fingerprint_key") to encrypt'
        )
    return parsed


def _parse(value: object) -> Keyring:
    problems = setting_problems(value)
    if problems:
        raise ImproperlyConfigured(" ".join(problem.message for problem in problems))
    assert isinstance(value, Mapping)  # setting_problems refuses anything else
    keys = {key_id: EncryptionKey(key_id, _material(key)) for key_id, key in value["keys"].items()}
    return Keyring(
        keys=MappingProxyType(keys),
        active=keys[value["active"]],
        fingerprint=FingerprintKey(_material(value["fingerprint_key"])),
        encrypt_all=value.get("encrypt_all", False),
        encrypted_scopes=frozenset(value.get("encrypted_scopes", ())),
    )


def _material(text: str) -> bytes:
    material = decode_key(text)
    assert material is not None  # setting_problems checked every key
    return material


def refuse_unconfigured(encrypted: bool | None) -> None:
    """Raise ``EncryptionNotConfiguredError`` (field ``encrypted``) if ``encrypted`` is True while
    ``WORKHORSE_ENCRYPTION`` is not set: the one refusal of every entry point that takes ``encrypted=``."""
    if encrypted is True and not is_configured():
        raise EncryptionNotConfiguredError(
            field="encrypted", bound="False or None while WORKHORSE_ENCRYPTION is not set", value=True
        )


def is_configured() -> bool:
    """Whether ``WORKHORSE_ENCRYPTION`` is set (and well formed: a malformed one raises ``ImproperlyConfigured``)."""
    return keyring() is not None


def configured_key_ids() -> frozenset[str]:
    """Return the ids of every configured key (empty when ``WORKHORSE_ENCRYPTION`` is not set)."""
    parsed = keyring()
    return frozenset() if parsed is None else frozenset(parsed.keys)


def active_key_id() -> str:
    """Return the id of the key new values are sealed under; raise ``EncryptionNotConfiguredError`` if unset."""
    return configured_keyring().active.key_id


def encrypts_all() -> bool:
    """Whether every job is encrypted (``encrypt_all``); False when encryption is not configured."""
    parsed = keyring()
    return parsed is not None and parsed.encrypt_all


def encrypted_scopes() -> frozenset[str]:
    """The ``once()`` scopes whose results are encrypted (``encrypted_scopes``); empty when not configured."""
    parsed = keyring()
    return frozenset() if parsed is None else parsed.encrypted_scopes


def fingerprint_hmac(data: bytes) -> bytes:
    """Return HMAC-SHA256 of ``data`` under the fingerprint key (32 bytes).

    Raise ``EncryptionNotConfiguredError`` if ``WORKHORSE_ENCRYPTION`` is not set.
    """
    return configured_keyring().fingerprint.digest(data)
