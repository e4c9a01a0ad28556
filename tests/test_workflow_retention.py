"""Retention of workflows and awaited results (decision 0022 §5, increment 8): a flagged result nobody
has read outlives its job's retention until its own ends; a workflow step is never pruned alone; a
workflow is pruned whole or not at all (a live step, a live key, a locked job or an unread result
keeps all of it); the cut-offs at their edges. Real PostgreSQL."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connections, transaction

from django_workhorse import EnqueueOptions, EnqueueRequest, Idempotency, sql
from django_workhorse.models import IdempotencyBinding, Job, JobDependency, JobEvent, JobStatus, Workflow
from django_workhorse.operations.maintenance import prune_finished_jobs, prune_finished_workflows, run_maintenance
from django_workhorse.workflows import Workflow as WorkflowDefinition
from tests.factories import JobFactory

LONG_AGO = datetime(2000, 1, 1, tzinfo=timezone.utc)
AN_HOUR_AGO = timedelta(hours=1)


def request(n: int = 1) -> EnqueueRequest:
    return EnqueueRequest("tests.record", {"n": n}, EnqueueOptions())


def diamond(key: str | None = None) -> tuple[int, dict[str, int]]:
    """a -> (b, c) -> d; returns the workflow's id and its steps' jobs."""
    wf = WorkflowDefinition("diamond", idempotency=Idempotency(key) if key else None)
    wf.add("a", request())
    wf.add("b", request(2), after="a")
    wf.add("c", request(3), after="a")
    wf.add("d", request(4), after=["b", "c"])
    result = wf.enqueue()
    return result.workflow_id, dict(result.jobs)


def finish(job_ids: list[int] | dict[str, int], at: datetime = LONG_AGO, status: str = JobStatus.SUCCEEDED) -> None:
    ids = list(job_ids.values()) if isinstance(job_ids, dict) else job_ids
    Job.objects.filter(pk__in=ids).update(status=status, finished_at=at, pending_parents=0)


def flag_awaited(job_id: int) -> None:
    """What a waiter's flag leaves on the row (the waiting API sets it; here a direct UPDATE)."""
    Job.objects.filter(pk=job_id).update(awaited=True)


def exists(workflow_id: int, jobs: dict[str, int]) -> tuple[bool, int]:
    """Whether the workflow row is there, and how many of its jobs are."""
    return Workflow.objects.filter(pk=workflow_id).exists(), Job.objects.filter(pk__in=jobs.values()).count()


# -- results someone waits for -----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_flagged_unread_result_outlives_its_jobs_retention_while_an_unflagged_job_of_its_age_goes():
    an_hour_ago = datetime.now(timezone.utc) - AN_HOUR_AGO
    awaited, plain = (JobFactory(status=JobStatus.SUCCEEDED, finished_at=an_hour_ago) for _ in range(2))
    flag_awaited(awaited.pk)

    assert prune_finished_jobs(older_than=timedelta(0)) == 1  # WORKHORSE_RESULT_RETENTION: 24 h

    assert list(Job.objects.values_list("id", flat=True)) == [awaited.pk]
    assert not Job.objects.filter(pk=plain.pk).exists()


@pytest.mark.django_db
def test_a_flagged_result_goes_once_its_result_retention_ended(settings):
    settings.WORKHORSE_RESULT_RETENTION = timedelta(minutes=30)
    an_hour_ago = datetime.now(timezone.utc) - AN_HOUR_AGO
    awaited = JobFactory(status=JobStatus.DEAD, finished_at=an_hour_ago)
    flag_awaited(awaited.pk)

    assert prune_finished_jobs(older_than=timedelta(0)) == 1
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_result_retention_longer_than_the_jobs_keeps_a_flagged_result_past_the_job_retention(settings):
    settings.WORKHORSE_JOB_RETENTION = timedelta(days=1)
    settings.WORKHORSE_RESULT_RETENTION = timedelta(days=30)
    ten_days_ago = datetime.now(timezone.utc) - timedelta(days=10)
    awaited, plain = (JobFactory(status=JobStatus.SUCCEEDED, finished_at=ten_days_ago) for _ in range(2))
    flag_awaited(awaited.pk)

    assert prune_finished_jobs() == 1
    assert list(Job.objects.values_list("id", flat=True)) == [awaited.pk]
    assert not Job.objects.filter(pk=plain.pk).exists()


