"""The problems of ``WORKHORSE_ENCRYPTION`` (workhorse.E014-E022), for the system checks and the parser.

The setting holds keys, so a problem shows types, sizes, positions and valid key ids, never another
value: not even a malformed key id, in case a key was pasted there. (A valid key id is safe to show:
a key in standard base64 of 32 bytes ends in ``=``, which no key id has.)
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from django_workhorse import conf

SETTING = "WORKHORSE_ENCRYPTION"
FIELDS = ("keys", "active", "fingerprint_key", "encrypt_all", "encrypted_scopes")
KEY_ID_BOUND = f"1..{conf.MAX_ENCRYPTION_KEY_ID_CHARS} ASCII letters, digits, '-', '_' or '.'"
KEY_BOUND = f"standard base64 (with '=' padding) of exactly {conf.ENCRYPTION_KEY_BYTES} bytes"
SCOPE_BOUND = f"a string of 1..{conf.MAX_SCOPE_BYTES} UTF-8 bytes without NUL"
GENERATE_HINT = (
    'Generate a key with: python -c "import base64, os; print(base64.b64encode(os.urandom(32)).decode())", '
    "and read it from the environment or a secret store, not the code."
)
_KEY_ID = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True)
class SettingProblem:
    """One problem of the setting: its check id, a message naming the setting path, and a hint."""

    check_id: str
    message: str
    hint: str | None = None


def is_key_id(value: object) -> bool:
    """Whether ``value`` is a key id: 1..64 ASCII letters, digits, ``-``, ``_`` or ``.``."""
    return (
        isinstance(value, str)
        and len(value) <= conf.MAX_ENCRYPTION_KEY_ID_CHARS
        and _KEY_ID.fullmatch(value) is not None
    )


def decode_key(value: object) -> bytes | None:
    """Return the 32 bytes that ``value`` is the standard, padded base64 of, or None if it is not."""
    raw = _standard_base64(value)
    return raw if raw is not None and len(raw) == conf.ENCRYPTION_KEY_BYTES else None


def setting_problems(value: object) -> list[SettingProblem]:
    """Return every problem of ``value`` as ``WORKHORSE_ENCRYPTION``; None (not configured) has none."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        fields = ", ".join(f'"{field}"' for field in FIELDS)
        message = f"{SETTING} must be None or a dict of {fields}, got {type(value).__name__}."
        return [SettingProblem("workhorse.E014", message, GENERATE_HINT), *_library()]
    return [
        *_unknown_fields(value),
        *_keys(value),
        *_active(value),
        *_fingerprint_key(value),
        *_encrypt_all(value),
        *_encrypted_scopes(value),
        *_library(),
    ]


def _unknown_fields(setting: Mapping[object, object]) -> Iterator[SettingProblem]:
    unknown = [field for field in setting if field not in FIELDS]
    if unknown:
        shown = ", ".join(repr(field) if is_key_id(field) else type(field).__name__ for field in unknown)
        known = ", ".join(f'"{field}"' for field in FIELDS)
        yield SettingProblem("workhorse.E014", f"{SETTING} has unknown fields {shown} (known: {known}).")


def _keys(setting: Mapping[object, object]) -> Iterator[SettingProblem]:
    keys, where = setting.get("keys"), f'{SETTING}["keys"]'
    if not isinstance(keys, Mapping) or not keys:
        got = _missing_or_type(setting, "keys") if not isinstance(keys, Mapping) else "an empty dict"
        message = f"{where} must be a non-empty dict of key ids to keys, got {got}."
        yield SettingProblem("workhorse.E015", message, GENERATE_HINT)
        return
    for position, (key_id, key) in enumerate(keys.items(), start=1):
        if not is_key_id(key_id):
            message = f"{where}: key id {position} (in order) must be {KEY_ID_BOUND}, got {_describe_id(key_id)}."
            yield SettingProblem("workhorse.E016", message, "Name keys by when they were made: 2026-12, 2027-06.")
        elif (fault := _key_fault(key)) is not None:
            message = f'{where}["{key_id}"] must be {KEY_BOUND}, got {fault}.'
            yield SettingProblem("workhorse.E017", message, GENERATE_HINT)


