"""Pruning finished jobs: a zero retention, the order chunks are taken in, workers never wait."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from django_workhorse.maintenance import prune_finished_jobs
from django_workhorse.models import Job, JobStatus
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_a_zero_retention_prunes_every_finished_job_not_the_default_window():
    just_now = datetime.now(timezone.utc) - timedelta(seconds=1)
    finished = JobFactory(status=JobStatus.SUCCEEDED, finished_at=just_now)
    queued = JobFactory(status=JobStatus.QUEUED)

    assert prune_finished_jobs(older_than=timedelta(0)) == 1

    assert list(Job.objects.values_list("id", flat=True)) == [queued.pk]
    assert not Job.objects.filter(pk=finished.pk).exists()