@pytest.mark.django_db
def test_the_result_cut_off_keeps_a_result_finished_at_it_and_lets_one_a_microsecond_older_go():
    at = datetime(2020, 6, 1, 12, 0, tzinfo=timezone.utc)
    job = JobFactory(status=JobStatus.SUCCEEDED, finished_at=at)
    flag_awaited(job.pk)
    before = at + timedelta(days=1)

    kept = sql.housekeeping.prune_finished_jobs("default", before=before, results_before=at, limit=10)
    pruned = sql.housekeeping.prune_finished_jobs(
        "default", before=before, results_before=at + timedelta(microseconds=1), limit=10
    )

    assert (kept[0], pruned[0]) == (0, 1)


@pytest.mark.django_db
def test_the_job_cut_off_keeps_a_job_finished_at_it_and_prunes_one_finished_a_microsecond_before():
    at = datetime(2020, 6, 1, 12, 0, tzinfo=timezone.utc)
    JobFactory(status=JobStatus.SUCCEEDED, finished_at=at)

    kept = sql.housekeeping.prune_finished_jobs("default", before=at, results_before=at, limit=10)
    pruned = sql.housekeeping.prune_finished_jobs(
        "default", before=at + timedelta(microseconds=1), results_before=at, limit=10
    )

    assert (kept[0], pruned[0]) == (0, 1)


# -- workflows: whole or not at all --------------------------------------------------------------------


@pytest.mark.django_db
def test_a_finished_workflow_step_is_never_pruned_alone():
    workflow_id, jobs = diamond()
    finish(jobs)
    plain = JobFactory(status=JobStatus.SUCCEEDED, finished_at=LONG_AGO)

    assert prune_finished_jobs(older_than=timedelta(0)) == 1

    assert not Job.objects.filter(pk=plain.pk).exists()
    assert exists(workflow_id, jobs) == (True, 4)


@pytest.mark.django_db
def test_a_finished_workflow_is_pruned_whole_with_its_edges_and_history():
    workflow_id, jobs = diamond()
    finish(jobs)
    JobEvent.objects.create(job_id=jobs["d"], kind="succeeded", at=LONG_AGO)
    assert JobDependency.objects.count() == 4

    assert prune_finished_workflows(older_than=timedelta(0)) == 1

    assert exists(workflow_id, jobs) == (False, 0)
    assert not JobDependency.objects.exists() and not JobEvent.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("live", [JobStatus.WAITING, JobStatus.QUEUED, JobStatus.RUNNING])
def test_one_live_step_keeps_the_whole_workflow(live):
    workflow_id, jobs = diamond()
    finish({step: job for step, job in jobs.items() if step != "d"})
    Job.objects.filter(pk=jobs["d"]).update(status=live, pending_parents=1 if live == JobStatus.WAITING else 0)

    assert prune_finished_workflows(older_than=timedelta(0)) == 0
    assert exists(workflow_id, jobs) == (True, 4)

    finish([jobs["d"]])
    assert prune_finished_workflows(older_than=timedelta(0)) == 1
    assert exists(workflow_id, jobs) == (False, 0)


@pytest.mark.django_db
def test_a_live_key_keeps_the_whole_workflow_until_its_binding_expires():
    workflow_id, jobs = diamond(key="fulfil:7")
    finish(jobs)
    binding = IdempotencyBinding.objects.get()
    assert binding.expires_at > datetime.now(timezone.utc)

    assert prune_finished_workflows(older_than=timedelta(0)) == 0
    assert exists(workflow_id, jobs) == (True, 4)

    IdempotencyBinding.objects.update(expires_at=LONG_AGO)
    assert prune_finished_workflows(older_than=timedelta(0)) == 1
    assert exists(workflow_id, jobs) == (False, 0) and not IdempotencyBinding.objects.exists()


