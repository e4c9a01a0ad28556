"""Evaluating schedules against PostgreSQL: one job per tick whatever number of evaluators, windows,
catch-up and overlap policies, DST, state synced from code, and real worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from django_workhorse import EnqueueOutcome, Schedule, enqueue, enqueue_due_schedules, register, task
from django_workhorse.models import IdempotencyBinding, Job, JobStatus, ScheduleState
from django_workhorse.schedules import sources
from django_workhorse.schedules.definition import TICK_KEY_SCOPE
from django_workhorse.testing import eager
from tests.conftest import race
from tests.processes import subprocess_database_url

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
TASK = "tests.scheduler.tick"
CALLS: list[Any] = []


@register(TASK)
def tick_handler(ctx, payload):
    CALLS.append({"scheduled_for": ctx.scheduled_for, "payload": payload})
    return payload


def entry(**fields: Any) -> dict[str, Any]:
    return {"task": TASK, "every": timedelta(minutes=10), **fields}


def ticks_of(name: str | None = None) -> list[datetime]:
    """The ticks enqueued (as their jobs' scheduled_for), oldest first."""
    jobs = Job.objects.filter(job_type=TASK, scheduled_for__isnull=False)
    return list(jobs.order_by("scheduled_for").values_list("scheduled_for", flat=True))


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


# --- evaluation ----------------------------------------------------------------------------------


@override_settings(WORKHORSE_SCHEDULES={"s": entry(kwargs={"n": 1})})
def test_first_evaluation_records_the_schedule_and_enqueues_nothing_then_each_tick_once():
    assert enqueue_due_schedules(T0 + minutes(5)) == []
    state = ScheduleState.objects.get(name="s")
    assert (state.active, state.paused, state.evaluated_until, state.task) == (True, False, T0 + minutes(5), TASK)
    assert state.definition["every_seconds"] == 600 and state.definition["kwargs"] == {"n": 1}

    results = enqueue_due_schedules(T0 + minutes(10))
    assert [r.outcome for r in results] == [EnqueueOutcome.ACCEPTED]
    [job] = Job.objects.filter(job_type=TASK)
    assert (job.scheduled_for, job.payload) == (T0 + minutes(10), {"n": 1})
    state.refresh_from_db()
    assert (state.last_job_id, state.last_tick_at, state.evaluated_until) == (
        job.id,
        T0 + minutes(10),
        T0 + minutes(10),
    )
    # The tick's key is in the reserved scope.
    assert IdempotencyBinding.objects.get(job=job).scope == TICK_KEY_SCOPE
    # The same instant again: nothing due.
    assert enqueue_due_schedules(T0 + minutes(10)) == []
    assert ticks_of() == [T0 + minutes(10)]


@override_settings(WORKHORSE_SCHEDULES={"s": entry(catch_up="all")})
def test_overlapping_evaluation_windows_replay_the_ticks_they_share():
    enqueue_due_schedules(T0)
    first = enqueue_due_schedules(T0 + minutes(30))
    assert [r.outcome for r in first] == [EnqueueOutcome.ACCEPTED] * 3
    # A second evaluator whose window began before the first one's end (it read the state earlier).
    ScheduleState.objects.filter(name="s").update(evaluated_until=T0 + minutes(5))
    second = enqueue_due_schedules(T0 + minutes(40))
    assert [r.outcome for r in second] == [EnqueueOutcome.REPLAYED] * 3 + [EnqueueOutcome.ACCEPTED]
    assert [r.job_id for r in second[:3]] == [r.job_id for r in first]
    assert ticks_of() == [T0 + minutes(m) for m in (10, 20, 30, 40)]


@override_settings(WORKHORSE_SCHEDULES={"s": entry()})
def test_the_window_never_moves_back():
    enqueue_due_schedules(T0)
    enqueue_due_schedules(T0 + minutes(10))
    assert enqueue_due_schedules(T0 + minutes(1)) == []  # an evaluator whose clock is behind
    assert ScheduleState.objects.get(name="s").evaluated_until == T0 + minutes(10)


@pytest.mark.parametrize(
    ("policy", "now", "expected"),
    [
        # An every-10-minutes schedule last evaluated at T0, back 3 hours later: 18 missed ticks.
        ("all", T0 + timedelta(hours=3), [T0 + minutes(10 * k) for k in range(1, 19)]),
        ("latest", T0 + timedelta(hours=3), [T0 + timedelta(hours=3)]),
        ("skip", T0 + timedelta(hours=3, seconds=60), [T0 + timedelta(hours=3)]),
        ("skip", T0 + timedelta(hours=3, seconds=61), []),
    ],
)
def test_a_three_hour_outage_under_each_catch_up_policy(policy, now, expected):
    with override_settings(WORKHORSE_SCHEDULES={"s": entry(catch_up=policy)}):
        enqueue_due_schedules(T0)
        enqueue_due_schedules(now)
    assert ticks_of() == expected
    state = ScheduleState.objects.get(name="s")
    assert state.evaluated_until == now
    if not expected:  # recorded, not silently dropped
        assert state.last_skip_at == T0 + timedelta(hours=3) and "catch_up=skip" in state.last_skip_reason


@pytest.mark.parametrize(("missed", "enqueued"), [(5, 5), (6, 5)])
def test_max_catch_up_at_its_edge_keeps_the_latest_ticks(missed, enqueued):
    with override_settings(WORKHORSE_SCHEDULES={"s": entry(catch_up="all")}, WORKHORSE_SCHEDULE_MAX_CATCH_UP=5):
        enqueue_due_schedules(T0)
        enqueue_due_schedules(T0 + minutes(10 * missed))
    assert ticks_of() == [T0 + minutes(10 * k) for k in range(missed - enqueued + 1, missed + 1)]


@override_settings(WORKHORSE_SCHEDULES={"s": entry(overlap="skip", catch_up="all")})
def test_overlap_skip_waits_while_the_previous_job_is_queued_or_running_then_runs_the_next_tick():
    enqueue_due_schedules(T0)
    [first] = enqueue_due_schedules(T0 + minutes(10))
    # Queued: the next tick is skipped, and why is recorded.
    assert enqueue_due_schedules(T0 + minutes(20)) == []
    state = ScheduleState.objects.get(name="s")
    assert state.last_skip_at == T0 + minutes(20)
    assert state.last_skip_reason == f"overlap=skip: job {first.job_id} is queued"
    # Running: skipped too.
    Job.objects.filter(pk=first.job_id).update(status=JobStatus.RUNNING)
    assert enqueue_due_schedules(T0 + minutes(30)) == []
    assert "is running" in ScheduleState.objects.get(name="s").last_skip_reason
    # Finished: the next tick runs; catch-up "all" would overlap itself, so only the newest.
    Job.objects.filter(pk=first.job_id).update(status=JobStatus.SUCCEEDED)
    [second] = enqueue_due_schedules(T0 + minutes(50))
    assert second.outcome is EnqueueOutcome.ACCEPTED
    assert ticks_of() == [T0 + minutes(10), T0 + minutes(50)]
    assert ScheduleState.objects.get(name="s").last_job_id == second.job_id


@override_settings(WORKHORSE_SCHEDULES={"s": entry(overlap="skip")})
def test_overlap_skip_runs_when_the_previous_job_was_pruned():
    enqueue_due_schedules(T0)
    [first] = enqueue_due_schedules(T0 + minutes(10))
    Job.objects.filter(pk=first.job_id).delete()
    assert [r.outcome for r in enqueue_due_schedules(T0 + minutes(20))] == [EnqueueOutcome.ACCEPTED]


def test_paused_schedules_make_no_ticks():
    with override_settings(WORKHORSE_SCHEDULES={"s": entry()}):
        enqueue_due_schedules(T0)
        ScheduleState.objects.filter(name="s").update(paused=True)
        assert enqueue_due_schedules(T0 + timedelta(hours=1)) == []
        assert ScheduleState.objects.get(name="s").evaluated_until == T0
    assert ticks_of() == []


def test_all_due_ticks_of_all_schedules_go_in_one_batch(django_assert_max_num_queries):
    schedules = {f"s{i}": entry(kwargs={"i": i}) for i in range(20)}
    with override_settings(WORKHORSE_SCHEDULES=schedules):
        enqueue_due_schedules(T0)
        # read the states, lock the due ones, one enqueue statement, advance (and the savepoints).
        with django_assert_max_num_queries(8):
            results = enqueue_due_schedules(T0 + minutes(10))
    assert [r.outcome for r in results] == [EnqueueOutcome.ACCEPTED] * 20
    assert sorted(Job.objects.values_list("payload__i", flat=True)) == list(range(20))


def test_nothing_due_is_one_query(django_assert_num_queries):
    with override_settings(WORKHORSE_SCHEDULES={f"s{i}": entry() for i in range(50)}):
        enqueue_due_schedules(T0)
        with django_assert_num_queries(1):
            assert enqueue_due_schedules(T0 + minutes(5)) == []


def test_settings_are_read_at_each_evaluation_and_removed_schedules_are_kept_inactive():
    with override_settings(WORKHORSE_SCHEDULES={"a": entry(), "b": entry()}):
        enqueue_due_schedules(T0)
    with override_settings(WORKHORSE_SCHEDULES={"a": entry(every=minutes(5))}):
        enqueue_due_schedules(T0 + minutes(5))
        a, b = ScheduleState.objects.order_by("name")
        assert (a.active, a.definition["every_seconds"], b.active) == (True, 300, False)
        assert ticks_of() == [T0 + minutes(5)]  # b made no tick: it is not in the code any more
    with override_settings(WORKHORSE_SCHEDULES={"a": entry(), "b": entry()}):
        enqueue_due_schedules(T0 + minutes(10))
        b = ScheduleState.objects.get(name="b")
        # back in code: active, its window where it was (T0), so its tick of 12:10 is due
        assert b.active and b.last_tick_at == T0 + minutes(10)
        assert ticks_of() == [T0 + minutes(5), T0 + minutes(10), T0 + minutes(10)]


@override_settings(WORKHORSE_SCHEDULES={"s": entry(kwargs={"v": 1})})
def test_a_tick_enqueued_by_another_definition_is_that_ticks_job():
    """During a rolling deploy old and new code evaluate the same tick: one job, the first one's."""
    enqueue_due_schedules(T0)
    [old] = enqueue_due_schedules(T0 + minutes(10))
    ScheduleState.objects.filter(name="s").update(evaluated_until=T0)
    with override_settings(WORKHORSE_SCHEDULES={"s": entry(kwargs={"v": 2})}):
        assert enqueue_due_schedules(T0 + minutes(10)) == []
    assert list(Job.objects.values_list("id", "payload")) == [(old.job_id, {"v": 1})]
    assert ScheduleState.objects.get(name="s").last_job_id == old.job_id


def test_one_bad_schedule_does_not_stop_the_others():
    schedules = {"bad": entry(kwargs={"text": "nul\x00"}), "good": entry(kwargs={"n": 1})}
    with override_settings(WORKHORSE_SCHEDULES=schedules):
        enqueue_due_schedules(T0)
        results = enqueue_due_schedules(T0 + minutes(10))
    assert [r.outcome for r in results] == [EnqueueOutcome.ACCEPTED]
    assert list(Job.objects.values_list("payload", flat=True)) == [{"n": 1}]
    assert list(ScheduleState.objects.values_list("name", flat=True)) == ["good"]


def test_now_must_be_an_aware_storable_instant():
    from django_workhorse import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="now"):
        enqueue_due_schedules(datetime(2026, 6, 1))  # noqa: DTZ001


