"""Scopes starting with ``workhorse.`` are the library's: a caller's key there is refused before
anything is written, so a forged tick key cannot take a schedule's tick; the library's own keys
(ticks, run-now) still land there."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from django_workhorse import (
    Debounce,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    EnqueueValidationError,
    Idempotency,
    Throttle,
    Unique,
    enqueue,
    enqueue_due_schedules,
    enqueue_many,
    register,
    run_schedule_now,
    task,
)
from django_workhorse.models import IdempotencyBinding, Job, ScheduleState
from django_workhorse.schedules.actions import RUN_NOW_KEY_SCOPE, RUN_NOW_KEY_TTL, run_now_key
from django_workhorse.schedules.definition import TICK_KEY_SCOPE, tick_key

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
TASK = "tests.reserved_scope.tick"
OTHER = "tests.reserved_scope.other"
VICTIM = {"victim": {"task": TASK, "every": timedelta(minutes=10)}}


@register(TASK)
def tick_handler(payload: Any) -> Any:
    return payload


@register(OTHER)
def other_handler(payload: Any) -> Any:
    return payload


@task(name="tests.reserved_scope.decorated")
def decorated(n: int) -> int:
    return n


MODES = {
    "idempotency": lambda scope: Idempotency("k-1", scope=scope),
    "unique": lambda scope: Unique("k-1", scope=scope),
    "debounce": lambda scope: Debounce("k-1", scope=scope, window=timedelta(seconds=5)),
    "throttle": lambda scope: Throttle("k-1", scope=scope, window=timedelta(seconds=5)),
}


def assert_refused(error: EnqueueValidationError, mode: str, scope: str) -> None:
    assert error.field == f"{mode}.scope"
    assert "'workhorse.'" in error.bound and "reserved" in error.bound
    assert error.value == scope


@pytest.mark.parametrize("scope", [TICK_KEY_SCOPE, RUN_NOW_KEY_SCOPE, "workhorse.", "workhorse.future"])
@pytest.mark.parametrize("mode", list(MODES))
def test_enqueue_refuses_a_reserved_scope_in_every_keyed_mode_and_the_transaction_stays_usable(mode, scope):
    with transaction.atomic():
        with pytest.raises(EnqueueValidationError) as refused:
            enqueue(OTHER, {"n": 1}, **{mode: MODES[mode](scope)})
        assert not Job.objects.exists()  # still usable: the refusal wrote nothing
    assert_refused(refused.value, mode, scope)
    assert not IdempotencyBinding.objects.exists()


def test_the_reserved_prefix_is_workhorse_and_a_dot_exactly():
    with pytest.raises(EnqueueValidationError) as refused:
        enqueue(OTHER, {"n": 1}, idempotency=Idempotency("k-1", scope="workhorse."))
    assert_refused(refused.value, "idempotency", "workhorse.")
    for scope in ["workhorse", "workhorse_app.x", "Workhorse.schedule", "app.workhorse.x"]:
        job_id = enqueue(OTHER, {"n": 1}, idempotency=Idempotency("k-1", scope=scope))
        assert IdempotencyBinding.objects.get(job_id=job_id).scope == scope


def test_enqueue_many_refuses_a_reserved_scope_naming_its_ordinal():
    forged = EnqueueOptions(unique=Unique("k", scope=TICK_KEY_SCOPE))
    requests = [EnqueueRequest(OTHER, {"n": 0}), EnqueueRequest(OTHER, {"n": 1}), EnqueueRequest(OTHER, {}, forged)]
    with pytest.raises(EnqueueValidationError) as refused:
        enqueue_many(requests)
    assert_refused(refused.value, "unique", TICK_KEY_SCOPE)
    assert refused.value.ordinal == 2
    assert not Job.objects.exists()


def test_a_task_refuses_a_reserved_scope():
    with pytest.raises(EnqueueValidationError) as refused:
        decorated.apply_async((1,), idempotency=Idempotency("k", scope=TICK_KEY_SCOPE))
    assert_refused(refused.value, "idempotency", TICK_KEY_SCOPE)


@override_settings(WORKHORSE_SCHEDULES=VICTIM)
def test_a_forged_tick_key_is_refused_and_the_real_tick_lands():
    assert enqueue_due_schedules(T0 + timedelta(minutes=5)) == []
    tick = T0 + timedelta(minutes=10)
    forged = Idempotency(tick_key("victim", tick), scope=TICK_KEY_SCOPE, ttl=timedelta(days=30))

    with pytest.raises(EnqueueValidationError) as refused:
        enqueue(OTHER, {"evil": True}, idempotency=forged)
    assert_refused(refused.value, "idempotency", TICK_KEY_SCOPE)

    [result] = enqueue_due_schedules(tick)
    assert result.outcome is EnqueueOutcome.ACCEPTED
    job = Job.objects.get(pk=result.job_id)
    assert (job.job_type, job.scheduled_for) == (TASK, tick)
    assert ScheduleState.objects.get(name="victim").last_job_id == job.id
    assert IdempotencyBinding.objects.get(job=job).scope == TICK_KEY_SCOPE
    assert not Job.objects.filter(job_type=OTHER).exists()


@override_settings(WORKHORSE_SCHEDULES=VICTIM)
def test_a_forged_run_now_key_is_refused_and_run_now_still_lands():
    enqueue_due_schedules(T0)
    forged = Idempotency(run_now_key("victim", "req-1"), scope=RUN_NOW_KEY_SCOPE, ttl=RUN_NOW_KEY_TTL)
    with pytest.raises(EnqueueValidationError) as refused:
        enqueue(OTHER, {"evil": True}, idempotency=forged)
    assert_refused(refused.value, "idempotency", RUN_NOW_KEY_SCOPE)

    first = run_schedule_now("victim", request_id="req-1")
    again = run_schedule_now("victim", request_id="req-1")
    assert first.outcome is EnqueueOutcome.ACCEPTED
    assert (again.job_id, again.outcome) == (first.job_id, EnqueueOutcome.REPLAYED)
    assert Job.objects.get(pk=first.job_id).job_type == TASK
    assert IdempotencyBinding.objects.get(job_id=first.job_id).scope == RUN_NOW_KEY_SCOPE
