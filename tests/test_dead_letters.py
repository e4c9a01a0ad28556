"""Dead letters and redrive; cancellation of queued and running jobs; stale worker records."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from django_workhorse import (
    JobDoesNotExist,
    JobNotDeadError,
    RedriveConflictError,
    RetryPolicy,
    cancel,
    enqueue,
    redrive,
)
from django_workhorse.models import Checkpoint, Job, JobEvent, JobStatus, Redrive, WorkerRecord
from django_workhorse.operations.maintenance import run_maintenance
from tests.worker_tasks import CALLS, make_worker, run_worker, running, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()


def dead_job(**options) -> Job:
    job_id = enqueue("tests.always_fail", {"n": 1}, max_attempts=1, **options)
    run_worker()
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.DEAD
    return job


def test_redrive_copies_the_dead_job_and_records_the_lineage():
    source = dead_job(
        queue="default",
        priority=7,
        tags=["a"],
        timeout=timedelta(seconds=9),
        deadline=datetime(2999, 1, 1, tzinfo=timezone.utc),
        retry_policy=RetryPolicy.fixed(timedelta(seconds=3)),
    )
    Checkpoint.objects.create(job=source, name="stage", value=1, attempt=1, created_at=source.created_at)
    before = Job.objects.values().get(pk=source.pk)

    new_id = redrive(source.pk, request_id="ticket-1", requested_by="alice", reason="fixed the bug")

    new = Job.objects.get(pk=new_id)
    copied = ("job_type", "queue", "payload", "priority", "tags", "max_attempts", "retry_policy", "timeout")
    assert {f: getattr(new, f) for f in copied} == {f: getattr(source, f) for f in copied}
    assert (new.status, new.attempt, new.deadline, new.root_id) == (JobStatus.QUEUED, 0, None, source.pk)
    assert not Checkpoint.objects.filter(job=new).exists()
    assert Job.objects.values().get(pk=source.pk) == before  # the dead letter is untouched
    lineage = Redrive.objects.get()
    assert (lineage.source_id, lineage.new_job_id, lineage.requested_by, lineage.reason) == (
        source.pk,
        new_id,
        "alice",
        "fixed the bug",
    )
    assert JobEvent.objects.filter(job=source, kind="redriven").count() == 1


def test_redrive_exact_repeat_returns_the_same_job_and_writes_nothing():
    source = dead_job()
    first = redrive(source.pk, request_id="r1", requested_by="alice", reason="why")
    jobs, events = Job.objects.count(), JobEvent.objects.count()

    assert redrive(source.pk, request_id="r1", requested_by="alice", reason="why") == first
    assert (Job.objects.count(), JobEvent.objects.count()) == (jobs, events)


def test_redrive_changed_repeat_raises_a_conflict_naming_the_fields():
    source = dead_job()
    first = redrive(source.pk, request_id="r1", requested_by="alice", reason="why")

    with pytest.raises(RedriveConflictError) as caught:
        redrive(source.pk, request_id="r1", requested_by="bob", reason="other")

    assert (caught.value.new_job_id, caught.value.conflicting_fields) == (first, ("requested_by", "reason"))
    assert Redrive.objects.count() == 1


def test_redrive_with_another_request_id_creates_another_job():
    source = dead_job()
    assert redrive(source.pk, request_id="r1") != redrive(source.pk, request_id="r2")


def test_redrive_refuses_a_job_that_is_not_dead_and_a_missing_one():
    queued = enqueue("tests.record", {"n": 1})
    with pytest.raises(JobNotDeadError):
        redrive(queued, request_id="r1")
    with pytest.raises(JobDoesNotExist):
        redrive(10**12, request_id="r1")
    assert not Redrive.objects.exists()


def test_redriven_job_runs_with_the_idempotency_key_of_its_lineage():
    source = dead_job()
    new_id = redrive(source.pk, request_id="r1")
    Job.objects.filter(pk=new_id).update(job_type="tests.record_ctx")
    CALLS.clear()

    run_worker()

    assert Job.objects.get(pk=new_id).status == JobStatus.SUCCEEDED
    assert [call["key"] for call in CALLS.items()] == [f"workhorse-job-{source.pk}"]


def test_cancel_a_queued_job_cancels_it_at_once():
    job_id = enqueue("tests.record", {"n": 1})

    assert cancel(job_id, requested_by="alice") == JobStatus.QUEUED

    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.CANCELLED and job.finished_at is not None
    assert JobEvent.objects.filter(job_id=job_id, kind="cancelled").get().details == {"requested_by": "alice"}
    run_worker()
    assert CALLS.items() == []


def test_cancel_a_running_job_asks_its_handler_to_stop():
    job_id = enqueue("tests.proc.until_cancelled", {})
    worker = make_worker(lease=timedelta(seconds=0.6))
    with running(worker):
        wait_for(lambda: Job.objects.filter(pk=job_id, status=JobStatus.RUNNING).exists(), what="the job to start")
        assert cancel(job_id) == JobStatus.RUNNING
        wait_for(lambda: Job.objects.get(pk=job_id).status == JobStatus.CANCELLED, what="the job to end cancelled")
    kinds = list(JobEvent.objects.filter(job_id=job_id).exclude(kind="checkpoint_saved").values_list("kind", flat=True))
    assert kinds == ["claimed", "cancel_requested", "cancelled"]


def test_cancel_leaves_a_finished_job_alone_and_refuses_a_missing_one():
    job_id = enqueue("tests.record", {"n": 1})
    run_worker()
    assert cancel(job_id) == JobStatus.SUCCEEDED
    assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED
    with pytest.raises(JobDoesNotExist):
        cancel(10**12)


def test_maintenance_forgets_workers_whose_heartbeat_is_stale():
    now = datetime.now(timezone.utc)
    fields = {"host": "h", "pid": 1, "queues": ["default"], "concurrency": 1, "started_at": now}
    WorkerRecord.objects.create(name="gone", heartbeat_at=now - timedelta(hours=1), **fields)
    WorkerRecord.objects.create(name="alive", heartbeat_at=now, **fields)

    assert run_maintenance().stale_workers == 1
    assert list(WorkerRecord.objects.values_list("name", flat=True)) == ["alive"]
