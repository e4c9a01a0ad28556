"""The operator's numbers (stats.py) against real rows: depths, throughput, failures, workers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_workhorse.models import JOB_WAITING_IDX, JobStatus, WorkerRecord
from django_workhorse.operations import stats
from tests.factories import JobFactory, WaitingStepFactory

pytestmark = pytest.mark.django_db


def test_queue_depths_count_each_live_state_per_queue_and_the_oldest_ready_age():
    now = timezone.now()
    JobFactory(queue="a", run_at=now - timedelta(seconds=90))
    JobFactory(queue="a", run_at=now - timedelta(seconds=10))
    JobFactory(queue="a", run_at=now + timedelta(hours=1))
    JobFactory(queue="a", status=JobStatus.RUNNING, attempt=1)
    JobFactory(queue="b", status=JobStatus.DEAD, attempt=1, finished_at=now)
    JobFactory(queue="c", status=JobStatus.SUCCEEDED, attempt=1, finished_at=now)  # not live: no row
    WaitingStepFactory.create_batch(2, queue="a")
    WaitingStepFactory(queue="d")  # a queue with waiting steps only
    assert stats.queue_depths(now=now) == [
        stats.QueueDepth(
            queue="a", waiting=2, ready=2, scheduled=1, running=1, dead=0, oldest_ready_age=timedelta(seconds=90)
        ),
        stats.QueueDepth(queue="b", dead=1),
        stats.QueueDepth(queue="d", waiting=1),
    ]


HISTORY = """
INSERT INTO workhorse_job (job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
                           retry_policy, tags, created_at, finished_at, last_error)
SELECT 'tests.record', 'a', '{}', 'succeeded', 0, now(), 1, 25, '{}', '[]', now(), now(), ''
FROM generate_series(1, %s)
"""


def test_queue_depths_read_the_partial_indexes_and_never_the_finished_history():
    from django.db import connection

    # A fresh table, as a vacuumed one is: the tests before this one roll their inserts back,
    # which leaves the ready index bloated with dead entries (the planner then reads the table).
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workhorse_job CASCADE")
    now = timezone.now()
    JobFactory(queue="a", run_at=now - timedelta(seconds=5))
    JobFactory(queue="a", status=JobStatus.RUNNING, attempt=1, lease_expires_at=now + timedelta(minutes=5))
    JobFactory(queue="a", status=JobStatus.DEAD, attempt=1, finished_at=now)
    WaitingStepFactory(queue="a")
    with connection.cursor() as cursor:
        cursor.execute(HISTORY, [50_000])
        cursor.execute("ANALYZE workhorse_job")

    plan = stats.queue_depth_rows(now=now).explain()

    assert "Seq Scan on workhorse_job" not in plan, plan
    assert "workhorse_job_finished_idx" not in plan, plan
    for index in ("workhorse_job_ready_idx", "workhorse_job_lease_idx", "workhorse_job_dead_idx", JOB_WAITING_IDX):
        assert index in plan, plan
    assert stats.queue_depths(now=now) == [
        stats.QueueDepth(queue="a", waiting=1, ready=1, running=1, dead=1, oldest_ready_age=timedelta(seconds=5))
    ]
    # The dashboard's recent failures: the newest dead letters, from the same index.
    from django_workhorse.models import Job

    failures = Job.objects.filter(status=JobStatus.DEAD).order_by("-finished_at", "-id")[:10].explain()
    assert "workhorse_job_dead_idx" in failures and "Seq Scan" not in failures, failures


def test_throughput_counts_finished_jobs_per_minute_over_the_window():
    now = timezone.now().replace(second=30, microsecond=0)
    minute = now.replace(second=0)
    JobFactory(status=JobStatus.SUCCEEDED, finished_at=now)
    JobFactory(status=JobStatus.SUCCEEDED, finished_at=now - timedelta(minutes=2))
    JobFactory(status=JobStatus.DEAD, finished_at=now - timedelta(minutes=2))
    JobFactory(status=JobStatus.CANCELLED, finished_at=now)
    JobFactory(status=JobStatus.SUCCEEDED, finished_at=now - timedelta(minutes=61))  # outside
    result = stats.throughput(now=now, minutes=60)
    assert len(result.minutes) == 60 and result.minutes[-1] == minute
    assert (result.succeeded[-1], result.failed[-1]) == (1, 1)
    assert (result.succeeded[-3], result.failed[-3]) == (1, 1)
    assert result.total == 4


def test_recent_failures_are_dead_jobs_newest_first_with_the_head_of_their_error():
    now = timezone.now()
    old = JobFactory(status=JobStatus.DEAD, finished_at=now - timedelta(hours=1), last_error="old")
    new = JobFactory(status=JobStatus.DEAD, finished_at=now, last_error="x" * 3000)
    JobFactory(status=JobStatus.CANCELLED, finished_at=now)
    failures = stats.recent_failures(limit=10)
    assert [job.pk for job in failures] == [new.pk, old.pk]
    assert failures[0].error_head == "x" * stats.ERROR_HEAD_CHARS
    assert [job.pk for job in stats.recent_failures(limit=1)] == [new.pk]


def test_workers_list_the_jobs_each_is_running():
    now = timezone.now()
    for name in ("w2", "w1"):
        WorkerRecord.objects.create(
            name=name, host="h", pid=1, queues=["default"], concurrency=2, started_at=now, heartbeat_at=now
        )
    running = [JobFactory(status=JobStatus.RUNNING, attempt=1, claimed_by="w1") for _ in range(2)]
    JobFactory(status=JobStatus.SUCCEEDED, claimed_by="w1", finished_at=now)
    listed = stats.workers()
    assert [(w.name, w.running_job_ids) for w in listed] == [("w1", [job.pk for job in running]), ("w2", [])]


def test_failing_jobs_by_queue_counts_the_queued_jobs_waiting_for_a_retry():
    now = timezone.now()
    JobFactory(queue="a", attempt=1, last_error="ValueError: boom", run_at=now - timedelta(seconds=5))  # due
    JobFactory(queue="a", attempt=2, last_error="boom", run_at=now + timedelta(minutes=5))  # not yet
    JobFactory(queue="b", attempt=1, last_error="boom")
    JobFactory(queue="c")  # never ran
    JobFactory(queue="c", attempt=1)  # released without an error
    JobFactory(queue="c", status=JobStatus.RUNNING, attempt=2, last_error="boom")
    JobFactory(queue="c", status=JobStatus.DEAD, attempt=3, last_error="boom", finished_at=now)

    assert stats.failing_jobs_by_queue() == {"a": 2, "b": 1}
