"""A rolling deploy across worker processes (decision 0021, "Capability"): an old worker without the
handler of X beside a new one with it, 500 jobs of X and 500 of Y. No X job fails or uses an attempt
on the old worker; with the old worker alone, the X jobs wait and are reported."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from django_workhorse import EnqueueRequest, enqueue_many
from django_workhorse.models import Job, JobEvent, JobStatus, WorkerRecord
from django_workhorse.operations import stats
from tests.deploy_tasks import X, Y
from tests.processes import WorkerProcess, worker_spawner
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
WORKER_MAIN = ROOT / "tests" / "worker_main.py"
COMMON = (
    "--poll-interval",
    "0.05",
    "--listen-database",
    "none",
    "--no-scheduler",
    "--concurrency",
    "2",
    "--batch",
    "10",
)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """``spawn(version, *options)``: a worker process running the ``version`` of ``tests.deploy_tasks``."""
    command = [sys.executable, str(WORKER_MAIN), *COMMON]
    with ExitStack() as stack:
        starters = {
            version: stack.enter_context(worker_spawner(folder, command, env={"WORKHORSE_TEST_DEPLOY": version}))
            for version in ("old", "new")
            if (folder := tmp_path / version).mkdir() is None
        }
        yield lambda version, *options: starters[version](*options)


def enqueue_jobs(job_type: str, count: int) -> list[int]:
    return [result.job_id for result in enqueue_many([EnqueueRequest(job_type, {"n": n}) for n in range(count)])]


def claimed_by(job_ids: list[int]) -> set[int]:
    """The pids of the workers that claimed the jobs (a worker's name is host:pid:random)."""
    names = JobEvent.objects.filter(job_id__in=job_ids, kind="claimed").values_list("details__worker", flat=True)
    return {int(name.split(":")[-2]) for name in set(names)}


def test_old_and_new_worker_processes_run_every_job_once_and_no_x_on_the_old_one(spawn):
    xs, ys = enqueue_jobs(X, 500), enqueue_jobs(Y, 500)

    old, new = spawn("old", "--burst"), spawn("new", "--burst")

    assert old.wait(120) == 0, old.output()
    assert new.wait(120) == 0, new.output()
    assert set(Job.objects.filter(pk__in=xs + ys).values_list("status", "attempt")) == {(JobStatus.SUCCEEDED, 1)}
    assert claimed_by(xs) == {new.pid}
    assert not JobEvent.objects.filter(job_id__in=xs, kind__in=["failed", "retry_scheduled", "dead"]).exists()


def test_with_the_old_worker_process_alone_x_jobs_wait_and_are_reported(spawn):
    xs, ys = enqueue_jobs(X, 500), enqueue_jobs(Y, 500)

    old = spawn("old")
    wait_for(lambda: Job.objects.filter(pk__in=ys, status=JobStatus.SUCCEEDED).count() == 500, timeout=120)
    [row] = WorkerRecord.objects.filter(pid=old.pid)
    assert X not in row.job_types and Y in row.job_types
    assert [(f.queue, f.job_type, f.jobs) for f in stats.jobs_without_handler()] == [("default", X, 500)]
    old.terminate()
    assert old.wait() == 0, old.output()

    assert set(Job.objects.filter(pk__in=xs).values_list("status", "attempt")) == {(JobStatus.QUEUED, 0)}
    assert not JobEvent.objects.filter(job_id__in=xs, kind="claimed").exists()
