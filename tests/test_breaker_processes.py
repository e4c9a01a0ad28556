"""Canaries are exact across worker processes: a half-open breaker admits exactly ``probes`` jobs
among 3 worker processes of 4 threads each, then its canary's success closes it and every held job
runs exactly once."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from django_workhorse.models import Breaker as BreakerRow
from django_workhorse.models import Job, JobStatus
from tests.breaker_tasks import CANARY_BREAKER, PROBES, call_provider_with_canaries, provider
from tests.processes import WorkerProcess, worker_spawner
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
WORKER_MAIN = ROOT / "tests" / "worker_main.py"
COMMON = ("--poll-interval", "0.05", "--listen-database", "none", "--no-scheduler", "--concurrency", "4")
KEY = "tests.breaker.canary"
JOBS = 40


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    with worker_spawner(tmp_path, [sys.executable, str(WORKER_MAIN), *COMMON]) as start:
        yield start


def test_a_half_open_breaker_admits_exactly_probes_canaries_across_processes(spawn):
    with provider() as fake:
        fake.failing = False
        fake.gate.clear()  # canaries wait at the provider until the test has counted them
        ids = [call_provider_with_canaries.enqueue(fake.url, f"/job-{i}") for i in range(JOBS)]
        now = timezone.now()
        # Open, its cooldown already over: the next claims find it ready to go half-open.
        BreakerRow.objects.create(
            key=KEY,
            state="open",
            opened_at=now - timedelta(seconds=5),
            open_until=now - timedelta(seconds=1),
            cooldown=CANARY_BREAKER.cooldown,
            probes=CANARY_BREAKER.probes,
            policy=CANARY_BREAKER.to_json(),
            changed_at=now,
        )
        workers = [spawn() for _ in range(3)]

        # Every job but the canaries is held: each was a candidate of some claim, and refused.
        def held() -> int:
            return Job.objects.filter(pk__in=ids, status=JobStatus.QUEUED, held_since__isnull=False).count()

        wait_for(lambda: held() == JOBS - PROBES, 60, what="every job but the canaries to be held")
        wait_for(lambda: fake.count() == PROBES, 60, what="the canaries to call the provider")
        assert Job.objects.filter(pk__in=ids, status=JobStatus.RUNNING).count() == PROBES
        assert Job.objects.filter(pk__in=ids, attempt__gt=0).count() == PROBES
        row = BreakerRow.objects.get(key=KEY)
        assert (row.state, row.probes_admitted) == ("half_open", PROBES)
        assert fake.count() == PROBES

        fake.gate.set()  # the provider answers: a canary's success closes the breaker
        wait_for(
            lambda: Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == JOBS,
            90,
            what="every job to succeed",
        )
        for worker in workers:
            worker.terminate()
        for worker in workers:
            assert worker.wait() == 0, worker.output()
        assert fake.count() == JOBS
        for job in Job.objects.filter(pk__in=ids):
            assert job.attempt == 1
            assert fake.succeeded(job.payload["path"]) == 1
        row = BreakerRow.objects.get(key=KEY)
        assert row.state == "closed"
        assert [(t["from"], t["to"]) for t in row.transitions] == [("open", "half_open"), ("half_open", "closed")]
