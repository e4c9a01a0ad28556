"""The effect ledger: once()/once_block() under races, rollbacks, expiry and misuse; the header helper."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from django.apps import apps
from django.db import connection, transaction

from django_workhorse import (
    EffectAlreadyDoneError,
    EffectInFlightError,
    EffectValidationError,
    HandlerContext,
    WorkhorseError,
    enqueue,
    once,
    once_block,
)
from django_workhorse.effects.ledger import DEFAULT_EFFECT_RETENTION
from django_workhorse.enqueueing.fingerprints import key_digest, key_hash, key_preview
from django_workhorse.models import EffectRecord, Job, JobStatus
from django_workhorse.operations.maintenance import prune_expired_effects, run_maintenance
from django_workhorse.sql.claims import ClaimedJob
from django_workhorse.tasks.registry import register
from django_workhorse.tasks.retry import RetryPolicy
from tests.conftest import connect_directly, race
from tests.worker_tasks import run_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "invoice:inv_2048:capture:v1"
SCOPE = "billing"
LONG_AGO = datetime(2000, 1, 1, tzinfo=timezone.utc)


class RollbackError(Exception):
    pass


class Effect:
    """A thread-safe effect: counts its runs and writes one job row (a write in the ledger's database)."""

    def __init__(self, result: Any = None, *, hold: Callable[[], Any] | None = None) -> None:
        self.result = result
        self.hold = hold
        self.calls: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, tag: Any = None) -> Any:
        with self._lock:
            self.calls.append(tag)
        enqueue("tests.noop", {"effect": str(tag)})
        if self.hold is not None:
            self.hold()
        return self.result if tag is None else {"by": tag, **(self.result or {})}


def lock_waiters() -> int:
    """How many other sessions of this database are waiting for a lock right now."""
    with connect_directly() as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()[0]


def wait_for_database_clock_past(moment: datetime) -> None:
    def passed() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp() > %s", [moment])
            return bool(cursor.fetchone()[0])

    wait_for(passed, what="the database clock to pass the expiry")


# -- racing attempts --------------------------------------------------------------------------------------------


def test_eight_racing_threads_run_the_effect_once_and_all_get_its_result():
    effect = Effect({"amount": Decimal("12.50")})
    # The first claimant holds its transaction open until the seven others wait on its claim.
    effect.hold = lambda: wait_for(lambda: lock_waiters() >= 7, what="seven attempts waiting on the claim")

    def attempt(i: int) -> Any:
        with transaction.atomic():
            return once(KEY, lambda: effect(i), scope=SCOPE)

    results = race(8, attempt)

    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len(effect.calls) == 1
    (winner,) = effect.calls
    assert results == [{"by": winner, "amount": "12.50"}] * 8
    assert Job.objects.count() == 1  # the effect's own write happened once
    record = EffectRecord.objects.get()
    assert (record.scope, record.result, bytes(record.key_hash)) == (SCOPE, results[0], key_hash(SCOPE, KEY))
    assert record.completed_at is not None and record.expires_at > record.completed_at


def test_a_waiter_runs_the_effect_when_the_first_attempt_rolls_back():
    effect = Effect()
    claimed = threading.Event()

    def attempt(i: int) -> Any:
        if i == 0:
            with transaction.atomic():
                result = once(KEY, lambda: effect("first"), scope=SCOPE)
                claimed.set()
                wait_for(lambda: lock_waiters() >= 1, what="the second attempt to wait on the claim")
                raise RollbackError(result)
        assert claimed.wait(10)
        with transaction.atomic():
            return once(KEY, lambda: effect("second"), scope=SCOPE)

    first, second = race(2, attempt)

    assert isinstance(first, RollbackError)
    assert second == {"by": "second"}
    assert effect.calls == ["first", "second"]
    assert list(Job.objects.values_list("payload", flat=True)) == [{"effect": "second"}]
    assert list(EffectRecord.objects.values_list("result", flat=True)) == [{"by": "second"}]


def test_eight_racing_threads_take_over_an_expired_entry_once():
    once(KEY, lambda: "old", scope=SCOPE)
    EffectRecord.objects.update(expires_at=LONG_AGO)
    effect = Effect({"n": 2}, hold=lambda: time.sleep(0.2))

    def attempt(i: int) -> Any:
        with transaction.atomic():
            return once(KEY, lambda: effect(i), scope=SCOPE)

    results = race(8, attempt)

    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len(effect.calls) == 1
    assert results == [{"by": effect.calls[0], "n": 2}] * 8
    record = EffectRecord.objects.get()
    assert record.result == results[0] and record.expires_at > datetime.now(timezone.utc)


