"""``sql.outcomes.release_abandoned``: what a supervisor gives back for a child process that is gone,
against real PostgreSQL. Fenced by the claim: only the running jobs that child claimed last."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_workhorse import enqueue, sql
from django_workhorse.models import Job, JobEvent, JobStatus

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = timedelta(seconds=60)


def claim(worker: str, limit: int) -> list[int]:
    return [job.id for job in sql.claims.claim("default", queues=["default"], limit=limit, lease=LEASE, worker=worker)]


def test_a_gone_child_s_jobs_go_back_at_once_and_no_other_worker_s():
    for _ in range(4):
        enqueue("tests.record", {}, max_attempts=3)
    started, waiting = claim("sup/0.1", 2)
    others = claim("sup/1.2", 2)

    released = sql.outcomes.release_abandoned("default", "sup/0.1", [started], "exit -9")

    assert released == 2
    by_id = {job.id: job for job in Job.objects.all()}
    # Ready again at once; the started attempt counts, the one waiting in the child's batch does not.
    assert [(by_id[i].status, by_id[i].attempt, by_id[i].lease_token) for i in (started, waiting)] == [
        (JobStatus.QUEUED, 1, None),
        (JobStatus.QUEUED, 0, None),
    ]
    assert {by_id[i].status for i in others} == {JobStatus.RUNNING}
    details = JobEvent.objects.get(job_id=started, kind="released").details
    assert details == {"worker": "sup/0.1", "reason": "exit -9"}


def test_a_job_another_worker_claimed_since_is_not_released():
    job_id = enqueue("tests.record", {}, max_attempts=3)
    assert claim("sup/0.1", 1) == [job_id]
    # Its lease lapsed and another worker took it: the claim names that worker now.
    Job.objects.filter(pk=job_id).update(status=JobStatus.QUEUED, lease_token=None, lease_expires_at=None)
    assert claim("elsewhere", 1) == [job_id]

    assert sql.outcomes.release_abandoned("default", "sup/0.1", [job_id], "exit -9") == 0

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.claimed_by, job.attempt) == (JobStatus.RUNNING, "elsewhere", 2)


def test_a_started_job_on_its_last_attempt_ends_dead():
    job_id = enqueue("tests.record", {}, max_attempts=1)
    claim("sup/0.1", 1)

    assert sql.outcomes.release_abandoned("default", "sup/0.1", [job_id], "exit -9") == 1

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.last_error) == (JobStatus.DEAD, "its worker process was gone on the last attempt")
    assert list(JobEvent.objects.filter(job_id=job_id).values_list("kind", flat=True).order_by("id")) == [
        "claimed",
        "released",
        "dead",
    ]
