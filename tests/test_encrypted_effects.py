"""Encrypted once() results (decision 0024): sealed by argument, scope list or encrypt_all; read either way."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.db import connection, transaction

from django_workhorse import EffectValidationError, enqueue, once, once_block
from django_workhorse.encryption import envelope_key_id, is_envelope
from django_workhorse.encryption.sealed_json import SEALED_FIELD
from django_workhorse.enqueueing.fingerprints import key_hash
from django_workhorse.exceptions import DecryptionError, EncryptionNotConfiguredError
from django_workhorse.models import EffectRecord, Job
from django_workhorse.types import DEFAULT_SCOPE
from tests.conftest import race
from tests.encryption import ACTIVE, assert_shows_no_key, encryption_setting, new_key
from tests.test_effects import Effect, lock_waiters
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "payouts"


@pytest.fixture
def keys(settings: Any) -> dict[str, Any]:
    setting = encryption_setting()
    settings.WORKHORSE_ENCRYPTION = setting
    return setting


def secret() -> str:
    return f"iban-{uuid.uuid4()}"


def dump() -> str:
    """Every ledger row as PostgreSQL renders it: what a database dump would hold."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(string_agg(row_to_json(t)::text, ''), '') FROM workhorse_effect t")
        return str(cursor.fetchone()[0])


def stored_result(key: str | None = None, scope: str = DEFAULT_SCOPE) -> Any:
    """The stored ``result`` of operation ``key`` (default: the only one) as the database holds it."""
    if key is None:
        return EffectRecord.objects.get().result
    return EffectRecord.objects.get(scope=scope, key_hash=key_hash(scope, key)).result


def assert_sealed(value: Any) -> str:
    assert isinstance(value, dict) and list(value) == [SEALED_FIELD]
    assert is_envelope(value[SEALED_FIELD])
    return str(value[SEALED_FIELD])


# -- sealed, and opened for every caller ------------------------------------------------------------------


def test_an_encrypted_result_is_stored_sealed_and_every_caller_gets_it_in_clear(keys):
    text = secret()
    calls: list[int] = []

    def pay() -> dict[str, Any]:
        calls.append(1)
        return {"iban": text, "amount": 1250}

    assert once("pay:1", pay, scope=SCOPE, encrypted=True) == {"iban": text, "amount": 1250}
    assert once("pay:1", pay, scope=SCOPE, encrypted=True) == {"iban": text, "amount": 1250}

    assert len(calls) == 1
    assert envelope_key_id(assert_sealed(stored_result())) == ACTIVE
    assert text not in dump() and "1250" not in dump()


@pytest.mark.parametrize("setting", [{"encrypted_scopes": [SCOPE]}, {"encrypt_all": True}])
def test_a_result_is_sealed_by_the_scope_list_or_encrypt_all(settings, setting):
    settings.WORKHORSE_ENCRYPTION = encryption_setting(**setting)
    text = secret()

    assert once("pay:1", lambda: text, scope=SCOPE) == text
    assert once("pay:1", lambda: "never", scope=SCOPE) == text
    assert_sealed(stored_result())
    assert text not in dump()


def test_a_scope_not_listed_stays_in_clear_and_encrypted_false_overrides_encrypt_all(settings):
    settings.WORKHORSE_ENCRYPTION = encryption_setting(encrypted_scopes=[SCOPE])
    assert once("k", lambda: "clear", scope="other") == "clear"
    assert EffectRecord.objects.get(scope="other").result == "clear"

    settings.WORKHORSE_ENCRYPTION = encryption_setting(encrypt_all=True)
    assert once("k", lambda: "clear too", scope="third", encrypted=False) == "clear too"
    assert EffectRecord.objects.get(scope="third").result == "clear too"


def test_the_first_caller_gets_the_stored_json_form_of_an_encrypted_result(keys):
    from decimal import Decimal

    assert once("k", lambda: {"amount": Decimal("12.50"), "ids": (1, 2)}, encrypted=True) == {
        "amount": "12.50",
        "ids": [1, 2],
    }
    assert once("n", lambda: None, encrypted=True) is None
    assert once("n", lambda: "never", encrypted=True) is None
    assert_sealed(stored_result("n"))


