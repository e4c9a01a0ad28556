"""Worker processes (``tests/worker_main.py``) killed and stopped by signals, against the test database.

Each worker is a real ``manage.py workhorse_worker`` process with the handlers of
``tests.worker_tasks``. A handler tells the test it runs by saving a checkpoint named "started";
the test then signals the process and reads the outcome from the database.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.utils import timezone

from django_workhorse import enqueue
from django_workhorse.models import Checkpoint, Job, JobEvent, JobStatus, WorkerRecord
from tests.processes import WorkerProcess, worker_spawner
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
WORKER_MAIN = ROOT / "tests" / "worker_main.py"
# Poll fast, and do not LISTEN: these tests are about signals and leases, not wake-ups.
COMMON = ("--poll-interval", "0.05", "--listen-database", "none")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``tests/worker_main.py`` with the given options; kill what is left at the end."""
    with worker_spawner(tmp_path, [sys.executable, str(WORKER_MAIN), *COMMON]) as start:
        yield start


def handler_started(job_id: int, attempt: int = 1) -> bool:
    return Checkpoint.objects.filter(job_id=job_id, name="started", attempt=attempt).exists()


def events(job_id: int) -> list[tuple[str, int]]:
    return list(JobEvent.objects.filter(job_id=job_id).order_by("id").values_list("kind", "attempt"))


def test_a_job_of_a_worker_killed_mid_job_is_completed_by_another_worker_after_the_lease(spawn):
    job_id = enqueue("tests.proc.block_on_first_attempt", {}, max_attempts=3)
    first = spawn("--lease", "2", "--max-jobs", "1")
    wait_for(lambda: handler_started(job_id), 60, what="the first worker to start the handler")

    first.popen.kill()
    assert first.wait() == -signal.SIGKILL
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.RUNNING, 1)

    # The second worker reclaims the job once the dead worker's lease has run out, and runs it.
    second = spawn("--lease", "2", "--max-jobs", "1")
    assert second.wait() == 0, second.output()

    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.SUCCEEDED, 2)
    assert job.result == {"attempt": 2, "started": {"pid": first.pid, "attempt": 1}}
    assert events(job_id) == [
        ("claimed", 1),
        ("checkpoint_saved", 1),
        ("lease_expired", 1),
        ("claimed", 2),
        ("succeeded", 2),
    ]
    # The killed worker could not deregister (maintenance forgets it); the clean one did.
    assert list(WorkerRecord.objects.values_list("pid", flat=True)) == [first.pid]
    claimers = list(JobEvent.objects.filter(job_id=job_id, kind="claimed").values_list("details__worker", flat=True))
    assert [f":{pid}:" in name for pid, name in zip((first.pid, second.pid), claimers, strict=True)] == [True, True]


def test_sigterm_lets_the_running_handler_finish(spawn):
    job_id = enqueue("tests.proc.finish_after_stop", {})
    worker = spawn("--lease", "30")  # runs until stopped
    wait_for(lambda: handler_started(job_id), 60, what="the worker to start the handler")

    worker.terminate()

    assert worker.wait() == 0, worker.output()
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.result) == (JobStatus.SUCCEEDED, 1, {"stop_seen": True})
    assert job.lease_token is None
    assert events(job_id) == [("claimed", 1), ("checkpoint_saved", 1), ("succeeded", 1)]
    assert "Claimed 1 job(s); finished: {'succeeded': 1}." in worker.output()


def test_sigterm_releases_a_job_still_running_after_the_drain_timeout(spawn):
    job_id = enqueue("tests.proc.until_cancelled", {}, max_attempts=3)
    worker = spawn("--lease", "300", "--drain-timeout", "0.2")
    wait_for(lambda: handler_started(job_id), 60, what="the worker to start the handler")

    worker.terminate()

    assert worker.wait() == 0, worker.output()
    job = Job.objects.get(pk=job_id)
    # Back in the queue at once, not after the 300 s lease.
    assert (job.status, job.attempt, job.lease_token, job.lease_expires_at) == (JobStatus.QUEUED, 1, None, None)
    assert job.run_at <= timezone.now()
    assert events(job_id) == [("claimed", 1), ("checkpoint_saved", 1), ("released", 1)]

    # So a worker started right away takes it (a burst worker finds no other ready job and exits).
    again = spawn("--burst", "--lease", "300")
    assert again.wait() == 0, again.output()
    job.refresh_from_db()
    assert (job.status, job.attempt, job.result) == (JobStatus.SUCCEEDED, 2, {"attempt": 2})