# -- duplicates, expiry, scopes ---------------------------------------------------------------------------------


def test_a_duplicate_after_commit_returns_the_stored_result_without_running(other_connection):
    first = Effect({"capture": "cap_1"})
    assert once(KEY, first, scope=SCOPE) == {"capture": "cap_1"}
    # Committed on its own (autocommit): another session sees the entry and the effect's write.
    assert other_connection.execute("SELECT count(*) FROM workhorse_effect").fetchone()[0] == 1
    assert other_connection.execute("SELECT count(*) FROM workhorse_job").fetchone()[0] == 1

    second = Effect({"capture": "cap_2"})
    with transaction.atomic():
        assert once(KEY, second, scope=SCOPE) == {"capture": "cap_1"}

    assert (len(first.calls), len(second.calls)) == (1, 0)
    assert Job.objects.count() == 1 and EffectRecord.objects.count() == 1


def test_every_caller_gets_the_stored_json_form():
    value = {"amount": Decimal("12.50"), "at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc), "ids": (1, 2)}
    expected = {"amount": "12.50", "at": "2026-01-02T03:04:05Z", "ids": [1, 2]}

    assert once(KEY, lambda: value) == expected
    assert once(KEY, lambda: "never") == expected
    assert once("other", lambda: None) is None
    assert once("other", lambda: "never") is None  # a None result is a result too


def test_an_expired_entry_runs_the_effect_again():
    once(KEY, lambda: 1, scope=SCOPE, retention=timedelta(milliseconds=1))
    record = EffectRecord.objects.get()
    wait_for_database_clock_past(record.expires_at)
    effect = Effect({"n": 2})

    assert once(KEY, effect, scope=SCOPE) == {"n": 2}

    assert len(effect.calls) == 1
    again = EffectRecord.objects.get()
    assert again.pk == record.pk and again.created_at > record.created_at
    assert again.expires_at - again.completed_at == DEFAULT_EFFECT_RETENTION


def test_scopes_and_keys_are_separate_operations():
    effect = Effect()
    once(KEY, effect, scope="a")
    once(KEY, effect, scope="b")
    once(KEY + "x", effect, scope="a")
    once(KEY, effect, scope="a")
    assert len(effect.calls) == 3 and EffectRecord.objects.count() == 3


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_the_ledger_lives_in_the_database_it_is_given():
    once(KEY, lambda: 1, using="other")
    assert once(KEY, lambda: 2) == 2
    assert once(KEY, lambda: 3, using="other") == 1
    assert EffectRecord.objects.using("other").count() == EffectRecord.objects.count() == 1


# -- transactions and failures ----------------------------------------------------------------------------------


def test_an_exception_in_the_effect_records_nothing_and_leaves_the_outer_transaction_usable():
    def failing() -> None:
        enqueue("tests.noop", {"effect": "failed"})
        raise RollbackError("provider said no")

    with transaction.atomic():
        before = enqueue("tests.noop", {"n": "before"})
        with pytest.raises(RollbackError):
            once(KEY, failing, scope=SCOPE)
        assert not EffectRecord.objects.exists()
        after = enqueue("tests.noop", {"n": "after"})  # the transaction is still usable
        assert once(KEY, lambda: "retried", scope=SCOPE) == "retried"

    assert set(Job.objects.values_list("id", flat=True)) == {before, after}
    assert list(EffectRecord.objects.values_list("result", flat=True)) == ["retried"]


def test_in_autocommit_mode_the_claim_and_the_effect_commit_or_roll_back_together(other_connection):
    assert connection.get_autocommit()

    def failing() -> None:
        enqueue("tests.noop", {"effect": "failed"})
        raise RollbackError

    with pytest.raises(RollbackError):
        once(KEY, failing)
    assert other_connection.execute("SELECT count(*) FROM workhorse_job").fetchone()[0] == 0
    assert other_connection.execute("SELECT count(*) FROM workhorse_effect").fetchone()[0] == 0

    once(KEY, Effect())
    assert other_connection.execute("SELECT count(*) FROM workhorse_job").fetchone()[0] == 1
    assert other_connection.execute("SELECT count(*) FROM workhorse_effect").fetchone()[0] == 1


def test_the_entry_is_invisible_to_others_until_the_callers_transaction_commits(other_connection):
    with transaction.atomic():
        once(KEY, Effect())
        assert other_connection.execute("SELECT count(*) FROM workhorse_effect").fetchone()[0] == 0
    assert other_connection.execute("SELECT count(*) FROM workhorse_effect").fetchone()[0] == 1


def test_a_result_that_is_not_json_rolls_back_the_effect():
    effect = Effect(float("nan"))

    with pytest.raises(EffectValidationError) as caught:
        once(KEY, effect)

    assert caught.value.field == "result"
    assert len(effect.calls) == 1
    assert not EffectRecord.objects.exists() and not Job.objects.exists()


def test_a_caller_rollback_after_once_forgets_the_operation():
    effect = Effect()
    with pytest.raises(RollbackError), transaction.atomic():
        once(KEY, effect)
        raise RollbackError
    once(KEY, effect)
    assert len(effect.calls) == 2 and EffectRecord.objects.count() == 1


def test_once_nested_with_its_own_key_is_refused():
    with pytest.raises(EffectInFlightError, match="nested"):
        once(KEY, lambda: once(KEY, lambda: 1))
    assert not EffectRecord.objects.exists()


# -- once_block -------------------------------------------------------------------------------------------------


def test_once_block_claims_then_reports_done_with_the_stored_result():
    with once_block(KEY, scope=SCOPE) as op:
        assert not op.done and op.result is None
        enqueue("tests.noop", {"effect": 1})
        op.result = {"amount": Decimal("1.10")}
        assert op.result == {"amount": "1.10"}

    with once_block(KEY, scope=SCOPE) as again:
        assert again.done and again.result == {"amount": "1.10"}

    assert Job.objects.count() == 1
    assert KEY not in repr(again) and key_digest(key_hash(SCOPE, KEY)) in repr(again)


def test_once_block_without_a_result_stores_none():
    with once_block(KEY) as op:
        pass
    assert not op.done
    with once_block(KEY) as again:
        assert again.done and again.result is None


def test_setting_a_result_on_a_done_operation_raises_and_rolls_back_the_block():
    once(KEY, lambda: "first")

    with pytest.raises(EffectAlreadyDoneError), once_block(KEY) as op:
        enqueue("tests.noop", {"effect": "repeated"})  # forgot to check op.done
        op.result = "second"

    assert not Job.objects.exists()
    assert list(EffectRecord.objects.values_list("result", flat=True)) == ["first"]


# -- keys are stored hashed -------------------------------------------------------------------------------------


def test_no_raw_key_is_stored_anywhere():
    secret = "customer-8837-secret-token:capture"
    once(secret, lambda: {"ok": True}, scope=SCOPE)
    record = EffectRecord.objects.get()

    assert bytes(record.key_hash) == key_hash(SCOPE, secret)
    assert record.key_preview == key_preview(secret) == "customer…ture"
    assert str(record) == f"{SCOPE}:customer…ture [{key_digest(key_hash(SCOPE, secret))}]"
    with connection.cursor() as cursor:
        for model in apps.get_app_config("workhorse").get_models():
            if model._meta.proxy:
                continue
            cursor.execute(f"SELECT t::text FROM {model._meta.db_table} AS t")
            for (row,) in cursor.fetchall():
                assert "secret-token" not in row and secret not in row


# -- bounds -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "field", "bound"),
    [
        ({"key": "é" * 256 + "a"}, "key", "1..512 UTF-8 bytes"),
        ({"key": ""}, "key", "1..512 UTF-8 bytes"),
        ({"key": 42}, "key", "a string"),
        ({"key": "\ud800"}, "key", "text without NUL characters or lone surrogates"),
        ({"scope": "s" * 257}, "scope", "1..256 UTF-8 bytes"),
        ({"scope": ""}, "scope", "1..256 UTF-8 bytes"),
        ({"retention": timedelta(microseconds=999)}, "retention", "a timedelta in 1 ms..365 days"),
        ({"retention": timedelta(days=365, microseconds=1)}, "retention", "a timedelta in 1 ms..365 days"),
        ({"retention": 60}, "retention", "a timedelta in 1 ms..365 days"),
        ({"fn": "not callable"}, "fn", "a callable taking no arguments"),
    ],
)
def test_arguments_out_of_bounds_are_refused_before_anything_runs(arguments, field, bound):
    effect = Effect()
    call = {"key": KEY, "fn": effect, **arguments}

    with pytest.raises(EffectValidationError) as caught:
        once(call.pop("key"), call.pop("fn"), **call)

    assert (caught.value.field, caught.value.bound) == (field, bound)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, WorkhorseError)
    assert "é" not in str(caught.value)  # keys are never echoed
    assert effect.calls == [] and not EffectRecord.objects.exists()