def test_eight_racing_threads_run_an_encrypted_effect_once_and_all_get_it_in_clear(keys):
    effect = Effect({"iban": secret()})
    effect.hold = lambda: wait_for(lambda: lock_waiters() >= 7, what="seven attempts waiting on the claim")

    def attempt(i: int) -> Any:
        with transaction.atomic():
            return once("pay:race", lambda: effect(i), scope=SCOPE, encrypted=True)

    results = race(8, attempt)

    assert not [r for r in results if isinstance(r, BaseException)], results
    (winner,) = effect.calls
    assert results == [{"by": winner, **effect.result}] * 8
    assert_sealed(stored_result("pay:race", SCOPE))
    assert effect.result["iban"] not in dump()


def test_once_block_stores_an_encrypted_result_and_reads_it_back_in_clear(keys):
    text = secret()
    with once_block("capture:7", scope=SCOPE, encrypted=True) as op:
        assert (op.done, op.encrypted, op.result) == (False, True, None)
        enqueue("tests.noop", {})
        op.result = {"capture": text}
        assert op.result == {"capture": text}
        assert is_envelope(json.loads(op.stored_json)[SEALED_FIELD])

    with once_block("capture:7", scope=SCOPE) as again:
        assert (again.done, again.result) == (True, {"capture": text})
    assert text not in dump()
    assert Job.objects.count() == 1


def test_once_block_without_a_result_stores_none_sealed(keys):
    with once_block("nothing", encrypted=True) as op:
        assert not op.done
    assert_sealed(stored_result())
    with once_block("nothing") as again:
        assert (again.done, again.result) == (True, None)


# -- reading what was stored the other way ----------------------------------------------------------------


def test_a_clear_result_is_read_as_is_by_an_encrypted_call(settings):
    assert once("k", lambda: {"v": 1}, scope=SCOPE) == {"v": 1}
    settings.WORKHORSE_ENCRYPTION = encryption_setting(encrypted_scopes=[SCOPE])

    assert once("k", lambda: "never", scope=SCOPE) == {"v": 1}
    assert once("k", lambda: "never", scope=SCOPE, encrypted=True) == {"v": 1}
    assert stored_result() == {"v": 1}


def test_a_sealed_result_is_opened_when_encryption_is_off_but_the_keys_are_configured(keys):
    once("k", lambda: {"v": secret()}, scope=SCOPE, encrypted=True)
    value = once("k", lambda: "never", scope=SCOPE, encrypted=False)
    assert set(value) == {"v"}
    assert once("k", lambda: "never", scope=SCOPE) == value


def test_a_clear_string_that_looks_like_an_envelope_is_only_ever_a_string(keys):
    once("a", lambda: {"v": 1}, encrypted=True)
    lookalike = assert_sealed(stored_result())  # a real envelope, returned by a clear once()

    assert once("b", lambda: lookalike) == lookalike
    assert once("b", lambda: "never") == lookalike
    assert once("b", lambda: "never", encrypted=True) == lookalike
    assert stored_result("b") == lookalike


@pytest.mark.parametrize("encrypted", [False, True])
def test_a_result_using_the_reserved_field_is_refused_and_rolls_back(keys, encrypted):
    with pytest.raises(EffectValidationError) as caught:
        once("k", lambda: {SEALED_FIELD: "wh1:x:y", "more": 1}, encrypted=encrypted)
    assert caught.value.field == "result" and SEALED_FIELD in caught.value.bound
    assert EffectRecord.objects.count() == 0


# -- failing closed ---------------------------------------------------------------------------------------


def swap_results(first: str, second: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workhorse_effect AS a SET result = b.result FROM workhorse_effect AS b "
            "WHERE a.key_hash = %s AND b.key_hash = %s",
            [key_hash(SCOPE, first), key_hash(SCOPE, second)],
        )


def test_a_result_swapped_from_another_row_does_not_open_and_the_transaction_stays_usable(keys):
    once("one", lambda: "first", scope=SCOPE, encrypted=True)
    once("two", lambda: "second", scope=SCOPE, encrypted=True)
    swap_results("one", "two")
    ran: list[int] = []

    with transaction.atomic():
        with pytest.raises(DecryptionError) as caught:
            once("one", lambda: ran.append(1), scope=SCOPE)
        assert EffectRecord.objects.count() == 2  # still usable

    error = caught.value
    assert (error.reason, error.key_id) == (DecryptionError.WRONG_KEY_OR_TAMPERED, ACTIVE)
    assert repr(SCOPE) in str(error) and ACTIVE in str(error)
    assert_shows_no_key(str(error), *keys["keys"].values(), keys["fingerprint_key"])
    assert ran == []


