"""Statements that update several jobs lock them in id order, so two of them cannot deadlock.

Each test holds a lock on job 1 from one real connection while another connection runs a
statement over jobs given in descending id order ([2, 1]). Once that statement waits for job 1,
job 2 must still be free: a statement that locked in the order it was given (or the order a join
produced) would hold job 2 while waiting for job 1, the half of a deadlock it can form with any
statement that locks 1 and then 2.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.utils import timezone

from django_workhorse import EnqueueRequest, sql
from django_workhorse.models import Job, JobStatus
from django_workhorse.worker.execution import Outcome
from django_workhorse.workflows import Workflow
from tests.conftest import connect_directly
from tests.factories import JobFactory
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = timedelta(minutes=5)


def _running_jobs(count: int) -> list[sql.claims.ClaimedJob]:
    jobs = []
    for n in range(count):
        row = JobFactory(
            status=JobStatus.RUNNING,
            attempt=1,
            max_attempts=3,
            lease_token=uuid.uuid4(),
            lease_expires_at=timezone.now() + LEASE - timedelta(seconds=n),
            started_at=timezone.now(),
        )
        jobs.append(
            sql.claims.ClaimedJob(
                row.pk,
                row.job_type,
                row.queue,
                row.payload,
                1,
                3,
                row.retry_policy,
                None,
                None,
                row.lease_token,
                row.pk,
            )
        )
    _reverse_heap_order([job.id for job in jobs])
    return jobs


def _queued_later_jobs(count: int) -> list[int]:
    ids = [JobFactory(run_at=timezone.now() + timedelta(hours=1, seconds=-n)).pk for n in range(count)]
    _reverse_heap_order(ids)
    return ids


def _reverse_heap_order(ids: list[int]) -> None:
    # An updated row gets a new version at the end of the table: a sequential scan then meets
    # the higher ids first, as it does in a table with some history. (The callers also give the
    # higher ids the earlier lease expiry or run_at, so an index scan on those meets them first.)
    for job_id in sorted(ids, reverse=True)[1:]:
        Job.objects.filter(pk=job_id).update(priority=0)


class _Statement:
    """Runs one statement on its own thread and Django connection; knows that connection's pid."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.pid: int | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self._work = work
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            self.result = self._work()
        except BaseException as exc:  # reported by join()
            self.error = exc
        finally:
            connections.close_all()

    def start(self) -> _Statement:
        self._thread.start()
        return self

    def join(self) -> Any:
        self._thread.join(30)
        assert not self._thread.is_alive(), "the statement did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def _waits_for_a_lock(observer: psycopg.Connection[Any], statement: _Statement) -> bool:
    if statement.pid is None:
        return False
    row = observer.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [statement.pid]).fetchone()
    return bool(row and row[0])


@pytest.fixture
def holder() -> Iterator[psycopg.Connection[Any]]:
    """A connection in an open transaction, for holding row locks."""
    with connect_directly(autocommit=False) as conn:
        yield conn


def _assert_locks_in_id_order(holder: psycopg.Connection[Any], first: int, second: int, work: Callable[[], Any]) -> Any:
    assert first < second
    holder.execute("SELECT id FROM workhorse_job WHERE id = %s FOR UPDATE", [first])
    statement = _Statement(work).start()
    with connect_directly() as observer:
        wait_for(lambda: _waits_for_a_lock(observer, statement), 10, what="the statement to wait for the held job")
    try:
        # The statement waits for the lower id; it must not hold the higher one meanwhile.
        locked = holder.execute("SELECT id FROM workhorse_job WHERE id = %s FOR UPDATE NOWAIT", [second]).fetchall()
        assert locked == [(second,)]
    finally:
        holder.rollback()
    return statement.join()


def test_extend_leases_locks_in_id_order(holder):
    low, high = _running_jobs(2)

    alive = _assert_locks_in_id_order(
        holder, low.id, high.id, lambda: sql.claims.extend_leases("default", [high, low], LEASE)
    )

    assert alive == {low.id: False, high.id: False}


def test_record_outcomes_locks_in_id_order(holder):
    low, high = _running_jobs(2)
    outcomes = [Outcome(job, "succeeded", result_json="1", events=(("succeeded", {}),)) for job in (high, low)]

    recorded = _assert_locks_in_id_order(
        holder, low.id, high.id, lambda: sql.outcomes.record_outcomes("default", outcomes)
    )

    assert recorded == {low.id, high.id}
    assert set(Job.objects.values_list("status", flat=True)) == {JobStatus.SUCCEEDED}


def test_record_outcomes_releasing_locks_parents_and_children_in_one_id_order(holder):
    # Ids in creation order: the first workflow's parent, its child, then the second workflow's
    # root. Holding the child, the statement must wait there without holding the higher root: a
    # statement that locked the batch's jobs first and their children after would hold it.
    first = Workflow("first")
    first.add("parent", EnqueueRequest("tests.record", {}))
    first.add("child", EnqueueRequest("tests.record", {}), after=["parent"])
    parent, child = first.enqueue().jobs.values()
    second = Workflow("second")
    second.add("root", EnqueueRequest("tests.record", {}))
    (root,) = second.enqueue().jobs.values()
    claimed = {
        job.id: job for job in sql.claims.claim("default", queues=["default"], limit=10, lease=LEASE, worker="t")
    }
    assert parent < child < root and claimed.keys() == {parent, root}
    outcomes = [
        Outcome(claimed[job_id], "succeeded", result_json="1", events=(("succeeded", {}),)) for job_id in (root, parent)
    ]

    recorded, cancelled = _assert_locks_in_id_order(
        holder, child, root, lambda: sql.outcomes.record_outcomes_releasing("default", outcomes)
    )

    assert (recorded, cancelled) == ({parent, root}, [])
    assert dict(Job.objects.values_list("id", "status")) == {
        parent: JobStatus.SUCCEEDED, child: JobStatus.QUEUED, root: JobStatus.SUCCEEDED
    }  # fmt: skip


def test_release_locks_in_id_order(holder):
    low, high = _running_jobs(2)

    _assert_locks_in_id_order(
        holder, low.id, high.id, lambda: sql.outcomes.release("default", [(high, True), (low, True)])
    )

    assert set(Job.objects.values_list("status", flat=True)) == {JobStatus.QUEUED}


def test_run_now_locks_in_id_order(holder):
    low, high = _queued_later_jobs(2)

    moved = _assert_locks_in_id_order(
        holder, low, high, lambda: sql.actions.run_now("default", [high, low], "ops", "unused")
    )

    assert sorted(moved) == [low, high]


def test_reclaim_expired_skips_a_held_job_and_takes_the_others(holder):
    low, high = _running_jobs(2)
    Job.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    holder.execute("SELECT id FROM workhorse_job WHERE id = %s FOR UPDATE", [low.id])

    # SKIP LOCKED: it never waits for a row, so it cannot take part in a deadlock on job rows.
    assert sql.outcomes.reclaim_expired("default") == 1
    holder.rollback()

    assert dict(Job.objects.values_list("id", "status")) == {low.id: JobStatus.RUNNING, high.id: JobStatus.QUEUED}