@pytest.mark.parametrize(
    "arguments",
    [
        {"key": "é" * 256},
        {"key": "k"},
        {"scope": "s" * 256},
        {"scope": "é" * 128},
        {"retention": timedelta(milliseconds=1)},
        {"retention": timedelta(days=365)},
    ],
)
def test_arguments_at_their_bounds_are_accepted(arguments):
    call = {"key": KEY, **arguments}
    assert once(call.pop("key"), lambda: "ok", **call) == "ok"
    assert EffectRecord.objects.count() == 1


def test_once_block_checks_its_bounds_before_claiming():
    with pytest.raises(EffectValidationError) as caught, once_block("k" * 513):
        pytest.fail("the block must not run")
    assert caught.value.field == "key"
    assert not EffectRecord.objects.exists()


# -- maintenance ------------------------------------------------------------------------------------------------


def test_maintenance_prunes_only_expired_entries():
    for key in ("a", "b", "c"):
        once(key, lambda: 1)
    EffectRecord.objects.exclude(key_hash=key_hash("default", "c")).update(expires_at=LONG_AGO)

    assert prune_expired_effects(chunk=1) == 2

    assert list(EffectRecord.objects.values_list("key_preview", flat=True)) == [key_preview("c")]


def test_run_maintenance_reports_the_pruned_entries():
    once("a", lambda: 1)
    EffectRecord.objects.update(expires_at=LONG_AGO)

    report = run_maintenance()

    assert (report.ran, report.expired_effects) == (True, 1)
    assert not EffectRecord.objects.exists()


