"""Waiting for results (decision 0022 §5): ``wait_for``, ``await_for``, ``EnqueueResult.wait`` and
``WorkflowResult.wait`` return a result or raise for it; a wait is woken by the notification that the
statement ending its job sends (only for jobs a wait flagged), survives the loss of its sessions,
and refuses to wait where it never could end. Real PostgreSQL, real worker threads.

Where a test must show that a wait was woken by the notification and not by polling, it makes the
poll intervals an hour long and reads the wake-ups the wait counted by source."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections, transaction
from psycopg import sql as pgsql

from django_workhorse import (
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    InvalidArgumentError,
    JobCancelledError,
    JobDoesNotExist,
    JobFailedError,
    WaitNotAllowedError,
    WaitTimeoutError,
    WorkhorseError,
    await_for,
    cancel,
    enqueue,
    enqueue_with_result,
    wait_for,
)
from django_workhorse import sql as workhorse_sql
from django_workhorse.awaiting import listener as listeners
from django_workhorse.awaiting import waiting
from django_workhorse.conf import app_settings
from django_workhorse.exceptions import WorkflowDoesNotExist
from django_workhorse.models import Job, JobStatus
from django_workhorse.tasks.registry import register
from django_workhorse.workflows import Workflow, WorkflowResult
from django_workhorse.workflows.operations import cancel_workflow
from example_project.devdb import restart_embedded_server
from tests.conftest import connect_directly
from tests.worker_tasks import make_worker, run_worker, running
from tests.worker_tasks import wait_for as poll_until

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent  # waits and workers run on other threads


@register("tests.awaiting.wait_on")
def wait_on(payload: dict[str, Any]) -> Any:
    """Wait for the job the payload names and return its result."""
    return wait_for(payload["job_id"], timeout=payload.get("timeout", 30))


@register("tests.awaiting.wait_on_workflow")
def wait_on_workflow(payload: dict[str, Any]) -> Any:
    """Wait for the workflow the payload names and return its result."""
    return WorkflowResult(payload["workflow_id"], EnqueueOutcome.ACCEPTED, {}).wait(30)


def request(job_type: str = "tests.record", payload: Any = None, *, max_attempts: int = 3, queue: str = "default"):
    return EnqueueRequest(job_type, {"n": 1} if payload is None else payload,
                          EnqueueOptions(max_attempts=max_attempts, queue=queue))  # fmt: skip


def dying(queue: str = "default") -> EnqueueRequest:
    return request("tests.always_fail", "boom", max_attempts=1, queue=queue)


def awaited(job_id: int) -> bool:
    return Job.objects.filter(pk=job_id, awaited=True).exists()


def awaited_directly(job_id: int) -> bool:
    """``awaited`` through a session of its own (for threads Django's connections are not closed on)."""
    with connect_directly() as conn:
        return bool(conn.execute("SELECT awaited FROM workhorse_job WHERE id = %s", [job_id]).fetchone()[0])


class Waiting:
    """A wait running on a thread: its result or error, and the wake-ups it counted by source."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.waiters: list[listeners.Waiter] = []
        self.reads: list[int] = []  # the job ids the waits read, in order (``slow_polls`` records them)
        self._call = call
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.value = self._call()
        except BaseException as exc:  # reported by result()
            self.error = exc
        finally:
            connections.close_all()

    def start(self) -> Waiting:
        self._thread.start()
        return self

    def result(self, timeout: float = 30) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the wait did not return"
        if self.error is not None:
            raise self.error
        return self.value

    def woken_by(self, source: str) -> int:
        return sum(waiter.sources.get(source, 0) for waiter in self.waiters)


@pytest.fixture
def slow_polls(monkeypatch) -> Callable[[Callable[[], Any]], Waiting]:
    """Polls an hour apart, so only a wake-up ends a wait; returns a starter of waits on threads
    that records the waiters they register."""
    monkeypatch.setattr(waiting, "POLL_SECONDS", 3600.0)
    monkeypatch.setattr(waiting, "DOWN_POLL_SECONDS", 3600.0)
    created: list[listeners.Waiter] = []
    plain = listeners.thread_waiter

    def recorded(event: threading.Event) -> listeners.Waiter:
        waiter = plain(event)
        created.append(waiter)
        return waiter

    monkeypatch.setattr(listeners, "thread_waiter", recorded)
    reads: list[int] = []
    plain_read = workhorse_sql.awaiting.read_job

    def recorded_read(alias: str, job_id: int) -> Any:
        found = plain_read(alias, job_id)
        reads.append(job_id)
        return found

    monkeypatch.setattr(workhorse_sql.awaiting, "read_job", recorded_read)

    def start(call: Callable[[], Any]) -> Waiting:
        handle = Waiting(call)
        handle.waiters, handle.reads = created, reads
        handle.start()
        # Notifications sent before LISTEN is in place are lost (the wait re-reads when it comes up,
        # a "connect" wake-up): a test that counts notifications acts only once it listens.
        poll_until(listeners.listener("default").up.is_set, what="the result listener")
        return handle

    return start


@pytest.fixture(autouse=True)
def _fresh_listener() -> Iterator[None]:
    yield
    listeners.listener("default").stop()


@pytest.fixture
def result_listener() -> Iterator[Callable[[float], list[str]]]:
    """LISTEN on the result channel from a session of its own; ``drain(timeout)`` returns payloads."""
    with connect_directly() as conn:
        conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(app_settings.RESULT_CHANNEL)))
        yield lambda timeout: [notice.payload for notice in conn.notifies(timeout=timeout)]


# -- where the listener listens ---------------------------------------------------------------------


def test_with_no_result_listener_a_wait_polls_and_nothing_listens(settings, monkeypatch):
    settings.WORKHORSE_RESULT_LISTEN_DATABASE = "none"
    monkeypatch.setattr(waiting, "DOWN_POLL_SECONDS", 0.05)
    connected = listeners.listener("default").connections
    job_id = enqueue("tests.record", {"n": 5})

    with running(make_worker()):
        assert wait_for(job_id, timeout=30) == {"n": 5}

    assert listeners.listener_for("default") is listeners.POLLING
    assert listeners.listener("default").connections == connected  # no LISTEN was opened for it


def test_a_wait_listens_on_the_alias_the_setting_names_and_reads_its_own(settings):
    settings.WORKHORSE_RESULT_LISTEN_DATABASE = "other"
    assert listeners.listener_for("default") is listeners.listener("other")
    settings.WORKHORSE_RESULT_LISTEN_DATABASE = None
    assert listeners.listener_for("default") is listeners.listener("default")


# -- results and errors -----------------------------------------------------------------------------


def test_wait_for_returns_the_result_and_reading_it_clears_the_flag():
    job_id = enqueue("tests.record", {"n": 7})

    with running(make_worker()):
        assert wait_for(job_id, timeout=30) == {"n": 7}

    assert not awaited(job_id)


def test_wait_for_raises_job_failed_error_for_a_dead_job_with_its_error():
    job_id = enqueue("tests.always_fail", "boom", max_attempts=1)

    with running(make_worker()), pytest.raises(JobFailedError) as caught:
        wait_for(job_id, timeout=30)

    error = caught.value
    dead = Job.objects.get(pk=job_id)
    assert (error.job_id, error.step, error.error) == (job_id, None, dead.last_error)
    assert str(error) == f"job {job_id} failed: {dead.last_error.splitlines()[0]}"
    assert dead.status == JobStatus.DEAD and not dead.awaited


def test_a_cancel_wakes_the_wait_which_raises_job_cancelled_error(slow_polls):
    job_id = enqueue("tests.record", {"n": 1})
    handle = slow_polls(lambda: wait_for(job_id, timeout=60))
    # Flagged, then read: a cancel committed between the two would end the wait at its read.
    poll_until(lambda: awaited(job_id) and handle.reads, what="the wait's flag and first read")

    cancel(job_id)

    with pytest.raises(JobCancelledError) as caught:
        handle.result()
    assert caught.value.job_id == job_id
    assert handle.woken_by("notify") == 1


def test_wait_for_raises_wait_timeout_error_and_leaves_the_job_flagged():
    job_id = enqueue("tests.record", {"n": 1})

    with pytest.raises(WaitTimeoutError) as caught:
        wait_for(job_id, timeout=timedelta(milliseconds=50))

    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, WorkhorseError)
    assert (caught.value.job_id, caught.value.timeout) == (job_id, 0.05)
    assert Job.objects.get(pk=job_id).status == JobStatus.QUEUED and awaited(job_id)


def test_wait_for_a_job_that_does_not_exist_raises_job_does_not_exist():
    with pytest.raises(JobDoesNotExist):
        wait_for(2**40, timeout=1)


@pytest.mark.parametrize("timeout", [-0.001, "1", None, True, float("nan"), 365 * 86400 + 1, timedelta(seconds=-1)])
def test_a_bad_timeout_names_the_field_and_its_bound(timeout):
    job_id = enqueue("tests.record", {"n": 1})

    with pytest.raises(InvalidArgumentError) as caught:
        wait_for(job_id, timeout=timeout)

    assert caught.value.field == "timeout"
    assert caught.value.bound == "a number of seconds (or a timedelta) in 0..31536000"
    assert not awaited(job_id)


@pytest.mark.parametrize("job_id", [0, -1, "1", 2**63])
def test_a_bad_job_id_names_the_field(job_id):
    with pytest.raises(InvalidArgumentError) as caught:
        wait_for(job_id, timeout=1)
    assert caught.value.field == "job_id"


def test_enqueue_result_wait_returns_the_result():
    result = enqueue_with_result("tests.record", {"n": 3})

    with running(make_worker()):
        assert result.wait(30) == {"n": 3}


def test_await_for_returns_the_result_woken_by_the_notification(monkeypatch):
    monkeypatch.setattr(waiting, "POLL_SECONDS", 3600.0)
    monkeypatch.setattr(waiting, "DOWN_POLL_SECONDS", 3600.0)
    job_id = enqueue("tests.record", {"n": 5})

    async def wait_while_a_worker_runs() -> Any:
        pending = asyncio.ensure_future(await_for(job_id, timeout=60))
        await asyncio.to_thread(poll_until, lambda: awaited_directly(job_id), what="the wait's flag")
        await asyncio.to_thread(run_worker)
        return await pending

    try:
        assert asyncio.run(wait_while_a_worker_runs()) == {"n": 5}
    finally:
        asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())
    assert not awaited(job_id)


# -- notifications ----------------------------------------------------------------------------------


def test_a_wait_is_woken_by_the_notification_of_its_job_not_by_polling(slow_polls):
    job_id = enqueue("tests.record", {"n": 2})
    handle = slow_polls(lambda: wait_for(job_id, timeout=60))
    # Flagged, then read: a job that ended between the two would end the wait at its read.
    poll_until(lambda: awaited(job_id) and handle.reads, what="the wait's flag and first read")

    run_worker()

    assert handle.result() == {"n": 2}
    assert handle.woken_by("notify") == 1


def test_only_jobs_a_wait_flagged_send_a_result_notification(result_listener):
    flagged, unflagged = enqueue("tests.record", {"n": 1}), enqueue("tests.record", {"n": 2})
    doomed, spared = enqueue("tests.record", {"n": 3}), enqueue("tests.record", {"n": 4})
    for job_id in (flagged, doomed):
        workhorse_sql.awaiting.flag_job("default", job_id)

    cancel(doomed)
    cancel(spared)
    run_worker()

    assert Job.objects.get(pk=unflagged).status == JobStatus.SUCCEEDED
    assert sorted(result_listener(1.0)) == sorted([str(flagged), str(doomed)])


def test_a_reclaimed_job_that_dies_notifies_its_wait(result_listener):
    job_id = enqueue("tests.record", {"n": 1}, max_attempts=1)
    workhorse_sql.awaiting.flag_job("default", job_id)
    workhorse_sql.claims.claim("default", queues=["default"], limit=1, lease=timedelta(seconds=30), worker="gone")
    Job.objects.filter(pk=job_id).update(lease_expires_at="2000-01-01T00:00:00Z")

    assert workhorse_sql.outcomes.reclaim_expired("default") == 1

    assert Job.objects.get(pk=job_id).status == JobStatus.DEAD
    assert result_listener(1.0) == [str(job_id)]


def test_a_wait_survives_the_loss_of_every_session_while_it_waits(slow_polls, other_connection):
    """The stand-in for a PostgreSQL restart: every session but the admin's is terminated (the
    listener's, the wait's, the test's) while the wait waits; the listener reconnects and wakes it,
    and the notification of the job's end, after that, returns its result."""
    job_id = enqueue("tests.record", {"n": 9})
    handle = slow_polls(lambda: wait_for(job_id, timeout=60))
    poll_until(lambda: awaited(job_id), what="the wait's flag")
    resident = listeners.listener("default")
    poll_until(resident.up.is_set, what="the listener")
    before = resident.connections
    connection.close()

    killed = other_connection.execute(
        "SELECT pid, pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    ).fetchall()
    assert resident.backend_pid in {pid for pid, ok in killed if ok}
    poll_until(lambda: resident.connections > before and resident.up.is_set(), what="the listener's reconnection")
    run_worker()

    assert handle.result() == {"n": 9}
    assert handle.woken_by("reconnect") >= 1 and handle.woken_by("notify") == 1


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")), reason="restarts the embedded server; DATABASE_URL's is not ours"
)
def test_a_wait_survives_a_restart_of_postgresql(slow_polls):
    """PostgreSQL itself restarts (fast shutdown) while the wait waits: the listener reconnects and
    wakes it, its read on the lost connection reconnects, and the notification of the job's end
    after the restart returns its result."""
    job_id = enqueue("tests.record", {"n": 11})
    handle = slow_polls(lambda: wait_for(job_id, timeout=120))
    poll_until(lambda: awaited(job_id), what="the wait's flag")
    resident = listeners.listener("default")
    before = resident.connections

    restart_embedded_server(ROOT)
    connections.close_all()  # this thread's sessions went with the server

    poll_until(lambda: resident.connections > before and resident.up.is_set(), timeout=60,
               what="the listener's reconnection")  # fmt: skip
    run_worker()

    assert handle.result(60) == {"n": 11}
    assert handle.woken_by("reconnect") >= 1 and handle.woken_by("notify") == 1


# -- guards -----------------------------------------------------------------------------------------


def test_a_handler_may_not_wait_on_its_own_queue_when_its_worker_runs_one_job_at_a_time():
    target = enqueue("tests.record", {"n": 1})
    waiter = enqueue("tests.awaiting.wait_on", {"job_id": target}, max_attempts=1)

    run_worker(concurrency=1)

    failed = Job.objects.get(pk=waiter)
    assert failed.status == JobStatus.DEAD
    assert failed.last_error.startswith(f"WaitNotAllowedError: cannot wait for job {target} inside a handler")


def test_a_handler_may_wait_on_its_own_queue_when_its_worker_runs_more_than_one_job():
    target = enqueue("tests.record", {"n": 4})
    waiter = enqueue("tests.awaiting.wait_on", {"job_id": target}, max_attempts=1)

    run_worker(concurrency=2)

    assert Job.objects.get(pk=waiter).result == {"n": 4}


def test_a_wait_inside_atomic_is_refused_unless_the_job_has_finished():
    finished = enqueue("tests.record", {"n": 2})
    run_worker()
    queued = enqueue("tests.record", {"n": 3})

    with transaction.atomic():
        with pytest.raises(WaitNotAllowedError, match="inside atomic"):
            wait_for(queued, timeout=5)
        assert wait_for(finished, timeout=5) == {"n": 2}

    assert not awaited(queued)


def test_a_handler_whose_awaited_job_is_cancelled_fails_and_is_not_cancelled():
    other = enqueue("tests.record", {"n": 1}, queue="elsewhere")
    waiter = enqueue("tests.awaiting.wait_on", {"job_id": other}, max_attempts=1)

    with running(make_worker(concurrency=1)):
        poll_until(lambda: awaited(other), what="the handler's wait")
        cancel(other)
        poll_until(lambda: Job.objects.get(pk=waiter).status == JobStatus.DEAD, what="the waiting job's end")

    failed = Job.objects.get(pk=waiter)
    assert failed.last_error.startswith(f"JobCancelledError: job {other} was cancelled"), failed.last_error


# -- workflows --------------------------------------------------------------------------------------


def diamond(b: EnqueueRequest | None = None) -> WorkflowResult:
    """a -> (b, c) -> d."""
    wf = Workflow("diamond")
    wf.add("a", request(payload={"step": "a"}))
    wf.add("b", b or request(payload={"step": "b"}), after="a")
    wf.add("c", request(payload={"step": "c"}), after="a")
    wf.add("d", request(payload={"step": "d"}), after=["b", "c"])
    return wf.enqueue()


def workflow_flagged(result: WorkflowResult) -> bool:
    return awaited(result.jobs["d"])


def test_workflow_wait_returns_every_step_result_once_it_succeeded(slow_polls):
    result = diamond()
    handle = slow_polls(lambda: result.wait(60))
    poll_until(lambda: workflow_flagged(result), what="the wait's flags")

    run_worker()

    assert handle.result() == {step: {"step": step} for step in "abcd"}
    assert handle.woken_by("notify") >= 1
    assert not Job.objects.filter(workflow_id=result.workflow_id, awaited=True).exists()


def test_workflow_wait_raises_naming_the_dead_step_as_soon_as_it_blocks_the_workflow(slow_polls):
    result = diamond(b=dying(queue="b"))
    handle = slow_polls(lambda: result.wait(60))
    poll_until(lambda: workflow_flagged(result), what="the wait's flags")

    run_worker(queues=["default"], max_jobs=1)  # a
    run_worker(queues=["b"])  # b dies; c, and so d, never run

    with pytest.raises(JobFailedError) as caught:
        handle.result()
    assert (caught.value.step, caught.value.job_id) == ("b", result.jobs["b"])
    assert Job.objects.get(pk=result.jobs["c"]).status == JobStatus.QUEUED


def test_workflow_wait_raises_job_cancelled_error_when_the_workflow_is_cancelled(slow_polls):
    result = diamond()
    handle = slow_polls(lambda: result.wait(60))
    poll_until(lambda: workflow_flagged(result), what="the wait's flags")

    cancel_workflow(result.workflow_id)

    with pytest.raises(JobCancelledError) as caught:
        handle.result()
    assert caught.value.job_id == result.jobs["a"]
    assert handle.woken_by("notify") >= 1


def test_workflow_wait_times_out_and_a_missing_workflow_raises():
    result = diamond()

    with pytest.raises(WaitTimeoutError) as caught:
        result.wait(0)
    assert caught.value.workflow_id == result.workflow_id

    with pytest.raises(WorkflowDoesNotExist):
        WorkflowResult(2**40, result.outcome, {}).wait(1)


def test_a_handler_may_not_wait_on_a_workflow_with_a_step_in_a_queue_its_one_at_a_time_worker_serves():
    result = diamond()
    waiter = enqueue("tests.awaiting.wait_on_workflow", {"workflow_id": result.workflow_id}, max_attempts=1,
                     queue="waiters")  # fmt: skip

    run_worker(queues=["waiters", "default"], concurrency=1)

    failed = Job.objects.get(pk=waiter)
    assert failed.status == JobStatus.DEAD
    expected = f"WaitNotAllowedError: cannot wait for workflow {result.workflow_id} inside a handler"
    assert failed.last_error.startswith(expected), failed.last_error
    assert not Job.objects.filter(workflow_id=result.workflow_id, awaited=True).exists()


def test_a_handler_may_wait_on_a_workflow_whose_queues_its_worker_does_not_serve():
    result = diamond()
    waiter = enqueue("tests.awaiting.wait_on_workflow", {"workflow_id": result.workflow_id}, max_attempts=1,
                     queue="waiters")  # fmt: skip

    with running(make_worker(queues=["waiters"], concurrency=1)):
        poll_until(lambda: workflow_flagged(result), what="the handler's wait")
        run_worker()
        poll_until(lambda: Job.objects.get(pk=waiter).status == JobStatus.SUCCEEDED, what="the waiting job's end")

    assert Job.objects.get(pk=waiter).result == {step: {"step": step} for step in "abcd"}


def test_a_workflow_wait_inside_atomic_is_refused_unless_the_workflow_has_finished():
    finished, pending = diamond(), diamond()
    Job.objects.filter(workflow_id=pending.workflow_id).update(queue="elsewhere")
    run_worker()

    with transaction.atomic():
        with pytest.raises(WaitNotAllowedError, match="inside atomic"):
            pending.wait(5)
        assert finished.wait(5) == {step: {"step": step} for step in "abcd"}


# -- kept until read -------------------------------------------------------------------------------


def test_a_result_whose_wait_timed_out_is_not_pruned_before_it_is_read_and_then_is():
    from django_workhorse.operations.maintenance import prune_finished_jobs

    waited, unwaited = enqueue("tests.record", {"n": 1}), enqueue("tests.record", {"n": 2})
    with pytest.raises(WaitTimeoutError):
        wait_for(waited, timeout=0.05)  # the caller gave up; its flag stays on the job
    assert awaited(waited)
    assert run_worker().finished == {"succeeded": 2}

    # Both finished; a job retention of zero would take both, but an unread awaited result stays.
    assert prune_finished_jobs(older_than=timedelta(0)) == 1
    assert list(Job.objects.values_list("id", flat=True)) == [waited]

    assert wait_for(waited, timeout=0) == {"n": 1}  # read: no longer kept for waits
    assert not awaited(waited)
    assert prune_finished_jobs(older_than=timedelta(0)) == 1
    assert not Job.objects.filter(pk__in=[waited, unwaited]).exists()