def _active(setting: Mapping[object, object]) -> Iterator[SettingProblem]:
    active, keys = setting.get("active"), setting.get("keys")
    keys = keys if isinstance(keys, Mapping) else {}
    if isinstance(active, str) and (active in keys or not keys):
        return  # among the keys, or no keys to be among (E015's to report)
    if isinstance(active, str):
        got = repr(active) if is_key_id(active) else _describe_id(active)
    else:
        got = _missing_or_type(setting, "active")
    ids = ", ".join(repr(key_id) for key_id in keys if is_key_id(key_id))
    listed = f" ({ids})" if ids else ""
    message = f'{SETTING}["active"] must be the id of one of {SETTING}["keys"]{listed}, got {got}.'
    yield SettingProblem("workhorse.E018", message, "New values are sealed under the active key; add it to keys first.")


def _fingerprint_key(setting: Mapping[object, object]) -> Iterator[SettingProblem]:
    key, where = setting.get("fingerprint_key"), f'{SETTING}["fingerprint_key"]'
    fault = _missing_or_type(setting, "fingerprint_key") if key is None else _key_fault(key)
    if fault is not None:
        yield SettingProblem("workhorse.E019", f"{where} must be {KEY_BOUND}, got {fault}.", GENERATE_HINT)
        return
    keys = setting.get("keys")
    # One key, one purpose: the digests' key must not also be an encryption key.
    same = [key_id for key_id, other in keys.items() if other == key] if isinstance(keys, Mapping) else []
    if same:
        shown = f'["{same[0]}"]' if is_key_id(same[0]) else ""
        message = f'{where} must be a key of its own, got the same key as {SETTING}["keys"]{shown}.'
        yield SettingProblem("workhorse.E019", message, GENERATE_HINT)


def _encrypt_all(setting: Mapping[object, object]) -> Iterator[SettingProblem]:
    value = setting.get("encrypt_all", False)
    if not isinstance(value, bool):
        message = f'{SETTING}["encrypt_all"] must be True or False, got {type(value).__name__}.'
        yield SettingProblem("workhorse.E020", message)


def _encrypted_scopes(setting: Mapping[object, object]) -> Iterator[SettingProblem]:
    scopes = setting.get("encrypted_scopes", [])
    where = f'{SETTING}["encrypted_scopes"]'
    if not isinstance(scopes, (list, tuple)):
        message = f"{where} must be a list of scopes (each {SCOPE_BOUND}), got {type(scopes).__name__}."
        yield SettingProblem("workhorse.E021", message)
        return
    for position, scope in enumerate(scopes):
        if not _is_scope(scope):
            got = f"a string of {len(scope)} characters" if isinstance(scope, str) else type(scope).__name__
            yield SettingProblem("workhorse.E021", f"{where}[{position}] must be {SCOPE_BOUND}, got {got}.")


def _library() -> Iterator[SettingProblem]:
    try:
        import cryptography.hazmat.primitives.ciphers.aead  # noqa: F401 (only whether it imports)
    except ImportError as exc:
        message = f"{SETTING} is set, but the cryptography package cannot be imported ({exc})."
        yield SettingProblem("workhorse.E022", message, "Install django-workhorse[encryption] (cryptography 44+).")


def _is_scope(value: object) -> bool:
    if not isinstance(value, str) or "\x00" in value:
        return False
    try:
        return 1 <= len(value.encode()) <= conf.MAX_SCOPE_BYTES
    except UnicodeEncodeError:  # a lone surrogate
        return False


def _missing_or_type(setting: Mapping[object, object], field: str) -> str:
    return "nothing (it is missing)" if field not in setting else type(setting[field]).__name__


def _describe_id(value: object) -> str:
    if not isinstance(value, str):
        return type(value).__name__
    if len(value) > conf.MAX_ENCRYPTION_KEY_ID_CHARS or not value:
        return f"a string of {len(value)} characters"
    nul = ", NUL among them" if "\x00" in value else ""
    return f"a string of {len(value)} characters, some not allowed{nul}"


def _key_fault(value: object) -> str | None:
    """What is wrong with ``value`` as a key, without showing it; None if it is a key."""
    if not isinstance(value, str):
        return type(value).__name__
    raw = _standard_base64(value)
    if raw is None:
        return f"a string of {len(value)} characters that is not standard base64 with '=' padding"
    return None if len(raw) == conf.ENCRYPTION_KEY_BYTES else f"base64 of {len(raw)} bytes"


def _standard_base64(value: object) -> bytes | None:
    if not isinstance(value, str) or not value.isascii():
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error:
        return None
    # One spelling per value: no whitespace, no excess padding, no stray bits in the last character.
    return raw if base64.b64encode(raw).decode("ascii") == value else None
