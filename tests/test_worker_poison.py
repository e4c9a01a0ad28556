"""Outcomes PostgreSQL cannot store fail their own attempt only, and no worker thread dies of one.

Each test runs a real worker (burst mode, in this process or as a ``manage.py workhorse_worker``
subprocess) over a poison job and a good job claimed in the same batch: the poison job ends
retried or dead with a readable error, the good job succeeds exactly once, the worker exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from django_workhorse import RetryPolicy, enqueue
from django_workhorse import sql as workhorse_sql
from django_workhorse.exceptions import WorkerThreadError
from django_workhorse.models import Job, JobEvent, JobStatus, WorkerRecord
from django_workhorse.worker import recording
from tests.conftest import connect_directly
from tests.processes import WorkerProcess, subprocess_database_url
from tests.worker_tasks import CALLS, GATE, WorkerThread, make_worker, run_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
NEVER_SOON = RetryPolicy.fixed(timedelta(hours=1))
TEXT_BOUND = "must be text without NUL characters or lone surrogates"

# kind: the start of the error stored for it.
POISONS = {
    "surrogate_result": f"ResultNotStorable: result['a'] {TEXT_BOUND}",
    "nul_result": f"ResultNotStorable: result['a'][1] {TEXT_BOUND}",
    "nul_key_result": f"ResultNotStorable: result['bad\\x00key'] {TEXT_BOUND}",
    "unserializable_result": "ResultNotStorable: result must be JSON-serializable",
    "nan_result": "ResultNotStorable: result must be JSON-serializable",
    "deep_result": "ResultNotStorable: result must be JSON nested at most 100 deep",
    "nul_error": "RuntimeError: bad\\x00text\n",
    "surrogate_error": "RuntimeError: bad\\udc80text\n",
    "unprintable_error": "UnprintableError: UnprintableError('hidden')\n",
    "not_text_error": "NotTextError: <unprintable NotTextError>\n",
    "bad_checkpoint": f"CheckpointNotStorableError: checkpoint['stage']['a'] {TEXT_BOUND}",
    "bad_checkpoint_name": f"CheckpointNotStorableError: checkpoint name {TEXT_BOUND}",
}


@pytest.fixture(autouse=True)
def _fresh_calls() -> Iterator[None]:
    CALLS.clear()
    GATE.reset()
    yield
    GATE.reset()
    CALLS.clear()


def enqueue_pair(kind: str, *, max_attempts: int = 1, **payload: Any) -> tuple[int, int]:
    """A poison job and a good job behind it, claimed together by a worker with batch=2."""
    poison = enqueue("tests.poison", {"kind": kind, **payload}, priority=1, max_attempts=max_attempts,
                     retry_policy=NEVER_SOON)  # fmt: skip
    good = enqueue("tests.poison", {"kind": "good"})
    return poison, good


def assert_good_job_succeeded_once(good: int) -> None:
    job = Job.objects.get(pk=good)
    assert (job.status, job.attempt, job.result) == (JobStatus.SUCCEEDED, 1, {"kind": "good"})
    assert [call for call in CALLS.items() if call[0] == "good"] == [("good", 1)]


def failed_details(job_id: int) -> dict[str, Any]:
    details: dict[str, Any] = JobEvent.objects.get(job_id=job_id, kind="failed").details
    return details


@pytest.mark.parametrize("kind", list(POISONS))
def test_a_poison_outcome_kills_its_own_attempt_only(kind):
    poison, good = enqueue_pair(kind)

    stats = run_worker(concurrency=2, batch=2, timeout=30)

    assert stats.claimed == 2 and stats.failed_threads == []
    assert stats.finished == {"dead": 1, "succeeded": 1}
    job = Job.objects.get(pk=poison)
    assert (job.status, job.attempt, job.result, job.lease_token) == (JobStatus.DEAD, 1, None, None)
    assert job.last_error.startswith(POISONS[kind]), job.last_error
    assert failed_details(poison)["error"].startswith(POISONS[kind].rstrip("\n"))
    assert_good_job_succeeded_once(good)


def test_a_poison_outcome_with_attempts_left_is_retried():
    poison, good = enqueue_pair("surrogate_result", max_attempts=3)

    stats = run_worker(concurrency=2, batch=2, timeout=30)

    assert stats.finished == {"queued": 1, "succeeded": 1}
    job = Job.objects.get(pk=poison)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 1)
    assert job.last_error.startswith(POISONS["surrogate_result"])
    assert_good_job_succeeded_once(good)


@override_settings(WORKHORSE_MAX_RESULT_BYTES=1024)
@pytest.mark.parametrize(("size", "status"), [(1024, JobStatus.SUCCEEDED), (1025, JobStatus.DEAD)])
def test_a_result_is_stored_up_to_the_bound_and_fails_one_byte_over(size, status):
    poison, good = enqueue_pair("big_result", bytes=size)

    run_worker(concurrency=2, batch=2, timeout=30)

    job = Job.objects.get(pk=poison)
    assert job.status == status
    if status == JobStatus.SUCCEEDED:
        assert job.result == "x" * (size - 2)
    else:
        assert job.last_error == "ResultNotStorable: result must be at most 1024 bytes serialized, got '1025 bytes'"
    assert_good_job_succeeded_once(good)


def test_a_burst_worker_process_exits_after_poison_outcomes(tmp_path):
    jobs = [enqueue_pair(kind) for kind in ("surrogate_result", "unprintable_error", "nul_error")]
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "worker_main.py"), "--burst", "--concurrency", "2", "--batch", "2",
             "--poll-interval", "0.05", "--listen-database", "none"],
            cwd=ROOT, env=env, stdout=out, stderr=out,
        )  # fmt: skip
    worker = WorkerProcess(popen, log)

    assert worker.wait(60) == 0, worker.output()

    for poison, good in jobs:
        assert Job.objects.get(pk=poison).status == JobStatus.DEAD
        assert Job.objects.get(pk=good).status == JobStatus.SUCCEEDED
    assert "Claimed 6 job(s); finished: {'dead': 3, 'succeeded': 3}" in worker.output()


# -- a write PostgreSQL refuses ------------------------------------------------------------------------

# What the worker checks in Python covers everything known to make PostgreSQL refuse an outcome,
# so a refusal is injected at the SQL boundary: a trigger that raises for jobs marked in their
# payload. The worker sees a real PostgreSQL error from its real statement.
REFUSE_TRIGGER = """
CREATE FUNCTION workhorse_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'running' AND NEW.status <> 'running' AND (
        NEW.payload->>'refuse' = 'always' OR (NEW.payload->>'refuse' = 'success' AND NEW.status = 'succeeded')
    ) THEN
        RAISE EXCEPTION 'test trigger refuses this outcome';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER workhorse_test_refuse BEFORE UPDATE ON workhorse_job
