"""Key hashing, previews, canonical JSON and request digests (pure: no database)."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from django_workhorse.enqueueing.fingerprints import (
    canonical_json,
    differing_fields,
    digest_fields,
    key_digest,
    key_hash,
    key_preview,
    request_digest,
)


def _sha256(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


@pytest.mark.parametrize(
    ("scope", "key"),
    [("invoice-capture", "capture:42"), ("default", "clé-€-😀"), ("é", "x")],
)
def test_key_hash_is_sha256_of_scope_unit_separator_key(scope, key):
    assert key_hash(scope, key) == _sha256(scope + "\x1f" + key)


def test_key_hash_separates_scope_from_key():
    assert key_hash("ab", "c") != key_hash("a", "bc")


def test_key_hash_is_32_bytes_for_multibyte_key():
    assert len(key_hash("default", "€" * 171)) == 32


def test_key_digest_is_first_12_hex_of_hash():
    hashed = _sha256("default\x1fclé-€")
    assert key_digest(hashed) == hashed.hex()[:12]
    assert key_digest(bytes(range(32))) == "000102030405"


@pytest.mark.parametrize(
    ("key", "preview"),
    [
        ("a", "•"),
        ("abcd", "••••"),
        ("abcde", "ab…de"),
        ("abcdefgh", "ab…gh"),
        ("abcdefghi", "abcdefgh…fghi"),
        ("0123456789" * 4, "01234567…6789"),
    ],
)
def test_key_preview_at_each_length_boundary(key, preview):
    assert key_preview(key) == preview


@pytest.mark.parametrize(
    ("key", "preview"),
    [
        ("é", "•"),
        ("€éàü", "••••"),  # 4 characters, 10 bytes: still masked
        ("αβγδε", "αβ…δε"),
        ("αβγδεζηθ", "αβ…ηθ"),
        ("αβγδεζηθι", "αβγδεζηθ…ζηθι"),
        ("😀" * 40, "😀" * 8 + "…" + "😀" * 4),
    ],
)
def test_key_preview_counts_characters_not_bytes(key, preview):
    assert key_preview(key) == preview


def test_canonical_json_sorts_keys_without_spaces():
    assert canonical_json({"b": 1, "a": [1, {"d": None, "c": True}]}) == '{"a":[1,{"c":true,"d":null}],"b":1}'


def test_canonical_json_keeps_non_ascii_as_utf8():
    assert canonical_json({"k": "é€😀"}) == '{"k":"é€😀"}'


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {"x": [float("-inf")]}])
def test_canonical_json_rejects_non_finite_numbers(value):
    with pytest.raises(ValueError):
        canonical_json(value)


def test_canonical_json_serializes_django_json_encoder_types():
    value = {
        "at": datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc),
        "amount": Decimal("1.10"),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "wait": timedelta(days=1, seconds=1),
    }
    assert canonical_json(value) == (
        '{"amount":"1.10","at":"2024-01-02T03:04:05.123Z",'
        '"id":"12345678-1234-5678-1234-567812345678","wait":"P1DT00H00M01S"}'
    )


def test_canonical_json_rejects_unserializable_object():
    with pytest.raises(TypeError):
        canonical_json({"x": object()})


def test_digest_fields_is_first_16_hex_of_sha256_per_field():
    fields = {"queue": '"billing"', "priority": "5"}
    assert digest_fields(fields) == {
        "queue": hashlib.sha256(b'"billing"').hexdigest()[:16],
        "priority": hashlib.sha256(b"5").hexdigest()[:16],
    }


def test_digest_fields_is_deterministic():
    assert digest_fields({"payload": '{"a":1}'}) == digest_fields({"payload": '{"a":1}'})


def test_request_digest_ignores_dict_order():
    assert request_digest({"a": "1", "b": "2"}) == request_digest({"b": "2", "a": "1"})


def test_request_digest_is_32_bytes_and_deterministic():
    digest = request_digest({"a": "1", "b": "2"})
    assert len(digest) == 32
    assert request_digest({"a": "1", "b": "2"}) == digest


def test_request_digest_depends_on_field_names():
    assert request_digest({"a": "1"}) != request_digest({"b": "1"})


def test_request_digest_changes_when_one_field_changes():
    assert request_digest({"a": "1", "b": "2"}) != request_digest({"a": "1", "b": "3"})


def test_differing_fields_names_changed_and_one_sided_fields_sorted():
    stored = {"queue": "q1", "priority": "p", "tags": "t", "run_at": "r"}
    requested = {"queue": "q2", "priority": "p", "tags": "t", "delay": "d"}
    assert differing_fields(stored, requested) == ["delay", "queue", "run_at"]


def test_differing_fields_is_empty_for_equal_requests():
    assert differing_fields({"a": "1", "b": "2"}, {"b": "2", "a": "1"}) == []