def test_without_now_the_database_clock_decides():
    with override_settings(WORKHORSE_SCHEDULES={"s": entry(every=timedelta(seconds=1))}):
        enqueue_due_schedules()
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            (clock,) = cursor.fetchone()
        state = ScheduleState.objects.get(name="s")
        assert abs(state.evaluated_until - clock) < timedelta(minutes=1)


# --- declaring ----------------------------------------------------------------------------------


def test_task_schedules_are_named_after_the_task(task_schedules):
    @task(name="tests.scheduler.nightly", schedule=Schedule("0 3 * * *", timezone="Europe/Paris"))
    def nightly(region: str = "eu") -> str:
        return region

    @task(
        name="tests.scheduler.twice",
        schedules=[Schedule(every=minutes(5)), Schedule(every=minutes(7), kwargs={"n": 2}, name="seven")],
    )
    def twice(n: int = 1) -> int:
        return n

    declared, problems = sources.declared_schedules()
    names = {d.name: d.task for d in declared}
    assert names["tests.scheduler.nightly"] == "tests.scheduler.nightly"
    assert names["tests.scheduler.twice[0]"] == names["seven"] == "tests.scheduler.twice"
    assert problems == []


def test_a_task_schedule_enqueues_the_tasks_call_with_its_defaults(task_schedules):
    @task(name="tests.scheduler.report", queue="reports", schedule=Schedule(every=minutes(10), kwargs={"region": "us"}))
    def report(region: str = "eu") -> str:
        return region

    enqueue_due_schedules(T0)
    enqueue_due_schedules(T0 + minutes(10))
    job = Job.objects.get(job_type="tests.scheduler.report")
    assert (job.queue, job.payload, job.scheduled_for) == ("reports", {"region": "us"}, T0 + minutes(10))


