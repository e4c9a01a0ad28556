"""WORKHORSE_ENCRYPTION parsed into keys that show only their ids, read again when it changes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django.views.debug import SafeExceptionReporterFilter

from django_workhorse import encryption
from django_workhorse.encryption.keys import EncryptionKey, FingerprintKey, keyring
from django_workhorse.exceptions import EncryptionNotConfiguredError
from tests.encryption import ACTIVE, assert_shows_no_key, encryption_setting, new_key


@pytest.mark.parametrize("value", ["unset", None])
def test_encryption_is_not_configured_when_the_setting_is_unset_or_none(value, settings):
    if value == "unset":
        del settings.WORKHORSE_ENCRYPTION  # not in tests/settings.py: the default
    else:
        settings.WORKHORSE_ENCRYPTION = value

    assert encryption.is_configured() is False
    assert encryption.encrypts_all() is False
    assert encryption.encrypted_scopes() == frozenset()
    for needs_keys in (encryption.active_key_id, lambda: encryption.fingerprint_hmac(b"x")):
        with pytest.raises(EncryptionNotConfiguredError) as caught:
            needs_keys()
        assert caught.value.field == "WORKHORSE_ENCRYPTION"
        assert str(caught.value).startswith("WORKHORSE_ENCRYPTION must be set")


def test_the_setting_is_parsed_into_its_fields():
    setting = encryption_setting(
        keys={"2026-06": new_key(), ACTIVE: new_key()}, encrypt_all=True, encrypted_scopes=["payments", "mail"]
    )
    with override_settings(WORKHORSE_ENCRYPTION=setting):
        assert encryption.is_configured() is True
        assert encryption.active_key_id() == ACTIVE
        assert encryption.encrypts_all() is True
        assert encryption.encrypted_scopes() == {"payments", "mail"}
        parsed = keyring()
        assert parsed is not None
        assert list(parsed.keys) == ["2026-06", ACTIVE]
        assert parsed.active is parsed.keys[ACTIVE]


def test_encrypt_all_and_encrypted_scopes_default_to_off_and_none():
    with override_settings(WORKHORSE_ENCRYPTION=encryption_setting()):
        assert encryption.encrypts_all() is False
        assert encryption.encrypted_scopes() == frozenset()


def test_fingerprint_hmac_is_hmac_sha256_under_the_fingerprint_key():
    setting = encryption_setting()
    expected = hmac.new(base64.b64decode(setting["fingerprint_key"]), b"payload", hashlib.sha256).digest()
    with override_settings(WORKHORSE_ENCRYPTION=setting):
        assert encryption.fingerprint_hmac(b"payload") == expected
        assert encryption.fingerprint_hmac(b"payload") == expected  # the key's state is not consumed
        assert encryption.fingerprint_hmac(b"payload2") != expected
    with override_settings(WORKHORSE_ENCRYPTION=encryption_setting()):
        assert encryption.fingerprint_hmac(b"payload") != expected


def test_the_parsed_keys_are_kept_until_the_setting_changes():
    first = encryption_setting(keys={"first": new_key()}, active="first")
    second = encryption_setting(keys={"second": new_key()}, active="second")
    with override_settings(WORKHORSE_ENCRYPTION=first):
        assert keyring() is keyring()
        assert encryption.active_key_id() == "first"
        with override_settings(WORKHORSE_ENCRYPTION=second):
            assert encryption.active_key_id() == "second"
        assert encryption.active_key_id() == "first"
    assert encryption.is_configured() is False


def test_keys_show_only_their_ids():
    setting = encryption_setting(keys={"2026-06": new_key(), ACTIVE: new_key()})
    keys = [*setting["keys"].values(), setting["fingerprint_key"]]
    with override_settings(WORKHORSE_ENCRYPTION=setting):
        parsed = keyring()
        assert parsed is not None
        assert repr(parsed.keys[ACTIVE]) == "<EncryptionKey '2026-12'>"
        assert repr(parsed.fingerprint) == "<FingerprintKey>"
        for shown in (repr(parsed), str(parsed), repr(parsed.keys), repr(parsed.active), str(parsed.fingerprint)):
            assert_shows_no_key(shown, *keys)
    # No __dict__ to dump: a key object holds its cipher (or HMAC) object, never the key's bytes.
    assert not hasattr(parsed.active, "__dict__")
    assert EncryptionKey.__slots__ == ("_aead", "key_id")
    assert FingerprintKey.__slots__ == ("_hmac",)


def test_a_malformed_setting_raises_improperly_configured_naming_the_field_not_the_key():
    bad = new_key(31)
    setting = encryption_setting(keys={ACTIVE: bad})
    with override_settings(WORKHORSE_ENCRYPTION=setting), pytest.raises(ImproperlyConfigured) as caught:
        encryption.is_configured()
    assert 'WORKHORSE_ENCRYPTION["keys"]["2026-12"] must be standard base64' in str(caught.value)
    assert_shows_no_key(str(caught.value), bad, setting["fingerprint_key"])


def test_django_debug_pages_hide_the_keys():
    setting = encryption_setting()
    with override_settings(WORKHORSE_ENCRYPTION=setting, DEBUG=True):
        shown = SafeExceptionReporterFilter().get_safe_settings()["WORKHORSE_ENCRYPTION"]
    assert shown["active"] == ACTIVE
    assert shown["keys"] == shown["fingerprint_key"] == SafeExceptionReporterFilter.cleansed_substitute


STARTUP = """
import json, sys
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_workhorse"],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "never-connects"}},
    **json.loads(sys.argv[1]),
)
django.setup()
from django.core.checks import run_checks
import django_workhorse.encryption
errors = [message.id for message in run_checks() if message.is_serious()]
print(json.dumps({"errors": errors, "cryptography": "cryptography" in sys.modules}))
"""


@pytest.mark.parametrize(("extra", "imported"), [({}, False), ({"WORKHORSE_ENCRYPTION": encryption_setting()}, True)])
def test_cryptography_is_imported_at_start_up_only_when_the_setting_is_given(extra, imported):
    done = subprocess.run(
        [sys.executable, "-c", STARTUP, json.dumps(extra)],
        env={key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"errors": [], "cryptography": imported}
