"""A ``now`` ahead of the database's clock: refused beyond the tolerance (one call with 2030 would
stop every tick until 2030), allowed by WORKHORSE_ALLOW_FUTURE_NOW in tests, and a window already
pushed ahead of the clock brought back by ``resume_schedules``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_workhorse import InvalidArgumentError, enqueue_due_schedules, pause_schedules, register, resume_schedules
from django_workhorse.models import Job, ScheduleEvent, ScheduleState

pytestmark = pytest.mark.django_db

TASK = "tests.schedule_now_guard.tick"
FAR = datetime(2030, 1, 1, tzinfo=timezone.utc)
SCHEDULES = {
    "minutely": {"task": TASK, "every": timedelta(minutes=1)},
    "hourly": {"task": TASK, "cron": "0 * * * *"},
}


@register(TASK)
def tick(payload: Any) -> Any:
    return payload


def database_clock() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        value: datetime = cursor.fetchone()[0]
    return value


def window(name: str) -> datetime:
    return ScheduleState.objects.get(name=name).evaluated_until


def refused(call: Callable[[], object]) -> InvalidArgumentError:
    """Run ``call`` in the caller's transaction; it must be refused and leave the transaction usable."""
    with transaction.atomic():
        with pytest.raises(InvalidArgumentError) as excinfo:
            call()
        assert database_clock()  # the transaction still runs statements
    return excinfo.value


def test_now_is_refused_one_microsecond_past_the_tolerance_and_accepted_at_it():
    from django_workhorse.schedules.evaluation import FUTURE_NOW_TOLERANCE, check_now

    clock = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
    assert check_now(clock + FUTURE_NOW_TOLERANCE, clock) == clock + FUTURE_NOW_TOLERANCE
    assert check_now(clock - timedelta(days=365), clock) == clock - timedelta(days=365)  # the past is fine
    with pytest.raises(InvalidArgumentError) as excinfo:
        check_now(clock + FUTURE_NOW_TOLERANCE + timedelta(microseconds=1), clock)
    assert excinfo.value.field == "now"
    assert f"at most {FUTURE_NOW_TOLERANCE.total_seconds():g} s ahead of the database's clock" in str(excinfo.value)
    with override_settings(WORKHORSE_ALLOW_FUTURE_NOW=True):
        assert check_now(FAR, clock) == FAR


@override_settings(WORKHORSE_SCHEDULES=SCHEDULES)
def test_a_future_now_is_refused_by_evaluations_and_schedule_actions_before_anything_is_written():
    enqueue_due_schedules()
    before = list(ScheduleState.objects.order_by("name").values_list("name", "evaluated_until", "paused"))

    errors = [
        refused(lambda: enqueue_due_schedules(FAR)),
        refused(lambda: pause_schedules(["minutely"], now=FAR)),
        refused(lambda: resume_schedules(["minutely"], now=FAR)),
    ]

    assert all(error.field == "now" and "ahead of the database's clock" in str(error) for error in errors)
    assert list(ScheduleState.objects.order_by("name").values_list("name", "evaluated_until", "paused")) == before
    assert not ScheduleEvent.objects.exists() and not Job.objects.exists()
    enqueue_due_schedules(database_clock() + timedelta(seconds=1))  # within the tolerance: evaluated


@override_settings(WORKHORSE_SCHEDULES=SCHEDULES)
def test_resume_brings_back_a_window_pushed_ahead_of_the_clock_paused_or_not():
    enqueue_due_schedules()
    with override_settings(WORKHORSE_ALLOW_FUTURE_NOW=True):
        assert len(enqueue_due_schedules(FAR)) == 2  # each schedule's newest tick before 2030
    pause_schedules(["hourly"])
    assert window("minutely") == window("hourly") == FAR
    assert enqueue_due_schedules() == []  # stuck: nothing would be due until 2030

    before = database_clock()
    assert resume_schedules(["hourly", "minutely"], requested_by="ops") == ["hourly", "minutely"]
    after = database_clock()

    for name in ("hourly", "minutely"):
        assert before <= window(name) <= after
        assert not ScheduleState.objects.get(name=name).paused
    events = ScheduleEvent.objects.order_by("schedule__name", "id").values_list(
        "schedule__name", "kind", "requested_by"
    )
    assert list(events) == [("hourly", "paused", ""), ("hourly", "resumed", "ops"), ("minutely", "resumed", "ops")]
    assert resume_schedules(["hourly", "minutely"]) == []  # nothing left to resume or repair
    with override_settings(WORKHORSE_ALLOW_FUTURE_NOW=True):
        assert enqueue_due_schedules(window("minutely") + timedelta(minutes=1))  # ticks come again
    assert Job.objects.filter(scheduled_for__gt=before, scheduled_for__lt=FAR).exists()
