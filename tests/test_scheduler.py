"""Evaluating schedules against PostgreSQL: one job per tick, state synced from code."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.test import override_settings

from django_workhorse import EnqueueOutcome, enqueue_due_schedules, register
from django_workhorse.models import Job, ScheduleState

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)


@register("tests.scheduler.tick")
def tick_handler(payload):
    return payload


EVERY_MINUTE = {"minutely": {"task": "tests.scheduler.tick", "every": timedelta(minutes=1), "kwargs": {"n": 1}}}


def jobs(name="tests.scheduler.tick"):
    return list(Job.objects.filter(job_type=name).order_by("scheduled_for"))


@override_settings(WORKHORSE_SCHEDULES=EVERY_MINUTE)
def test_first_evaluation_records_the_schedule_and_enqueues_nothing_then_a_tick():
    assert enqueue_due_schedules(T0 + timedelta(seconds=30)) == []
    state = ScheduleState.objects.get(name="minutely")
    assert state.active and not state.paused and state.evaluated_until == T0 + timedelta(seconds=30)
    results = enqueue_due_schedules(T0 + timedelta(seconds=61))
    assert [r.outcome for r in results] == [EnqueueOutcome.ACCEPTED]
    [job] = jobs()
    assert job.scheduled_for == T0 + timedelta(minutes=1) and job.payload == {"n": 1}
    state.refresh_from_db()
    assert state.last_job_id == job.id and state.last_tick_at == job.scheduled_for
    # The same instant again, and an overlapping window: the same job.
    assert enqueue_due_schedules(T0 + timedelta(seconds=61)) == []
    assert len(jobs()) == 1