def test_a_django_tasks_task_by_module_path_is_scheduled():
    pytest.importorskip("django_workhorse.backends.backend")
    path = "tests.test_django_tasks_backend.noop"
    try:
        __import__("tests.test_django_tasks_backend")
    except Exception as exc:  # the backend tests need django.tasks
        pytest.skip(str(exc))
    with override_settings(WORKHORSE_SCHEDULES={"dt": {"task": path, "every": minutes(10)}}):
        enqueue_due_schedules(T0)
        [result] = enqueue_due_schedules(T0 + minutes(10))
    job = Job.objects.get(pk=result.job_id)
    assert (job.job_type, job.payload) == (path, {"args": [], "kwargs": {}})


def test_schedule_and_schedules_together_are_refused():
    from django_workhorse import ScheduleDefinitionError

    with pytest.raises(ScheduleDefinitionError, match="schedules"):
        task(name="x", schedule=Schedule(every=minutes(1)), schedules=[Schedule(every=minutes(2))])
    with pytest.raises(ScheduleDefinitionError, match="schedule"):
        task(name="x", schedules=["* * * * *"])  # type: ignore[list-item]


# --- handlers -----------------------------------------------------------------------------------


@override_settings(WORKHORSE_SCHEDULES={"s": entry(kwargs={"n": 7})})
def test_handlers_see_the_tick_as_scheduled_for_and_none_otherwise():
    CALLS.clear()
    with eager():
        enqueue_due_schedules(T0)
        enqueue_due_schedules(T0 + minutes(10))
        enqueue(TASK, {"n": 8})
    assert [
        {"scheduled_for": T0 + minutes(10), "payload": {"n": 7}},
        {"scheduled_for": None, "payload": {"n": 8}},
    ] == CALLS
    assert CALLS[0]["scheduled_for"].tzinfo is not None and CALLS[0]["scheduled_for"].utcoffset() == timedelta(0)