# -- the handler context's Idempotency-Key helper --------------------------------------------------------------


def context(*, job_id: int, attempt: int, root_id: int) -> HandlerContext:
    job = ClaimedJob(
        id=job_id,
        job_type="tests.effects",
        queue="default",
        payload=None,
        attempt=attempt,
        max_attempts=5,
        retry_policy={},
        deadline=None,
        timeout=None,
        lease_token=uuid.uuid4(),
        root_id=root_id,
    )
    return HandlerContext(job, alias="default", on_heartbeat=lambda: None)


def test_idempotency_headers_are_stable_over_attempts_and_redrives():
    first = context(job_id=41, attempt=1, root_id=41)
    retry = context(job_id=41, attempt=3, root_id=41)
    redriven = context(job_id=97, attempt=1, root_id=41)

    for ctx in (first, retry, redriven):
        assert ctx.idempotency_headers("charge") == {"Idempotency-Key": "workhorse-job-41:charge"}
        assert ctx.idempotency_headers() == {"Idempotency-Key": "workhorse-job-41"}
        assert ctx.idempotency_key_for("refund") == "workhorse-job-41:refund"
        assert ctx.idempotency_headers("charge", header="X-Request-Id") == {"X-Request-Id": "workhorse-job-41:charge"}
    assert context(job_id=42, attempt=1, root_id=42).idempotency_key_for("charge") != first.idempotency_key_for(
        "charge"
    )


def test_idempotency_key_for_is_bounded_for_providers():
    ctx = context(job_id=2**63 - 1, attempt=1, root_id=2**63 - 1)
    longest = ctx.idempotency_key_for("s" * 200)
    assert len(longest) == 234 <= 255

    for bad in ("s" * 201, "two words", "étape", "tab\there", "new\nline"):
        with pytest.raises(EffectValidationError) as caught:
            ctx.idempotency_headers(bad)
        assert caught.value.field == "step"


credits_made: list[tuple[int, str]] = []


def credit_then_fail_once(ctx: HandlerContext, payload: dict[str, Any]) -> Any:
    """Credit an account through the ledger; the first attempt fails after the credit committed."""

    def credit() -> dict[str, Any]:
        credits_made.append((ctx.attempt, ctx.idempotency_headers("credit")["Idempotency-Key"]))
        enqueue("tests.noop", {"credit": payload["amount"]}, queue="not-served")  # the credit's own write
        return {"credited": payload["amount"], "on_attempt": ctx.attempt}

    result = once(ctx.idempotency_key_for("credit"), credit, scope="tests.credits")
    if ctx.attempt == 1:
        raise RuntimeError("the acknowledgement was lost")
    return result


def test_a_retried_handler_gets_the_stored_result_instead_of_crediting_again():
    register("tests.effects.credit", credit_then_fail_once)
    credits_made.clear()
    fast = RetryPolicy.fixed(timedelta(milliseconds=1))
    job_id = enqueue("tests.effects.credit", {"amount": 5}, max_attempts=3, retry_policy=fast)

    run_worker(max_jobs=2)

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.SUCCEEDED, 2)
    assert job.result == {"credited": 5, "on_attempt": 1}
    assert credits_made == [(1, f"workhorse-job-{job_id}:credit")]
    assert Job.objects.filter(job_type="tests.noop").count() == 1
    assert bytes(EffectRecord.objects.get().key_hash) == key_hash("tests.credits", f"workhorse-job-{job_id}:credit")
