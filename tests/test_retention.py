"""Pruning finished jobs: a zero retention, the order chunks are taken in, workers never wait."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connections, transaction

from django_workhorse import Idempotency, enqueue, sql
from django_workhorse.models import Job, JobStatus
from django_workhorse.operations.maintenance import prune_finished_jobs
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_zero_retention_prunes_every_finished_job_not_the_default_window():
    just_now = datetime.now(timezone.utc) - timedelta(seconds=1)
    finished = JobFactory(status=JobStatus.SUCCEEDED, finished_at=just_now)
    queued = JobFactory(status=JobStatus.QUEUED)

    assert prune_finished_jobs(older_than=timedelta(0)) == 1

    assert list(Job.objects.values_list("id", flat=True)) == [queued.pk]
    assert not Job.objects.filter(pk=finished.pk).exists()


def test_chunks_follow_finished_at_then_id_and_pass_kept_jobs_over_once():
    long_ago = datetime(2000, 1, 1, tzinfo=timezone.utc)
    # Five jobs finished at one instant (a chunk boundary falls among them), two later ones.
    tied = [JobFactory(status=JobStatus.SUCCEEDED, finished_at=long_ago) for _ in range(5)]
    later = [JobFactory(status=JobStatus.DEAD, finished_at=long_ago + timedelta(seconds=s)) for s in (1, 2)]
    owner = Job.objects.get(pk=enqueue("t", {"n": 1}, idempotency=Idempotency("live")))
    Job.objects.filter(pk=owner.pk).update(status=JobStatus.SUCCEEDED, finished_at=long_ago)
    before = datetime.now(timezone.utc)

    deleted, cursor = sql.housekeeping.prune_finished_jobs("default", before=before, results_before=before, limit=3)
    first_three = sorted([*(job.pk for job in tied), owner.pk])[:3]
    assert cursor == sql.housekeeping.PruneCursor(long_ago, first_three[-1])
    assert deleted == len([pk for pk in first_three if pk != owner.pk])

    assert prune_finished_jobs(older_than=timedelta(0), chunk=3) == 7 - deleted
    assert list(Job.objects.values_list("id", flat=True)) == [owner.pk]  # its key is still live
    assert all(not Job.objects.filter(pk=job.pk).exists() for job in [*tied, *later])


def test_a_prune_skips_a_job_another_transaction_holds_and_never_waits_for_it():
    long_ago = datetime(2000, 1, 1, tzinfo=timezone.utc)
    held, free = (JobFactory(status=JobStatus.SUCCEEDED, finished_at=long_ago) for _ in range(2))
    outcome: dict[str, object] = {}

    def prune_elsewhere() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SET lock_timeout = '5s'")
            outcome["deleted"] = prune_finished_jobs(older_than=timedelta(0))
        finally:
            connections.close_all()

    with transaction.atomic():
        Job.objects.select_for_update().get(pk=held.pk)
        thread = threading.Thread(target=prune_elsewhere)
        thread.start()
        thread.join(30)
        assert outcome == {"deleted": 1}  # returned while the lock was still held

    assert list(Job.objects.values_list("id", flat=True)) == [held.pk]
    assert prune_finished_jobs(older_than=timedelta(0)) == 1
    assert not Job.objects.exists() and not Job.objects.filter(pk=free.pk).exists()


def test_the_job_table_is_vacuumed_by_dead_rows_not_by_its_size_and_always_cleans_its_indexes():
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = 'workhorse_job'::regclass")
        options = set(cursor.fetchone()[0])
    assert {
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=10000",
        "vacuum_index_cleanup=on",
    } <= options