# --- DST ----------------------------------------------------------------------------------------


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("zone", "cron", "day", "expected"),
    [
        # Spring forward: 02:30 does not exist; it runs once, at the change (03:00 local).
        (
            "Europe/Paris",
            "30 2 * * *",
            (2026, 3, 29),
            [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)],
        ),
        (
            "America/New_York",
            "30 2 * * *",
            (2026, 3, 8),
            [utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7), utc(2026, 3, 9, 6, 30)],
        ),
        # Fall back: 02:30 (Paris) / 01:30 (New York) happen twice; it runs once, at the first.
        (
            "Europe/Paris",
            "30 2 * * *",
            (2026, 10, 25),
            [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)],
        ),
        (
            "America/New_York",
            "30 1 * * *",
            (2026, 11, 1),
            [utc(2026, 10, 31, 5, 30), utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)],
        ),
    ],
)
def test_dst_transitions_make_one_job_per_local_day_evaluated_every_15_minutes(zone, cron, day, expected):
    start = datetime(*day, tzinfo=timezone.utc) - timedelta(days=1)
    with override_settings(WORKHORSE_SCHEDULES={"s": {"task": TASK, "cron": cron, "timezone": zone}}):
        enqueue_due_schedules(start - timedelta(hours=12))
        for step in range(0, 3 * 24 * 4):
            enqueue_due_schedules(start + timedelta(minutes=15 * step))
    assert ticks_of() == expected


