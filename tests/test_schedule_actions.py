"""Pause, resume and run-now of schedules, against PostgreSQL: no ticks while paused, no catch-up
after, one job per run-now request however often or concurrently it is submitted."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection
from django.test import override_settings

from django_workhorse import (
    EnqueueOutcome,
    InvalidArgumentError,
    ScheduleNotFoundError,
    conf,
    enqueue_due_schedules,
    pause_schedules,
    register,
    resume_schedules,
    run_schedule_now,
)
from django_workhorse.models import Job, JobStatus, ScheduleEvent, ScheduleState
from django_workhorse.schedules.actions import RUN_NOW_KEY_SCOPE, run_now_key
from django_workhorse.testing import eager
from tests.conftest import race

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
TASK = "tests.schedule_actions.tick"


@register(TASK)
def tick_handler(payload):
    return payload


MINUTELY = {"minutely": {"task": TASK, "every": timedelta(minutes=1), "kwargs": {"n": 1}}}
TWO = {**MINUTELY, "hourly": {"task": TASK, "cron": "0 * * * *", "timezone": "Europe/Paris"}}
SKIPPING = {"minutely": {**MINUTELY["minutely"], "overlap": "skip"}}


def jobs() -> list[Job]:
    return list(Job.objects.filter(job_type=TASK).order_by("id"))


def state(name: str = "minutely") -> ScheduleState:
    return ScheduleState.objects.get(name=name)


def events(name: str = "minutely") -> list[tuple[str, str, str, int | None]]:
    rows = ScheduleEvent.objects.filter(schedule__name=name).order_by("id")
    return list(rows.values_list("kind", "requested_by", "request_id", "job_id"))


def database_clock() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        value: datetime = cursor.fetchone()[0]
    return value


# -- pause and resume --------------------------------------------------------------------------------


@override_settings(WORKHORSE_SCHEDULES=MINUTELY)
def test_a_paused_schedule_makes_no_tick_and_resuming_does_not_catch_up():
    enqueue_due_schedules(T0 + timedelta(seconds=30))

    assert pause_schedules(["minutely"], requested_by="alice") == ["minutely"]
    assert enqueue_due_schedules(T0 + timedelta(minutes=10)) == []
    assert jobs() == []
    assert state().paused and state().evaluated_until == T0 + timedelta(seconds=30)

    resumed_at = T0 + timedelta(minutes=10, seconds=30)
    assert resume_schedules(["minutely"], requested_by="bob", now=resumed_at) == ["minutely"]
    assert not state().paused and state().evaluated_until == resumed_at
    assert enqueue_due_schedules(resumed_at + timedelta(seconds=20)) == []  # ten paused minutes: none caught up

    [result] = enqueue_due_schedules(T0 + timedelta(minutes=11, seconds=1))
    assert result.outcome is EnqueueOutcome.ACCEPTED
    assert [job.scheduled_for for job in jobs()] == [T0 + timedelta(minutes=11)]
    assert [(kind, by) for kind, by, _, _ in events()] == [("paused", "alice"), ("resumed", "bob")]


@override_settings(WORKHORSE_SCHEDULES=TWO)
def test_pause_and_resume_change_only_what_is_not_so_already_and_skip_unknown_names():
    enqueue_due_schedules(T0)

    assert pause_schedules(["minutely", "nope"]) == ["minutely"]
    assert pause_schedules(["minutely", "hourly"], requested_by="carol") == ["hourly"]
    assert pause_schedules(["minutely", "hourly"]) == []
    assert resume_schedules(["hourly", "minutely"], now=T0) == ["hourly", "minutely"]
    assert resume_schedules(["hourly"], now=T0) == []
    assert [kind for kind, *_ in events("minutely")] == ["paused", "resumed"]
    assert [(kind, by) for kind, by, *_ in events("hourly")] == [("paused", "carol"), ("resumed", "")]


@override_settings(WORKHORSE_SCHEDULES=MINUTELY)
def test_resume_starts_the_window_at_the_database_clock_and_never_moves_it_back():
    enqueue_due_schedules(T0)
    pause_schedules(["minutely"])
    before = database_clock()

    resume_schedules(["minutely"])

    assert before <= state().evaluated_until <= database_clock()
    later = state().evaluated_until + timedelta(seconds=1)  # ahead of the clock, within the tolerance
    enqueue_due_schedules(later)
    pause_schedules(["minutely"])
    resume_schedules(["minutely"], now=T0)
    assert state().evaluated_until == later


@pytest.mark.django_db(transaction=True)
@override_settings(WORKHORSE_SCHEDULES=MINUTELY)
def test_racing_pauses_change_the_schedule_once():
    enqueue_due_schedules(T0)

    results = race(8, lambda i: pause_schedules(["minutely"], requested_by=f"t{i}"))

    assert sorted(map(len, results)) == [0] * 7 + [1]
    assert [kind for kind, *_ in events()] == ["paused"]


# -- run now -----------------------------------------------------------------------------------------


@override_settings(WORKHORSE_SCHEDULES=MINUTELY)
def test_run_now_enqueues_one_job_per_request_id_and_records_who_asked():
    enqueue_due_schedules(T0)
    before = database_clock()

    first = run_schedule_now("minutely", request_id="r-1", requested_by="alice")
    again = run_schedule_now("minutely", request_id="r-1", requested_by="alice")

    assert first.outcome is EnqueueOutcome.ACCEPTED
    assert again.job_id == first.job_id and again.outcome is EnqueueOutcome.REPLAYED
    [job] = jobs()
    assert job.id == first.job_id and job.payload == {"n": 1} and job.status == JobStatus.QUEUED
    assert before <= job.scheduled_for <= database_clock()
    assert events() == [("run_now", "alice", "r-1", job.id)]
    assert state().last_job_id == job.id
    assert job.bindings.get().scope == RUN_NOW_KEY_SCOPE  # type: ignore[attr-defined]

    other = run_schedule_now("minutely", request_id="r-2")
    assert other.outcome is EnqueueOutcome.ACCEPTED and other.job_id != job.id
    assert state().last_job_id == other.job_id
    assert len(jobs()) == 2


@pytest.mark.django_db(transaction=True)
@override_settings(WORKHORSE_SCHEDULES=MINUTELY)
def test_racing_run_now_submissions_of_one_request_make_one_job():
    enqueue_due_schedules(T0)

    results = race(8, lambda i: run_schedule_now("minutely", request_id="double-click", requested_by="alice"))

    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sorted(r.outcome for r in results) == sorted([EnqueueOutcome.ACCEPTED] + [EnqueueOutcome.REPLAYED] * 7)
    assert len({r.job_id for r in results}) == 1
    [job] = jobs()
    assert events() == [("run_now", "alice", "double-click", job.id)]


@pytest.mark.django_db(transaction=True)
@override_settings(WORKHORSE_SCHEDULES=MINUTELY)
def test_racing_run_now_before_any_evaluation_writes_the_schedule_once():
    results = race(8, lambda i: run_schedule_now("minutely", request_id="first", requested_by="alice"))

    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len({r.job_id for r in results}) == 1 and len(jobs()) == 1
    assert ScheduleState.objects.filter(name="minutely").count() == 1
    assert state().last_job_id == jobs()[0].id


@override_settings(WORKHORSE_SCHEDULES=MINUTELY)
def test_a_paused_schedule_can_run_now_and_stays_paused():
    enqueue_due_schedules(T0)
    pause_schedules(["minutely"])

    result = run_schedule_now("minutely", request_id="r")

    assert result.outcome is EnqueueOutcome.ACCEPTED and state().paused
    assert enqueue_due_schedules(T0 + timedelta(minutes=5)) == []


@override_settings(WORKHORSE_SCHEDULES=SKIPPING)
def test_overlap_skip_waits_for_the_job_a_run_now_made():
    enqueue_due_schedules(T0)
    job_id = run_schedule_now("minutely", request_id="r").job_id
    ScheduleState.objects.update(evaluated_until=T0)  # the run-now read the real clock; the test drives time

    assert enqueue_due_schedules(T0 + timedelta(minutes=1, seconds=1)) == []

    assert state().last_skip_reason == f"overlap=skip: job {job_id} is queued"
    Job.objects.filter(pk=job_id).update(status=JobStatus.SUCCEEDED)
    [result] = enqueue_due_schedules(T0 + timedelta(minutes=2, seconds=1))
    assert state().last_job_id == result.job_id != job_id


@override_settings(WORKHORSE_SCHEDULES=MINUTELY)
def test_in_eager_mode_run_now_runs_the_job_once():
    with eager():
        first = run_schedule_now("minutely", request_id="r")
        again = run_schedule_now("minutely", request_id="r")

    assert again == type(first)(first.job_id, EnqueueOutcome.REPLAYED)
    [job] = jobs()
    assert job.status == JobStatus.SUCCEEDED and job.result == {"n": 1} and job.attempt == 1


@override_settings(WORKHORSE_SCHEDULES=MINUTELY)
def test_run_now_of_a_schedule_not_in_this_code_or_inactive_is_a_typed_error():
    with pytest.raises(ScheduleNotFoundError, match="'elsewhere' is not declared"):
        run_schedule_now("elsewhere", request_id="r")
    enqueue_due_schedules(T0)
    with override_settings(WORKHORSE_SCHEDULES={}):
        enqueue_due_schedules(T0 + timedelta(seconds=1))  # removed from code: inactive
        with pytest.raises(ScheduleNotFoundError, match="not declared"):
            run_schedule_now("minutely", request_id="r")
    assert not state().active
    with pytest.raises(ScheduleNotFoundError, match="'minutely' is inactive") as excinfo:
        run_schedule_now("minutely", request_id="r")  # declared here, but the last evaluation did not know it
    assert (excinfo.value.name, isinstance(excinfo.value, LookupError)) == ("minutely", True)
    assert jobs() == [] and events() == []


def test_the_run_now_key_is_a_digest_of_name_and_request_id():
    key = run_now_key("x" * conf.MAX_SCHEDULE_NAME_CHARS, "r" * conf.MAX_REQUEST_ID_CHARS)
    assert len(key) == 64 and key != run_now_key("x", "r")
    assert run_now_key("a", "b:c") != run_now_key("a:b", "c")


# -- bounds ------------------------------------------------------------------------------------------


def _fails(field: str, call) -> None:
    with pytest.raises(InvalidArgumentError) as excinfo:
        call()
    assert excinfo.value.field == field, excinfo.value


@override_settings(WORKHORSE_SCHEDULES=MINUTELY)
def test_requested_by_and_request_id_at_their_bounds():
    enqueue_due_schedules(T0)
    longest_by = "b" * conf.MAX_REQUESTED_BY_CHARS
    longest_id = "i" * conf.MAX_REQUEST_ID_CHARS

    assert run_schedule_now("minutely", request_id=longest_id, requested_by=longest_by).outcome == "accepted"
    assert pause_schedules(["minutely"], requested_by=longest_by) == ["minutely"]
    assert resume_schedules(["minutely"], requested_by=longest_by) == ["minutely"]

    _fails("requested_by", lambda: run_schedule_now("minutely", request_id="r", requested_by=longest_by + "b"))
    _fails("request_id", lambda: run_schedule_now("minutely", request_id=longest_id + "i"))
    _fails("request_id", lambda: run_schedule_now("minutely", request_id=""))
    _fails("request_id", lambda: run_schedule_now("minutely", request_id="a\x00b"))
    _fails("request_id", lambda: run_schedule_now("minutely", request_id=7))  # type: ignore[arg-type]
    _fails("requested_by", lambda: pause_schedules(["minutely"], requested_by=longest_by + "b"))
    _fails("requested_by", lambda: resume_schedules(["minutely"], requested_by="\x00"))
    assert len(jobs()) == 1 and not state().paused and len(events()) == 3


@override_settings(WORKHORSE_SCHEDULES=MINUTELY)
def test_schedule_names_at_their_bounds():
    longest = "n" * conf.MAX_SCHEDULE_NAME_CHARS
    widest = "é" * (conf.MAX_SCHEDULE_NAME_BYTES // 2)

    assert pause_schedules([longest, widest]) == []  # storable, just unknown
    with pytest.raises(ScheduleNotFoundError):
        run_schedule_now(longest, request_id="r")

    _fails("name", lambda: run_schedule_now(longest + "n", request_id="r"))
    _fails("name", lambda: run_schedule_now("", request_id="r"))
    _fails("name", lambda: run_schedule_now(None, request_id="r"))  # type: ignore[arg-type]
    _fails("names", lambda: pause_schedules([longest + "n"]))
    _fails("names", lambda: pause_schedules([widest + "é"]))  # 201 characters too, but also 402 bytes
    _fails("names", lambda: resume_schedules(["a\x00"]))
    _fails("names", lambda: resume_schedules("minutely"))  # type: ignore[arg-type]
    _fails("names", lambda: pause_schedules(None))  # type: ignore[arg-type]
    _fails("now", lambda: resume_schedules(["minutely"], now=datetime(2026, 1, 1)))  # naive


def test_schedule_names_past_the_byte_bound_are_refused():
    name = "€" * (conf.MAX_SCHEDULE_NAME_BYTES // 3 + 1)  # 134 characters, 402 bytes
    assert len(name) <= conf.MAX_SCHEDULE_NAME_CHARS
    _fails("names", lambda: pause_schedules([name]))
    _fails("name", lambda: run_schedule_now(name, request_id="r"))
