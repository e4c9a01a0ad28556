"""Rate limits are exact across worker processes: 3 processes of 8 threads each never start more
than the limit's attempts in any window of its period, on PostgreSQL's clock, and every job runs
once, on its first attempt."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import override_settings

from django_workhorse import RateLimit, enqueue_many
from django_workhorse.models import Job, JobStatus, RateBudget
from django_workhorse.types import EnqueueOptions, EnqueueRequest
from tests import rate_tasks
from tests.processes import WorkerProcess, worker_spawner
from tests.test_rate_limits import within_bound
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
WORKER_MAIN = ROOT / "tests" / "worker_main.py"
COMMON = ("--poll-interval", "0.05", "--listen-database", "none", "--no-scheduler", "--concurrency", "8")
SECOND = timedelta(seconds=1)
# name -> (limit, per in seconds, burst, partitioned), as worker_main reads them.
LIMITS = {"tests.stripe": (20, 1.0, 0, False), "tests.accounts": (10, 1.0, 0, True)}


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    env = {"WORKHORSE_TEST_RATE_LIMITS": json.dumps(LIMITS)}
    with worker_spawner(tmp_path, [sys.executable, str(WORKER_MAIN), *COMMON], env=env) as start:
        yield start


@pytest.fixture(autouse=True)
def _limits() -> Iterator[None]:
    limits = {
        name: RateLimit(n, per=timedelta(seconds=per), burst=b, partitioned=p)
        for name, (n, per, b, p) in LIMITS.items()
    }
    with override_settings(WORKHORSE_RATE_LIMITS=limits):
        rate_tasks.create_start_table()
        yield


def _run(spawn: Callable[..., WorkerProcess], ids: list[int], timeout: float) -> list[tuple]:
    workers = [spawn() for _ in range(3)]
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == len(ids),
        timeout,
        what="every job to succeed",
    )
    for worker in workers:
        worker.terminate()
    for worker in workers:
        assert worker.wait() == 0, worker.output()
    starts = rate_tasks.starts()
    assert sorted(job_id for job_id, *_ in starts) == sorted(ids)  # each job started once
    assert {attempt for _, attempt, *_ in starts} == {1}  # holds consumed no attempt
    assert all(recorded >= started for _, _, started, recorded in starts)
    return starts


def test_three_processes_never_start_more_than_20_in_any_second(spawn):
    requests = [
        EnqueueRequest(rate_tasks.RECORD, {"n": i}, EnqueueOptions(rate_limit="tests.stripe")) for i in range(400)
    ]
    ids = [result.job_id for result in enqueue_many(requests)]
    starts = _run(spawn, ids, 120)
    started = [started for _, _, started, _ in starts]
    assert within_bound(started, SECOND, 20)
    assert started[-1] - started[0] >= timedelta(seconds=19)
    budget = RateBudget.objects.get(name="tests.stripe", partition="")
    assert budget.admitted == 400


def test_each_of_5_partitions_never_starts_more_than_10_in_any_second(spawn):
    partitions = [f"acct-{p}" for p in range(5)]
    requests = [
        EnqueueRequest(rate_tasks.RECORD, {"n": i}, EnqueueOptions(rate_limit="tests.accounts", rate_partition=p))
        for i in range(40)
        for p in partitions
    ]
    ids = [result.job_id for result in enqueue_many(requests)]
    starts = _run(spawn, ids, 120)
    partition_of = dict(Job.objects.filter(pk__in=ids).values_list("id", "rate_partition"))
    for p in partitions:
        started = [started for job_id, _, started, _ in starts if partition_of[job_id] == p]
        assert len(started) == 40
        assert within_bound(started, SECOND, 10)
        assert started[-1] - started[0] >= timedelta(seconds=3.9)
    assert sorted(RateBudget.objects.filter(name="tests.accounts").values_list("admitted", flat=True)) == [40] * 5