# --- racing evaluators --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@override_settings(WORKHORSE_SCHEDULES={"s": entry(catch_up="all"), "t": entry(every=minutes(5), catch_up="all")})
def test_eight_threads_evaluating_the_same_instant_make_one_job_per_tick():
    enqueue_due_schedules(T0)
    results = race(8, lambda i: enqueue_due_schedules(T0 + minutes(30)))
    assert not [r for r in results if isinstance(r, BaseException)], results
    accepted = [r for batch in results for r in batch if r.outcome is EnqueueOutcome.ACCEPTED]
    jobs = Job.objects.filter(job_type=TASK)
    assert len(accepted) == jobs.count() == 3 + 6
    assert Counter(jobs.values_list("scheduled_for", flat=True)).most_common(1)[0][1] == 2  # s and t share 3 ticks
    assert sorted(r.job_id for r in accepted) == sorted(jobs.values_list("id", flat=True))


@pytest.mark.django_db(transaction=True)
@override_settings(WORKHORSE_SCHEDULES={"s": entry(catch_up="all")})
def test_eight_threads_evaluating_overlapping_windows_make_one_job_per_tick():
    enqueue_due_schedules(T0)
    results = race(8, lambda i: enqueue_due_schedules(T0 + minutes(10 * (i + 1))))
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert ticks_of() == [T0 + minutes(10 * k) for k in range(1, 9)]


SCHEDULE_MAIN = """
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import django
django.setup()
from datetime import datetime, timedelta
from django.test import override_settings
from django_workhorse import enqueue_due_schedules, register
register("tests.scheduler.tick", lambda payload: payload)
override_settings(WORKHORSE_SCHEDULES={
    "s": {"task": "tests.scheduler.tick", "every": timedelta(minutes=10), "catch_up": "all"}
}).enable()
print("ready", flush=True)
go = sys.argv[1]
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.005)
results = enqueue_due_schedules(datetime.fromisoformat(sys.argv[2]))
print(json.dumps([[r.job_id, r.outcome.value] for r in results]), flush=True)
"""


@pytest.mark.django_db(transaction=True)
def test_three_processes_evaluating_the_same_instant_make_one_job_per_tick(tmp_path):
    with override_settings(WORKHORSE_SCHEDULES={"s": entry(catch_up="all")}):
        enqueue_due_schedules(T0)
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    go = tmp_path / "go"
    now = (T0 + minutes(40)).isoformat()
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", SCHEDULE_MAIN, str(go), now],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready", process.stderr
        go.touch()  # released together
        outputs = [process.communicate(timeout=60) for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert all(process.returncode == 0 for process in processes), outputs
    batches = [json.loads(out) for out, _ in outputs]
    accepted = [job for batch in batches for job, outcome in batch if outcome == "accepted"]
    assert len(accepted) == 4 and all(len(batch) == 4 for batch in batches if batch)
    assert ticks_of() == [T0 + minutes(10 * k) for k in range(1, 5)]


# --- commands and workers -----------------------------------------------------------------------


@override_settings(WORKHORSE_SCHEDULES={"s": entry(every=timedelta(seconds=1))})
def test_workhorse_scheduler_once_evaluates_and_reports(capsys):
    call_command("workhorse_scheduler", "--once")
    assert "0 due tick(s)" in capsys.readouterr().out
    assert ScheduleState.objects.filter(name="s").exists()


@pytest.mark.django_db(transaction=True)
def test_two_worker_processes_run_an_every_second_schedule_one_job_per_tick(tmp_path):
    from tests.worker_tasks import wait_for

    env = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "WORKHORSE_TEST_SCHEDULES": json.dumps({"every-second": {"task": "tests.scheduled", "every": 1}}),
        "WORKHORSE_TEST_SCHEDULE_INTERVAL": "0.1",
    }
    workers = []
    for i in range(2):
        log = tmp_path / f"worker-{i}.log"
        with log.open("wb") as out:
            workers.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(ROOT / "tests" / "worker_main.py"),
                        "--poll-interval",
                        "0.05",
                        "--concurrency",
                        "2",
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=out,
                )
            )
    done = Job.objects.filter(job_type="tests.scheduled", status=JobStatus.SUCCEEDED)
    try:
        wait_for(lambda: done.count() >= 4, 60, what="four ticks to run")
    finally:
        for worker in workers:
            worker.terminate()
        codes = [worker.wait(60) for worker in workers]
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs
    jobs = list(Job.objects.filter(job_type="tests.scheduled").order_by("scheduled_for"))
    ticks = [job.scheduled_for for job in jobs]
    assert len(ticks) == len(set(ticks)) >= 4  # one job per tick
    assert all(tick.microsecond == 0 for tick in ticks)  # aligned to whole seconds
    assert all(later - earlier == timedelta(seconds=1) for earlier, later in zip(ticks, ticks[1:], strict=False))
    for job in jobs:
        if job.status == JobStatus.SUCCEEDED:
            assert job.result["scheduled_for"] == job.scheduled_for.isoformat()


