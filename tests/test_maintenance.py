"""Purge releases keys at once; expired bindings are pruned; the maintenance command."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from django_workhorse import EnqueueOutcome, Idempotency, WorkhorseError, enqueue, enqueue_with_result, purge
from django_workhorse.models import IdempotencyBinding, Job, JobEvent, JobStatus
from django_workhorse.operations.maintenance import prune_expired_bindings, prune_finished_jobs, run_maintenance
from tests.conftest import maintenance_held_elsewhere
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

KEY = Idempotency("order:7", scope="orders")


def test_purge_deletes_queued_jobs_of_a_queue_and_releases_their_keys():
    purged = enqueue("t", {"n": 1}, queue="mail", idempotency=KEY)
    kept = enqueue("t", {"n": 2}, queue="other")

    assert purge(queue="mail") == 1

    assert list(Job.objects.values_list("id", flat=True)) == [kept]
    assert not IdempotencyBinding.objects.exists() and not JobEvent.objects.filter(job_id=purged).exists()
    again = enqueue_with_result("t", {"n": 1}, queue="mail", idempotency=KEY)
    assert again.outcome == EnqueueOutcome.ACCEPTED and again.job_id != purged


def test_purge_by_id_leaves_running_and_finished_jobs_alone():
    running = JobFactory(status=JobStatus.RUNNING)
    done = JobFactory(status=JobStatus.SUCCEEDED)
    queued = enqueue("t", {"n": 1})

    assert purge(job_ids=[running.pk, done.pk, queued]) == 1
    assert set(Job.objects.values_list("id", flat=True)) == {running.pk, done.pk}


def test_purge_without_a_filter_is_refused():
    enqueue("t", {"n": 1})
    with pytest.raises(WorkhorseError):
        purge()
    assert Job.objects.count() == 1


def test_prune_expired_bindings_deletes_only_expired_ones_and_keeps_their_jobs():
    expired_job = enqueue("t", {"n": 1}, idempotency=Idempotency("a"))
    live_job = enqueue("t", {"n": 2}, idempotency=Idempotency("b"))
    IdempotencyBinding.objects.filter(job_id=expired_job).update(expires_at=datetime(2000, 1, 1, tzinfo=timezone.utc))

    assert prune_expired_bindings(chunk=1) == 1

    assert list(IdempotencyBinding.objects.values_list("job_id", flat=True)) == [live_job]
    assert Job.objects.count() == 2


def test_key_is_free_again_once_its_ttl_has_passed():
    short = Idempotency("order:8", ttl=timedelta(milliseconds=1))
    first = enqueue("t", {"n": 1}, idempotency=short)
    expires_at = IdempotencyBinding.objects.get().expires_at
    _wait_for_database_clock_past(expires_at)

    again = enqueue_with_result("t", {"n": 1}, idempotency=short)

    assert again.outcome == EnqueueOutcome.ACCEPTED and again.job_id != first


def test_maintenance_command_prunes_expired_bindings():
    enqueue("t", {"n": 1}, idempotency=KEY)
    IdempotencyBinding.objects.update(expires_at=datetime(2000, 1, 1, tzinfo=timezone.utc))
    out = StringIO()
    call_command("workhorse_maintenance", stdout=out)
    assert out.getvalue().splitlines() == [
        "Pruned 1 expired binding(s).",
        "Reclaimed 0 job(s) with expired leases.",
        "Pruned 0 finished job(s).",
        "Pruned 0 finished workflow(s).",
        "Forgot 0 stale worker(s).",
        "Pruned 0 expired effect record(s).",
    ]
    assert not IdempotencyBinding.objects.exists()


def test_prune_finished_jobs_keeps_recent_unfinished_and_key_owning_jobs():
    long_ago = datetime(2000, 1, 1, tzinfo=timezone.utc)
    old = JobFactory(status=JobStatus.SUCCEEDED, finished_at=long_ago)
    JobEvent.objects.create(job=old, kind="succeeded", at=long_ago)
    recent = JobFactory(status=JobStatus.DEAD, finished_at=datetime.now(timezone.utc))
    queued = JobFactory(status=JobStatus.QUEUED)
    owner = Job.objects.get(pk=enqueue("t", {"n": 1}, idempotency=KEY))
    Job.objects.filter(pk=owner.pk).update(status=JobStatus.SUCCEEDED, finished_at=long_ago)

    assert prune_finished_jobs(chunk=1) == 1

    assert set(Job.objects.values_list("id", flat=True)) == {recent.pk, queued.pk, owner.pk}
    assert not JobEvent.objects.filter(job_id=old.pk).exists()


def test_run_maintenance_prunes_expired_bindings_before_the_jobs_they_point_to():
    long_ago = datetime(2000, 1, 1, tzinfo=timezone.utc)
    job_id = enqueue("t", {"n": 1}, idempotency=KEY)
    Job.objects.filter(pk=job_id).update(status=JobStatus.SUCCEEDED, finished_at=long_ago)
    IdempotencyBinding.objects.update(expires_at=long_ago)

    report = run_maintenance()

    assert (report.ran, report.expired_bindings, report.finished_jobs) == (True, 1, 1)
    assert not Job.objects.exists()


def test_run_maintenance_skips_while_another_session_holds_the_lease():
    enqueue("t", {"n": 1}, idempotency=KEY)
    IdempotencyBinding.objects.update(expires_at=datetime(2000, 1, 1, tzinfo=timezone.utc))

    with maintenance_held_elsewhere():
        assert run_maintenance().ran is False
    assert IdempotencyBinding.objects.count() == 1


def _wait_for_database_clock_past(moment: datetime, deadline: float = 10) -> None:
    until = time.monotonic() + deadline
    with connection.cursor() as cursor:
        while time.monotonic() < until:
            cursor.execute("SELECT clock_timestamp() > %s", [moment])
            if cursor.fetchone()[0]:
                return
            time.sleep(0.001)
    raise AssertionError("the database clock did not pass the expiry in time")


def test_purge_deletes_a_queued_job_with_checkpoints_and_a_redrive_lineage():
    from django_workhorse import redrive
    from django_workhorse.models import Checkpoint, Redrive

    dead = enqueue("tests.noop", {"n": 1})
    Job.objects.filter(pk=dead).update(status="dead")
    copy = redrive(dead, request_id="r1")
    Checkpoint.objects.create(
        job_id=copy, name="charge", value={"id": "ch_1"}, attempt=1, created_at=datetime.now(timezone.utc)
    )

    assert purge(job_ids=[copy]) == 1

    assert not Job.objects.filter(pk=copy).exists()
    assert (Checkpoint.objects.count(), Redrive.objects.count()) == (0, 0)
    assert Job.objects.get(pk=dead).status == "dead"