def test_a_result_swapped_from_another_scope_with_the_same_key_does_not_open(keys):
    once("same", lambda: "a", scope="a", encrypted=True)
    once("same", lambda: "b", scope="b", encrypted=True)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workhorse_effect SET result = (SELECT result FROM workhorse_effect WHERE scope = 'b') "
            "WHERE scope = 'a'"
        )
    with pytest.raises(DecryptionError):
        once("same", lambda: "never", scope="a")
    assert once("same", lambda: "never", scope="b") == "b"


def test_a_result_under_a_key_id_no_longer_configured_fails_closed(settings, keys):
    once("k", lambda: "sealed", encrypted=True)
    settings.WORKHORSE_ENCRYPTION = encryption_setting(keys={"2027-06": new_key()}, active="2027-06")

    with pytest.raises(DecryptionError) as caught:
        once("k", lambda: "never")
    assert (caught.value.reason, caught.value.key_id) == (DecryptionError.UNKNOWN_KEY, ACTIVE)

    settings.WORKHORSE_ENCRYPTION = None
    with pytest.raises(DecryptionError) as caught:
        once("k", lambda: "never")
    assert caught.value.reason == DecryptionError.UNKNOWN_KEY


def test_a_result_sealed_under_an_old_key_still_opens_after_rotation(settings, keys):
    once("old", lambda: "under the old key", encrypted=True)
    settings.WORKHORSE_ENCRYPTION = {**keys, "keys": {**keys["keys"], "2027-06": new_key()}, "active": "2027-06"}

    assert once("old", lambda: "never") == "under the old key"
    once("new", lambda: "under the new key", encrypted=True)
    assert envelope_key_id(assert_sealed(stored_result("new"))) == "2027-06"
    assert envelope_key_id(assert_sealed(stored_result("old"))) == ACTIVE


def test_a_tampered_envelope_fails_closed(keys):
    once("k", lambda: "sealed", encrypted=True)
    envelope = assert_sealed(stored_result())
    flipped = envelope[:-3] + ("A" if envelope[-3] != "A" else "B") + envelope[-2:]
    EffectRecord.objects.update(result={SEALED_FIELD: flipped})
    with pytest.raises(DecryptionError):
        once("k", lambda: "never")
    EffectRecord.objects.update(result={SEALED_FIELD: "not an envelope"})
    with pytest.raises(DecryptionError) as caught:
        once("k", lambda: "never")
    assert caught.value.reason == DecryptionError.UNKNOWN_FORMAT


# -- arguments and bounds ---------------------------------------------------------------------------------


def test_encrypted_true_without_the_setting_is_refused_before_anything_is_written():
    ran: list[int] = []
    with transaction.atomic():
        with pytest.raises(EncryptionNotConfiguredError) as caught:
            once("k", lambda: ran.append(1), encrypted=True)
        with pytest.raises(EncryptionNotConfiguredError), once_block("k", encrypted=True):
            ran.append(2)
        assert EffectRecord.objects.count() == 0  # the transaction is still usable
    assert caught.value.field == "encrypted"
    assert ran == [] and EffectRecord.objects.count() == 0


@pytest.mark.parametrize("value", [1, "yes", 0])
def test_encrypted_must_be_a_bool_or_none(keys, value):
    with pytest.raises(EffectValidationError) as caught:
        once("k", lambda: None, encrypted=value)
    assert caught.value.field == "encrypted"
    assert EffectRecord.objects.count() == 0


def sealed_size(result_json: str) -> int:
    """The stored size of a sealed result: the wrapper around wh1:<id>:<base64url of nonce, text, tag>."""
    data = 12 + len(result_json.encode()) + 16
    envelope = len(f"wh1:{ACTIVE}:") + (data * 4 + 2) // 3
    return len(json.dumps({SEALED_FIELD: ""})) + envelope


def test_the_sealed_form_counts_against_the_result_bound(settings, keys):
    settings.WORKHORSE_MAX_RESULT_BYTES = 2048
    fits = next(n for n in range(2048, 0, -1) if sealed_size(json.dumps("x" * n)) <= 2048)

    assert once("fits", lambda: "x" * fits, encrypted=True) == "x" * fits
    assert len(json.dumps(EffectRecord.objects.get().result)) == sealed_size(json.dumps("x" * fits))
    with pytest.raises(EffectValidationError) as caught:
        once("over", lambda: enqueue("tests.noop", {}) and "x" * (fits + 1), encrypted=True)
    assert caught.value.field == "result" and "sealed" in caught.value.bound
    assert EffectRecord.objects.count() == 1 and Job.objects.count() == 0
    assert once("clear", lambda: "x" * (fits + 1)) == "x" * (fits + 1)  # in clear it fits
