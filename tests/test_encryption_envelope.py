"""Envelopes: round trips, rotation, and each way to fail naming the value and the key id, never a key."""

from __future__ import annotations

import base64
import os
import re
import warnings
from collections.abc import Iterator

import pytest
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from django_workhorse.encryption import (
    describe,
    described,
    described_head,
    envelope_key_id,
    is_envelope,
    seal,
    unseal,
)
from django_workhorse.encryption.envelope import random_bytes
from django_workhorse.exceptions import DecryptionError, EncryptionNotConfiguredError
from tests.encryption import ACTIVE, assert_shows_no_key, encryption_setting, new_key

SETTING = encryption_setting(keys={"2026-06": new_key(), ACTIVE: new_key()})
KEYS = [*SETTING["keys"].values(), SETTING["fingerprint_key"]]
AD = b"workhorse.job\x1fpayload\x1f" + bytes(range(16))
WHAT = "payload of job 17"
ENVELOPE = re.compile(r"wh1:(?P<key_id>[A-Za-z0-9._-]+):(?P<data>[A-Za-z0-9_-]+)")


@pytest.fixture(autouse=True)
def _configured() -> Iterator[None]:
    with override_settings(WORKHORSE_ENCRYPTION=SETTING):
        yield


def data_of(envelope: str) -> bytes:
    """The nonce, ciphertext and tag of an envelope."""
    text = envelope.rsplit(":", 1)[1]
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def with_data(envelope: str, data: bytes) -> str:
    return envelope.rsplit(":", 1)[0] + ":" + base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def flip_bit(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


def refused(envelope: object, *, associated_data: bytes = AD) -> DecryptionError:
    with pytest.raises(DecryptionError) as caught:
        unseal(envelope, associated_data=associated_data, what=WHAT)  # type: ignore[arg-type]
    error = caught.value
    assert error.what == WHAT
    assert str(error).startswith(f"cannot decrypt {WHAT}")
    assert_shows_no_key(str(error), *KEYS)
    assert_shows_no_key(repr(error), *KEYS)
    return error


@pytest.mark.parametrize(
    "plaintext",
    [
        b"",
        "",
        b'{"order": 17}',
        '{"name": "Zoë", "city": "東京", "emoji": "🐎"}',
        bytes(range(256)),
        b"x" * 1024 * 1024,
    ],
    ids=["empty-bytes", "empty-text", "bytes", "unicode", "every-byte", "1-MiB"],
)
def test_a_sealed_value_opens_to_its_bytes(plaintext):
    envelope = seal(plaintext, associated_data=AD)

    assert unseal(envelope, associated_data=AD, what=WHAT) == (
        plaintext.encode() if isinstance(plaintext, str) else plaintext
    )


def test_an_envelope_is_text_naming_the_format_and_the_active_key():
    envelope = seal(b"12345", associated_data=AD)

    match = ENVELOPE.fullmatch(envelope)
    assert match is not None, envelope
    assert match["key_id"] == ACTIVE == envelope_key_id(envelope)
    assert len(data_of(envelope)) == 12 + 5 + 16
    assert is_envelope(envelope)
    assert describe(envelope) == "encrypted (5 bytes, key 2026-12)"
    assert describe(seal(b"", associated_data=AD)) == "encrypted (0 bytes, key 2026-12)"


def test_sealing_one_value_twice_gives_two_envelopes_with_two_nonces():
    first, second = seal(b"same", associated_data=AD), seal(b"same", associated_data=AD)

    assert first != second
    assert data_of(first)[:12] != data_of(second)[:12]


def test_after_a_rotation_new_values_use_the_new_key_and_old_ones_still_open():
    old_key, new = new_key(), new_key()
    before = encryption_setting(keys={"old": old_key}, active="old")
    with override_settings(WORKHORSE_ENCRYPTION=before):
        old_envelope = seal(b"before", associated_data=AD)
    rotated = {**before, "keys": {"old": old_key, "new": new}, "active": "new"}
    with override_settings(WORKHORSE_ENCRYPTION=rotated):
        new_envelope = seal(b"after", associated_data=AD)
        assert envelope_key_id(old_envelope) == "old"
        assert envelope_key_id(new_envelope) == "new"
        assert unseal(old_envelope, associated_data=AD, what=WHAT) == b"before"
        assert unseal(new_envelope, associated_data=AD, what=WHAT) == b"after"
    with override_settings(WORKHORSE_ENCRYPTION={**rotated, "keys": {"new": new}}):
        error = refused(old_envelope)
        assert (error.reason, error.key_id) == (DecryptionError.UNKNOWN_KEY, "old")
        assert unseal(new_envelope, associated_data=AD, what=WHAT) == b"after"


def test_an_unknown_key_id_is_refused_naming_it():
    with override_settings(WORKHORSE_ENCRYPTION=encryption_setting(keys={"elsewhere": new_key()}, active="elsewhere")):
        envelope = seal(b"secret", associated_data=AD)

    error = refused(envelope)

    assert (error.reason, error.key_id) == (DecryptionError.UNKNOWN_KEY, "elsewhere")
    assert (
        str(error) == "cannot decrypt payload of job 17: key id 'elsewhere' is not among WORKHORSE_ENCRYPTION[\"keys\"]"
    )


def test_a_different_key_under_the_same_id_is_refused_as_wrong_key_or_tampered():
    with override_settings(WORKHORSE_ENCRYPTION=encryption_setting()):  # a fresh key under ACTIVE
        envelope = seal(b"secret", associated_data=AD)

    error = refused(envelope)

    assert (error.reason, error.key_id) == (DecryptionError.WRONG_KEY_OR_TAMPERED, ACTIVE)
    assert "does not decrypt under key '2026-12'" in str(error)


@pytest.mark.parametrize("index", [0, 11, 12, 12 + 5, 12 + 11, -16, -1], ids=lambda i: f"byte-{i}")
def test_one_flipped_bit_in_the_nonce_ciphertext_or_tag_is_refused(index):
    # 12 bytes of nonce (0..11), 12 of ciphertext (12..23), 16 of tag (-16..-1).
    envelope = seal(b"twelve bytes", associated_data=AD)

    error = refused(with_data(envelope, flip_bit(data_of(envelope), index)))

    assert (error.reason, error.key_id) == (DecryptionError.WRONG_KEY_OR_TAMPERED, ACTIVE)


@pytest.mark.parametrize(
    "other",
    [
        b"workhorse.job\x1fpayload\x1f" + bytes(range(1, 17)),  # another job's salt: a swapped row
        b"workhorse.job\x1fresult\x1f" + bytes(range(16)),  # another field of the same job
        b"",
    ],
    ids=["swapped-row", "swapped-field", "none"],
)
def test_a_value_moved_to_another_row_or_field_is_refused(other):
    envelope = seal(b"secret", associated_data=AD)

    error = refused(envelope, associated_data=other)

    assert (error.reason, error.key_id) == (DecryptionError.WRONG_KEY_OR_TAMPERED, ACTIVE)


def test_the_key_id_is_authenticated_with_the_value():
    key = new_key()
    same_key_twice = encryption_setting(keys={"a": key, "b": key}, active="a")
    with override_settings(WORKHORSE_ENCRYPTION=same_key_twice):
        envelope = seal(b"secret", associated_data=AD)

        error = refused(envelope.replace("wh1:a:", "wh1:b:"))

    assert (error.reason, error.key_id) == (DecryptionError.WRONG_KEY_OR_TAMPERED, "b")


@pytest.mark.parametrize(
    ("value", "key_id"),
    [
        ('{"order": 17}', None),  # a clear value
        ("", None),
        (b"wh1:2026-12:AAAA", None),  # bytes, not text
        (None, None),
        ("wh2:2026-12:" + "A" * 40, None),  # a format this version does not read
        ("WH1:2026-12:" + "A" * 40, None),
        ("wh1::" + "A" * 40, None),
        ("wh1:bad id:" + "A" * 40, None),
        ("wh1:2026-12", "2026-12"),
        ("wh1:2026-12:" + "A" * 36, "2026-12"),  # 27 bytes: shorter than a nonce and a tag
        ("wh1:2026-12:" + "A" * 40 + "=", "2026-12"),  # padded
        ("wh1:2026-12:" + "A" * 39 + "+", "2026-12"),  # standard base64, not url-safe
        ("wh1:2026-12:" + "A" * 38 + "B", "2026-12"),  # 29 bytes, the last character's spare bits not zero
        ("wh1:2026-12:" + "A" * 37 + "B", "2026-12"),  # 28 bytes, the last character's 4 spare bits not zero
        ("wh1:2026-12:" + "A" * 37 + "I", "2026-12"),  # 28 bytes, only the highest spare bit set
        ("wh1:2026-12:" + "A" * 38 + "C", "2026-12"),  # 29 bytes, only the lowest spare bit set
    ],
    ids=repr,
)
def test_what_is_not_an_envelope_is_refused_as_unknown_format(value, key_id):
    error = refused(value)

    assert (error.reason, error.key_id) == (DecryptionError.UNKNOWN_FORMAT, key_id)
    assert "not an envelope of a known format" in str(error)
    assert is_envelope(value) is False
    if isinstance(value, str) and value:
        hidden = value.split(":", 2)[2] if value.count(":") >= 2 else value
        assert hidden[:20] not in str(error)  # the value is never echoed


@pytest.mark.parametrize("inspect", [envelope_key_id, describe])
def test_inspecting_what_is_not_an_envelope_raises_decryption_error(inspect):
    with pytest.raises(DecryptionError) as caught:
        inspect('{"order": 17}')

    assert caught.value.reason == DecryptionError.UNKNOWN_FORMAT


def test_without_the_setting_sealing_is_refused_and_opening_finds_no_key():
    envelope = seal(b"secret", associated_data=AD)
    with override_settings(WORKHORSE_ENCRYPTION=None):
        with pytest.raises(EncryptionNotConfiguredError):
            seal(b"secret", associated_data=AD)
        error = refused(envelope)
    assert (error.reason, error.key_id) == (DecryptionError.UNKNOWN_KEY, ACTIVE)


@given(plaintext=st.binary(max_size=4096), associated_data=st.binary(max_size=256))
def test_any_bytes_round_trip_under_any_associated_data(plaintext, associated_data):
    with override_settings(WORKHORSE_ENCRYPTION=SETTING):
        envelope = seal(plaintext, associated_data=associated_data)
        assert unseal(envelope, associated_data=associated_data, what=WHAT) == plaintext
        assert describe(envelope) == f"encrypted ({len(plaintext)} bytes, key {ACTIVE})"


@given(plaintext=st.binary(max_size=4096), cut=st.integers(min_value=0, max_value=6000))
def test_an_envelope_is_described_alike_whole_or_from_its_start_and_length(plaintext, cut):
    with override_settings(WORKHORSE_ENCRYPTION=SETTING):
        envelope = seal(plaintext, associated_data=AD)
    head = envelope[: max(cut, len(f"wh1:{ACTIVE}:"))]
    assert described(envelope) == described_head(head, len(envelope)) == describe(envelope)


@pytest.mark.parametrize("value", [None, 17, "", "wh1:", "wh1:2026-12:", "wh1:2026-12:AAAA", "wh2:k:AAAA", "plain"])
def test_described_never_raises_and_shows_nothing_of_what_is_no_envelope(value):
    assert described(value) == "encrypted (not a readable envelope)"


@pytest.mark.parametrize("head", ["", "plain text", "wh1:", "wh1:not a key id:AAAA", "wh2:2026-12:AAAA"])
def test_a_head_without_an_envelopes_header_is_described_as_no_envelope(head):
    assert described_head(head, 4000) == "encrypted (not a readable envelope)"


@given(plaintext=st.binary(max_size=64), position=st.integers(min_value=0), replacement=st.integers(0, 255))
def test_any_single_byte_changed_anywhere_in_an_envelope_is_refused(plaintext, position, replacement):
    with override_settings(WORKHORSE_ENCRYPTION=SETTING):
        stored = seal(plaintext, associated_data=AD).encode("ascii")
        index = position % len(stored)
        if stored[index] == replacement:
            replacement ^= 0x01
        changed = (stored[:index] + bytes([replacement]) + stored[index + 1 :]).decode("latin-1")

        with pytest.raises(DecryptionError):
            unseal(changed, associated_data=AD, what=WHAT)


def test_a_forked_child_draws_other_nonces_and_salts_than_its_parent():
    """random_bytes (OpenSSL's generator) is reseeded in a forked child: a child and its parent,
    drawing right after the fork, never share bytes (a shared nonce under one key breaks AES-GCM)."""
    read, write = os.pipe()
    with warnings.catch_warnings():  # other tests' threads may still run: the child only draws and leaves
        warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: draw, report, leave at once
        os.write(write, random_bytes(32))
        os._exit(0)
    os.close(write)
    parent = random_bytes(32)
    child = os.read(read, 32)
    os.waitpid(pid, 0)
    os.close(read)
    assert len(child) == 32 and child != parent
