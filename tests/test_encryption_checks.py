"""WORKHORSE_ENCRYPTION's system checks (workhorse.E014-E022): one id per kind of problem, each message
naming the setting's path and the bound, at the bounds' edges, and none showing a key."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from django_workhorse.checks import check_settings
from tests.encryption import ACTIVE, assert_shows_no_key, encryption_setting, new_key

KEY = new_key()
FINGERPRINT = new_key()
BAD_KEYS = {31: new_key(31), 33: new_key(33)}
SWAPPED_KEY = new_key()
GENERATE = 'python -c "import base64, os; print(base64.b64encode(os.urandom(32)).decode())"'
KEY_BOUND = "standard base64 (with '=' padding) of exactly 32 bytes"
ID_BOUND = "1..64 ASCII letters, digits, '-', '_' or '.'"


def setting(**fields: Any) -> dict[str, Any]:
    return encryption_setting(**{"keys": {ACTIVE: KEY}, "fingerprint_key": FINGERPRINT, **fields})


def without(field: str) -> dict[str, Any]:
    value = setting()
    del value[field]
    return value


def problems(value: Any) -> list[tuple[str, str]]:
    """Run the checks with ``value`` as WORKHORSE_ENCRYPTION: (id, message) of each error."""
    with override_settings(WORKHORSE_ENCRYPTION=value):
        errors = check_settings()
    for error in errors:
        assert_shows_no_key(f"{error.msg} {error.hint}", KEY, FINGERPRINT, BAD_KEYS[31], BAD_KEYS[33], SWAPPED_KEY)
    return [(error.id, error.msg) for error in errors]


@pytest.mark.parametrize(
    "value",
    [
        None,
        setting(),
        setting(encrypt_all=True, encrypted_scopes=["payments", "x" * 256]),
        setting(encrypted_scopes=("payments",)),
        setting(keys={"a" * 64: KEY, "A-z_0.9": new_key()}, active="a" * 64),
        setting(keys={"x": new_key()}, active="x"),
    ],
    ids=["unset", "minimal", "every-field", "scopes-tuple", "64-character-id", "1-character-id"],
)
def test_a_valid_setting_passes(value):
    assert problems(value) == []


# (setting, the check id, what its one message says); each kind of problem has its own id.
BAD = {
    "not-a-dict": (
        "keys",
        "workhorse.E014",
        'WORKHORSE_ENCRYPTION must be None or a dict of "keys", "active", "fingerprint_key", "encrypt_all", '
        '"encrypted_scopes", got str.',
    ),
    "unknown-field": (
        setting(key=KEY),
        "workhorse.E014",
        'WORKHORSE_ENCRYPTION has unknown fields \'key\' (known: "keys", "active", "fingerprint_key", '
        '"encrypt_all", "encrypted_scopes").',
    ),
    "keys-missing": (
        without("keys"),
        "workhorse.E015",
        'WORKHORSE_ENCRYPTION["keys"] must be a non-empty dict of key ids to keys, got nothing (it is missing).',
    ),
    "keys-empty": (
        setting(keys={}),
        "workhorse.E015",
        'WORKHORSE_ENCRYPTION["keys"] must be a non-empty dict of key ids to keys, got an empty dict.',
    ),
    "keys-a-list": (
        setting(keys=[KEY]),
        "workhorse.E015",
        'WORKHORSE_ENCRYPTION["keys"] must be a non-empty dict of key ids to keys, got list.',
    ),
    "id-65-characters": (
        setting(keys={ACTIVE: KEY, "a" * 65: new_key()}),
        "workhorse.E016",
        f'WORKHORSE_ENCRYPTION["keys"]: key id 2 (in order) must be {ID_BOUND}, got a string of 65 characters.',
    ),
    "id-with-nul": (
        setting(keys={ACTIVE: KEY, "a\x00b": new_key()}),
        "workhorse.E016",
        f'WORKHORSE_ENCRYPTION["keys"]: key id 2 (in order) must be {ID_BOUND}, got a string of 3 characters, '
        "some not allowed, NUL among them.",
    ),
    "id-empty": (
        setting(keys={ACTIVE: KEY, "": new_key()}),
        "workhorse.E016",
        f'WORKHORSE_ENCRYPTION["keys"]: key id 2 (in order) must be {ID_BOUND}, got a string of 0 characters.',
    ),
    "id-with-colon": (
        setting(keys={ACTIVE: KEY, "2026:06": new_key()}),
        "workhorse.E016",
        f'WORKHORSE_ENCRYPTION["keys"]: key id 2 (in order) must be {ID_BOUND}, got a string of 7 characters, '
        "some not allowed.",
    ),
    "id-not-ascii": (setting(keys={ACTIVE: KEY, "clé": new_key()}), "workhorse.E016", "key id 2 (in order)"),
    "id-not-a-string": (setting(keys={ACTIVE: KEY, 2026: new_key()}), "workhorse.E016", "got int."),
    # A key pasted where its id belongs: not shown.
    "id-is-a-key": (setting(keys={ACTIVE: KEY, SWAPPED_KEY: "2026-06"}), "workhorse.E016", "got a string of 44"),
    "key-31-bytes": (
        setting(keys={ACTIVE: BAD_KEYS[31]}),
        "workhorse.E017",
        f'WORKHORSE_ENCRYPTION["keys"]["2026-12"] must be {KEY_BOUND}, got base64 of 31 bytes.',
    ),
    "key-33-bytes": (
        setting(keys={ACTIVE: BAD_KEYS[33]}),
        "workhorse.E017",
        f'WORKHORSE_ENCRYPTION["keys"]["2026-12"] must be {KEY_BOUND}, got base64 of 33 bytes.',
    ),
    "key-not-base64": (
        setting(keys={ACTIVE: "not base64 at all!"}),
        "workhorse.E017",
        f'WORKHORSE_ENCRYPTION["keys"]["2026-12"] must be {KEY_BOUND}, got a string of 18 characters that is not '
        "standard base64 with '=' padding.",
    ),
    "key-unpadded": (setting(keys={ACTIVE: KEY.rstrip("=")}), "workhorse.E017", "not standard base64"),
    "key-url-safe": (setting(keys={ACTIVE: KEY[:-2] + "_="}), "workhorse.E017", "not standard base64"),
    "key-with-newline": (setting(keys={ACTIVE: KEY + "\n"}), "workhorse.E017", "not standard base64"),
    "key-bytes": (setting(keys={ACTIVE: KEY.encode()}), "workhorse.E017", "got bytes."),
    "active-missing": (
        without("active"),
        "workhorse.E018",
        'WORKHORSE_ENCRYPTION["active"] must be the id of one of WORKHORSE_ENCRYPTION["keys"] (\'2026-12\'), '
        "got nothing (it is missing).",
    ),
    "active-unknown": (
        setting(active="2027-01"),
        "workhorse.E018",
        'WORKHORSE_ENCRYPTION["active"] must be the id of one of WORKHORSE_ENCRYPTION["keys"] (\'2026-12\'), '
        "got '2027-01'.",
    ),
    "active-a-key": (setting(active=SWAPPED_KEY), "workhorse.E018", "got a string of 44 characters, some not allowed"),
    "fingerprint-missing": (
        without("fingerprint_key"),
        "workhorse.E019",
        f'WORKHORSE_ENCRYPTION["fingerprint_key"] must be {KEY_BOUND}, got nothing (it is missing).',
    ),
    "fingerprint-31-bytes": (
        setting(fingerprint_key=BAD_KEYS[31]),
        "workhorse.E019",
        f'WORKHORSE_ENCRYPTION["fingerprint_key"] must be {KEY_BOUND}, got base64 of 31 bytes.',
    ),
    "fingerprint-33-bytes": (setting(fingerprint_key=BAD_KEYS[33]), "workhorse.E019", "got base64 of 33 bytes."),
    "fingerprint-not-base64": (setting(fingerprint_key="%" * 44), "workhorse.E019", "not standard base64"),
    "fingerprint-none": (setting(fingerprint_key=None), "workhorse.E019", "got NoneType."),
    "fingerprint-an-encryption-key": (
        setting(fingerprint_key=KEY),
        "workhorse.E019",
        'WORKHORSE_ENCRYPTION["fingerprint_key"] must be a key of its own, got the same key as '
        'WORKHORSE_ENCRYPTION["keys"]["2026-12"].',
    ),
    "encrypt-all-a-string": (
        setting(encrypt_all="yes"),
        "workhorse.E020",
        'WORKHORSE_ENCRYPTION["encrypt_all"] must be True or False, got str.',
    ),
    "encrypt-all-1": (setting(encrypt_all=1), "workhorse.E020", "got int."),
    "scopes-a-string": (
        setting(encrypted_scopes="payments"),
        "workhorse.E021",
        'WORKHORSE_ENCRYPTION["encrypted_scopes"] must be a list of scopes (each a string of 1..256 UTF-8 bytes '
        "without NUL), got str.",
    ),
    "scope-not-a-string": (
        setting(encrypted_scopes=["payments", 7]),
        "workhorse.E021",
        'WORKHORSE_ENCRYPTION["encrypted_scopes"][1] must be a string of 1..256 UTF-8 bytes without NUL, got int.',
    ),
    "scope-257-bytes": (setting(encrypted_scopes=["é" * 128 + "x"]), "workhorse.E021", "[0] must be a string"),
    "scope-empty": (setting(encrypted_scopes=[""]), "workhorse.E021", "got a string of 0 characters."),
    "scope-with-nul": (setting(encrypted_scopes=["a\x00"]), "workhorse.E021", "got a string of 2 characters."),
}


@pytest.mark.parametrize(("value", "check_id", "message"), BAD.values(), ids=BAD.keys())
def test_each_problem_has_its_id_and_names_the_field_and_the_bound(value, check_id, message):
    found = problems(value)

    assert [check_id for check_id, _ in found] == [check_id], found
    assert found[0][1].startswith("WORKHORSE_ENCRYPTION")
    assert message in found[0][1]


def test_every_kind_of_problem_has_an_id_of_its_own_from_e014():
    # E022 (cryptography missing) has its own test below.
    assert {check_id for _, check_id, _ in BAD.values()} == {f"workhorse.E0{n}" for n in range(14, 22)}


@pytest.mark.parametrize("check_id", ["workhorse.E015", "workhorse.E017", "workhorse.E019"])
def test_the_hint_of_a_key_problem_says_how_to_make_a_key(check_id):
    value = next(value for value, problem, _ in BAD.values() if problem == check_id)
    with override_settings(WORKHORSE_ENCRYPTION=value):
        [error] = check_settings()
    assert GENERATE in error.hint


def test_problems_of_several_fields_are_each_reported():
    value = {"keys": {ACTIVE: BAD_KEYS[31], "a" * 65: KEY}, "active": "nope", "encrypt_all": "no", "extra": 1}

    assert [check_id for check_id, _ in problems(value)] == [
        "workhorse.E014",
        "workhorse.E017",  # the keys in their order
        "workhorse.E016",
        "workhorse.E018",
        "workhorse.E019",
        "workhorse.E020",
    ]


def test_the_setting_given_while_cryptography_cannot_be_imported_is_an_error(monkeypatch):
    # None in sys.modules makes an import of that module fail, as if cryptography were not installed.
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)

    assert [check_id for check_id, _ in problems(setting())] == ["workhorse.E022"]
    assert "cryptography" in problems(setting())[0][1]
    assert problems(None) == []


def test_django_runs_the_encryption_checks():
    with override_settings(WORKHORSE_ENCRYPTION=setting(active="2027-01")):
        found = [message.id for message in run_checks() if message.id.startswith("workhorse.E0")]

    assert found == ["workhorse.E018"]