@pytest.mark.django_db
def test_a_steps_unread_result_keeps_the_whole_workflow_within_its_result_retention(settings):
    settings.WORKHORSE_RESULT_RETENTION = timedelta(hours=2)
    workflow_id, jobs = diamond()
    finish(jobs, at=datetime.now(timezone.utc) - AN_HOUR_AGO)
    flag_awaited(jobs["d"])

    assert prune_finished_workflows(older_than=timedelta(0)) == 0
    assert exists(workflow_id, jobs) == (True, 4)

    settings.WORKHORSE_RESULT_RETENTION = timedelta(minutes=30)
    assert prune_finished_workflows(older_than=timedelta(0)) == 1
    assert exists(workflow_id, jobs) == (False, 0)


@pytest.mark.django_db
def test_the_workflow_cut_off_is_its_last_steps_finish_to_the_microsecond():
    at = datetime(2020, 6, 1, 12, 0, tzinfo=timezone.utc)
    workflow_id, jobs = diamond()
    finish(jobs, at=at - timedelta(days=3))
    finish([jobs["d"]], at=at)  # the last to finish

    def prune(before: datetime) -> int:
        with transaction.atomic():
            locked, _ = sql.housekeeping.lock_finished_workflows("default", before=before, results_before=at, limit=10)
            return sql.housekeeping.delete_finished_workflows(
                "default", workflow_ids=locked, before=before, results_before=at
            )

    assert prune(at) == 0 and prune(at - timedelta(days=1)) == 0
    assert exists(workflow_id, jobs) == (True, 4)
    assert prune(at + timedelta(microseconds=1)) == 1
    assert exists(workflow_id, jobs) == (False, 0)


@pytest.mark.django_db
def test_a_redriven_steps_lineage_goes_with_its_workflow():
    from django_workhorse import redrive

    workflow_id, jobs = diamond()
    finish(jobs)
    finish([jobs["b"]], status=JobStatus.DEAD)
    copy = redrive(jobs["b"], request_id="r1")

    assert prune_finished_workflows(older_than=timedelta(0)) == 0  # the copy is queued

    finish([copy])
    assert prune_finished_workflows(older_than=timedelta(0)) == 1
    assert not Job.objects.filter(pk__in=[*jobs.values(), copy]).exists()
    assert not Workflow.objects.filter(pk=workflow_id).exists()


@pytest.mark.django_db
def test_chunks_walk_every_finished_workflow_once_and_leave_plain_jobs_to_their_own_prune():
    flows = [diamond() for _ in range(3)]
    for n, (_, jobs) in enumerate(flows):
        finish(jobs, at=LONG_AGO + timedelta(seconds=n))
    plain = JobFactory(status=JobStatus.SUCCEEDED, finished_at=LONG_AGO)

    assert prune_finished_workflows(older_than=timedelta(0), chunk=3) == 3

    assert not Workflow.objects.exists()
    assert list(Job.objects.values_list("id", flat=True)) == [plain.pk]


@pytest.mark.django_db
def test_run_maintenance_prunes_finished_workflows():
    workflow_id, jobs = diamond()
    finish(jobs)

    report = run_maintenance()

    assert (report.ran, report.finished_jobs, report.finished_workflows) == (True, 0, 1)
    assert exists(workflow_id, jobs) == (False, 0)


@pytest.mark.django_db(transaction=True)
def test_a_step_another_transaction_holds_keeps_its_workflow_and_the_prune_never_waits():
    workflow_id, jobs = diamond()
    finish(jobs)
    outcome: dict[str, object] = {}

    def prune_elsewhere() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SET lock_timeout = '5s'")
            outcome["deleted"] = prune_finished_workflows(older_than=timedelta(0))
        finally:
            connections.close_all()

    with transaction.atomic():
        Job.objects.select_for_update().get(pk=jobs["c"])
        thread = threading.Thread(target=prune_elsewhere)
        thread.start()
        thread.join(30)
        assert outcome == {"deleted": 0}  # returned while the lock was still held

    assert exists(workflow_id, jobs) == (True, 4)
    assert prune_finished_workflows(older_than=timedelta(0)) == 1
    assert exists(workflow_id, jobs) == (False, 0)