@pytest.mark.django_db(transaction=True)
@override_settings(WORKHORSE_SCHEDULES={"s": entry(every=timedelta(seconds=1))})
def test_a_worker_evaluates_the_schedules_unless_told_not_to():
    import threading

    from tests.worker_tasks import make_worker, running, wait_for

    job_id = enqueue("tests.record", {"n": 1})
    with running(make_worker(scheduler=False)) as handle:
        wait_for(lambda: handle.worker.stats.finished.get("succeeded"), 30, what="the job to run")
        assert "workhorse-scheduler" not in {thread.name for thread in threading.enumerate()}
    assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED
    assert not ScheduleState.objects.exists()
    with running(make_worker()):
        wait_for(lambda: ScheduleState.objects.filter(name="s").exists(), 30, what="the worker to evaluate")


@pytest.mark.django_db(transaction=True)
def test_an_evaluation_that_fails_does_not_stop_the_worker(monkeypatch, caplog):
    from django_workhorse.schedules import evaluation as scheduler
    from tests.worker_tasks import make_worker, running, wait_for

    calls: list[int] = []

    def failing(**kwargs: Any) -> list[Any]:
        calls.append(1)
        raise RuntimeError("boom")

    monkeypatch.setattr(scheduler, "enqueue_due_schedules", failing)
    with override_settings(WORKHORSE_SCHEDULE_INTERVAL=timedelta(milliseconds=1)):
        worker = make_worker()
        with running(worker):
            wait_for(lambda: len(calls) >= 3, 30, what="three evaluations")
    assert worker.stats.failed_threads == []
    assert "Evaluating the schedules failed" in caplog.text


@pytest.mark.parametrize(
    "module",
    [
        "django_workhorse.schedules.evaluation",
        "django_workhorse.enqueueing.api",
        "django_workhorse.worker.eager",
        "django_workhorse.tasks.decorator",
        "django_workhorse.schedules.sources",
        "django_workhorse.worker",
    ],
)
def test_each_module_imports_first_in_a_fresh_process(module):
    code = f"import django; django.setup(); import {module}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": subprocess_database_url()}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@override_settings(
    WORKHORSE_SCHEDULES={"s": entry(every=timedelta(minutes=1), catch_up="all")}, WORKHORSE_SCHEDULE_MAX_CATCH_UP=1501
)
def test_workhorse_scheduler_once_counts_many_new_jobs_and_names_only_the_first_ten(capsys):
    enqueue_due_schedules(T0)  # months ago: the newest 1,501 minutes are due

    call_command("workhorse_scheduler", "--once")

    ids = sorted(Job.objects.filter(job_type=TASK).values_list("id", flat=True))
    assert len(ids) == 1501
    first = ", ".join(map(str, ids[:10]))
    assert capsys.readouterr().out == f"1501 due tick(s), 1501 new job(s): {first} and 1,491 more\n"
