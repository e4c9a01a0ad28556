"""A fair queue across worker processes: tenant A enqueues 20,000 jobs, then tenant B 20; with 2
worker processes, B's last job starts before A's 200th (starts on the server's clock). An unfair
queue is the control: there B's jobs start after A's 20,000th."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from django_workhorse import EnqueueOptions, EnqueueRequest, enqueue_many
from django_workhorse.models import Job, JobStatus
from tests.processes import WorkerProcess, worker_spawner
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
WORKER_MAIN = ROOT / "tests" / "worker_main.py"
FAIR, PLAIN = "reports", "plain"
COMMON = (
    "--poll-interval", "0.05", "--listen-database", "none", "--no-scheduler", "--concurrency", "4",
    "--queues", f"{FAIR},{PLAIN}",
)  # fmt: skip
BATCH = 50  # the control's workers claim up to 50 at once, and hold up to 4 + 50 (their capacity)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    env = {"WORKHORSE_TEST_QUEUES": json.dumps({FAIR: {"fair": True}})}
    with worker_spawner(tmp_path, [sys.executable, str(WORKER_MAIN), *COMMON], env=env) as start:
        yield start


def enqueue_tenant(queue: str, tenant: str, count: int) -> list[int]:
    options = EnqueueOptions(queue=queue, partition_key=tenant)
    ids: list[int] = []
    for start in range(0, count, 1000):
        batch = [EnqueueRequest("tests.record", {"n": n}, options) for n in range(start, min(count, start + 1000))]
        ids.extend(result.job_id for result in enqueue_many(batch))
    return ids


def starts(ids: list[int]) -> list[object]:
    """The jobs' start instants (set by the claim from the server's clock), earliest first."""
    return sorted(Job.objects.filter(pk__in=ids, started_at__isnull=False).values_list("started_at", flat=True))


def stop(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        assert worker.wait() == 0, worker.output()


def test_a_small_tenant_is_not_starved_by_a_big_backlog_in_a_fair_queue(spawn):
    big = enqueue_tenant(FAIR, "tenant-a", 20_000)
    small = enqueue_tenant(FAIR, "tenant-b", 20)
    workers = [spawn(), spawn()]
    wait_for(
        lambda: (
            Job.objects.filter(pk__in=small, status=JobStatus.SUCCEEDED).count() == len(small)
            and len(starts(big)) >= 200
        ),
        60,
        what="tenant B's jobs to finish and 200 of tenant A's to start",
    )
    stop(workers)
    assert starts(small)[-1] < starts(big)[199]
    assert set(Job.objects.filter(pk__in=small).values_list("attempt", flat=True)) == {1}


def test_the_control_a_small_tenant_waits_behind_a_big_backlog_in_an_unfair_queue(spawn):
    big = enqueue_tenant(PLAIN, "tenant-a", 20_000)
    small = enqueue_tenant(PLAIN, "tenant-b", 20)
    # Workers without a fair queue, as they claim today: batches beyond their threads.
    workers = [spawn("--queues", PLAIN, "--batch", str(BATCH)) for _ in range(2)]
    wait_for(
        lambda: Job.objects.filter(pk__in=small, status=JobStatus.SUCCEEDED).count() == len(small),
        120,
        what="tenant B's jobs to finish",
    )
    stop(workers)
    # Claim order is run_at order; only the two workers' last claims of A's jobs may overlap B's first.
    assert starts(small)[0] > starts(big)[len(big) - 2 * (4 + BATCH) - 1]