FOR EACH ROW EXECUTE FUNCTION workhorse_test_refuse();
"""
DROP_REFUSE_TRIGGER = """
DROP TRIGGER IF EXISTS workhorse_test_refuse ON workhorse_job;
DROP FUNCTION IF EXISTS workhorse_test_refuse();
"""


@pytest.fixture
def refusing_trigger() -> Iterator[Callable[[], None]]:
    """Install the refusing trigger; yield a function that drops it (also dropped at the end)."""

    def drop() -> None:
        with connection.cursor() as cursor:
            cursor.execute(DROP_REFUSE_TRIGGER)

    with connection.cursor() as cursor:
        cursor.execute(REFUSE_TRIGGER)
    yield drop
    drop()


def _recorder_waits(observer: psycopg.Connection[Any]) -> bool:
    fragment = "(o->>'token')::uuid"
    assert fragment in workhorse_sql.outcomes.RECORD_OUTCOMES
    row = observer.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
        "AND strpos(query, %s) > 0",
        [fragment],
    ).fetchone()
    return bool(row and row[0])


def test_a_batch_write_refused_for_one_outcome_is_written_one_by_one(refusing_trigger):
    blocker = enqueue("tests.gated", {"label": "blocker"}, priority=2)
    guilty = enqueue("tests.gated", {"label": "guilty", "refuse": "success"}, priority=1, max_attempts=1)
    good = enqueue("tests.gated", {"label": "good"})
    worker = make_worker(burst=True, concurrency=3, batch=3, lease=timedelta(minutes=30))
    handle = WorkerThread(worker).start()
    with connect_directly(autocommit=False) as holder, connect_directly() as observer:
        # The recorder writes the blocker's outcome alone and waits for the row lock held here,
        # while the other two outcomes queue up behind it: they are written as one batch.
        wait_for(lambda: GATE.entered("blocker"), what="the blocker's handler")
        holder.execute("SELECT id FROM workhorse_job WHERE id = %s FOR UPDATE", [blocker])
        GATE.let_out("blocker")
        wait_for(lambda: _recorder_waits(observer), what="the recorder to wait for the blocker's row")
        GATE.let_out("guilty")
        GATE.let_out("good")
        wait_for(lambda: worker._outcomes.qsize() == 2, what="both outcomes to queue behind the blocker")
        holder.rollback()
    stats = handle.join(30)

    assert stats.finished == {"succeeded": 2, "dead": 1}
    jobs = {job.pk: job for job in Job.objects.all()}
    assert (jobs[blocker].status, jobs[good].status) == (JobStatus.SUCCEEDED, JobStatus.SUCCEEDED)
    assert (jobs[guilty].status, jobs[guilty].result) == (JobStatus.DEAD, None)
    assert jobs[guilty].last_error.startswith("OutcomeNotStorable: the succeeded outcome could not be written: ")
    assert "test trigger refuses this outcome" in jobs[guilty].last_error
    assert failed_details(guilty)["exception_class"].endswith("Error")


def test_an_outcome_that_cannot_be_written_at_all_lets_its_lease_lapse(refusing_trigger):
    guilty = enqueue("tests.poison", {"kind": "good", "refuse": "always"}, priority=1, max_attempts=2)
    good = enqueue("tests.poison", {"kind": "good"})

    stats = run_worker(concurrency=2, batch=2, lease=timedelta(seconds=1), timeout=30)

    # The worker gave the job up: no one extends its lease, which runs out.
    assert stats.finished == {"unrecorded": 1, "succeeded": 1}
    assert Job.objects.get(pk=good).status == JobStatus.SUCCEEDED
    with connection.cursor() as cursor:

        def lapsed() -> bool:
            cursor.execute("SELECT lease_expires_at < clock_timestamp() FROM workhorse_job WHERE id = %s", [guilty])
            return bool(cursor.fetchone()[0])

        wait_for(lapsed, 10, what="the lease of the given-up job to run out")
    refusing_trigger()

    stats = run_worker(timeout=30)

    assert stats.finished == {"succeeded": 1}
    job = Job.objects.get(pk=guilty)
    assert (job.status, job.attempt) == (JobStatus.SUCCEEDED, 2)
    assert [kind for kind, _ in JobEvent.objects.filter(job_id=guilty).order_by("id").values_list("kind", "attempt")] == [
        "claimed", "lease_expired", "claimed", "succeeded"
    ]  # fmt: skip


# -- heartbeats and supervised threads -------------------------------------------------------------------


def test_the_heartbeat_does_not_extend_the_lease_of_a_job_whose_handler_ended(monkeypatch):
    # The recorder is held back in Python (its real write runs afterwards), so the job stays
    # held with its handler ended for as many heartbeats as the test watches.
    release = threading.Event()
    real_record = recording.record

    def held_back_record(alias: str, outcomes: Any) -> list[str]:
        assert release.wait(30)
        return real_record(alias, outcomes)

    monkeypatch.setattr(recording, "record", held_back_record)
    job_id = enqueue("tests.poison", {"kind": "good"})
    worker = make_worker(burst=True, lease=timedelta(seconds=1))
    handle = WorkerThread(worker).start()
    try:
        wait_for(lambda: CALLS.items(), what="the handler to run")
        wait_for(lambda: all(h.ended for h in worker._held.values()), what="the handler to end")
        ended_expiry = Job.objects.values_list("lease_expires_at", flat=True).get(pk=job_id)
        beats = WorkerRecord.objects.values_list("heartbeat_at", flat=True).get(name=worker.name)
        # Two more worker heartbeats (each runs right after the lease extension of its round).
        for _ in range(2):
            beats = wait_for(
                lambda b=beats: (h := WorkerRecord.objects.values_list("heartbeat_at", flat=True).get(
                    name=worker.name)) > b and h,
                10, what="a heartbeat",
            )  # fmt: skip
        assert Job.objects.values_list("lease_expires_at", flat=True).get(pk=job_id) == ended_expiry
    finally:
        release.set()
    handle.join(30)
    # Its lease may have run out meanwhile (then it was reclaimed and ran again): either way it ends.
    assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED


def join_worker_threads() -> None:
    """Wait for the threads a stopped worker left running (a handler finishing after the drain)."""
    for thread in threading.enumerate():
        if thread.name.startswith("workhorse-"):
            thread.join(30)
            assert not thread.is_alive(), thread.name


class ThreadCrash(BaseException):
    """Escapes every ``except Exception`` in the worker: a stand-in for an unforeseen bug."""


def test_a_worker_whose_thread_died_releases_its_jobs_and_fails(monkeypatch):
    # Injected at the Python boundary: the heartbeat thread dies while a handler runs.
    def crash(alias: str, name: str) -> None:
        raise ThreadCrash("heartbeat bug")

    monkeypatch.setattr(workhorse_sql.housekeeping, "touch_worker", crash)
    job_id = enqueue("tests.wait_for_cancel", {"seconds": 30}, max_attempts=3)
    worker = make_worker(lease=timedelta(seconds=1), drain_timeout=timedelta(milliseconds=100))
    handle = WorkerThread(worker).start()

    with pytest.raises(WorkerThreadError, match="heartbeat"):
        handle.join(30)
    join_worker_threads()

    # The drain gave it back to the queue at once (its started attempt counts).
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.lease_token) == (JobStatus.QUEUED, 1, None)


def test_the_worker_command_exits_non_zero_when_a_worker_thread_died(monkeypatch):
    def crash(alias: str, name: str) -> None:
        raise ThreadCrash("heartbeat bug")

    monkeypatch.setattr(workhorse_sql.housekeeping, "touch_worker", crash)
    enqueue("tests.wait_for_cancel", {"seconds": 30})

    with pytest.raises(CommandError, match="heartbeat") as raised:
        call_command(
            "workhorse_worker", "--burst", "--lease", "1", "--drain-timeout", "0.1", "--poll-interval", "0.05",
            "--listen-database", "none", verbosity=0,
        )  # fmt: skip

    assert raised.value.returncode == 1
    join_worker_threads()
