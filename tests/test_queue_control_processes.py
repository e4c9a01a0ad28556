"""A paused queue and three real worker processes (``tests/worker_main.py``).

The workers poll (no LISTEN) two queues; one is paused while they run. For five seconds each
worker demonstrably claims the other queue's jobs, so it polled, and none claims a paused job;
after the resume every paused job runs exactly once.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from django_workhorse import enqueue_many, pause_queue, resume_queue
from django_workhorse.models import Job, JobEvent, JobStatus, WorkerRecord
from django_workhorse.sql.actions import clock
from django_workhorse.types import EnqueueOptions, EnqueueRequest
from tests.processes import WorkerProcess, worker_spawner
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
WORKER_MAIN = ROOT / "tests" / "worker_main.py"
WORKERS = 3
HELD_JOBS = 30
# The property window the issue asks for: a paused queue stays unclaimed this long.
WINDOW_SECONDS = 5.0
FEED_SECONDS = 0.05


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    command = [sys.executable, str(WORKER_MAIN), "--poll-interval", "0.05", "--listen-database", "none"]
    with worker_spawner(tmp_path, command) as start:
        yield start


def requests(queue: str, count: int, start: int = 0) -> list[EnqueueRequest]:
    options = EnqueueOptions(queue=queue)
    return [EnqueueRequest("tests.record", {"n": start + i}, options) for i in range(count)]


def claimers_since(since: object, queue: str) -> set[str]:
    events = JobEvent.objects.filter(kind="claimed", at__gte=since, job__queue=queue)
    return set(events.values_list("details__worker", flat=True))


def test_three_workers_claim_nothing_of_a_paused_queue_for_five_seconds_then_run_it_once(spawn):
    workers = [spawn("--queues", "held,flow", "--concurrency", "2") for _ in range(WORKERS)]
    wait_for(lambda: WorkerRecord.objects.count() == WORKERS, 60, what="three workers to register")
    names = set(WorkerRecord.objects.values_list("name", flat=True))

    pause_queue("held", by="test")  # while they run: each obeys at its next claim
    held = [result.job_id for result in enqueue_many(requests("held", HELD_JOBS))]
    window_start = clock("default")
    fed, tick = 0, threading.Event()
    deadline = time.monotonic() + WINDOW_SECONDS
    while time.monotonic() < deadline:
        enqueue_many(requests("flow", WORKERS, fed))
        fed += WORKERS
        touched = Job.objects.filter(pk__in=held).exclude(status=JobStatus.QUEUED, attempt=0)
        assert list(touched.values_list("pk", "status")) == []
        tick.wait(FEED_SECONDS)
    window_end = clock("default")

    # Each worker claimed jobs of the other queue within the window: it polled, and passed the paused one by.
    assert claimers_since(window_start, "flow") == names
    assert not JobEvent.objects.filter(job_id__in=held).exists()
    assert JobEvent.objects.filter(kind="claimed", at__lte=window_end, job__queue="flow").count() > WORKERS

    resume_queue("held", by="test")
    wait_for(
        lambda: Job.objects.filter(queue="held", status=JobStatus.SUCCEEDED).count() == HELD_JOBS,
        60,
        what="every held job to run after the resume",
    )
    wait_for(lambda: not Job.objects.exclude(status=JobStatus.SUCCEEDED).exists(), 60, what="the flow jobs to finish")

    assert set(Job.objects.filter(pk__in=held).values_list("attempt", flat=True)) == {1}
    claims = JobEvent.objects.filter(job_id__in=held, kind="claimed")
    assert sorted(claims.values_list("job_id", flat=True)) == sorted(held)  # each exactly once
    for worker in workers:
        worker.terminate()
    for worker in workers:
        assert worker.wait() == 0, worker.output()
