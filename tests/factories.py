"""factory-boy factories for rows written directly, bypassing enqueue (for constraint and state tests)."""

from __future__ import annotations

import factory
from django.utils import timezone

from django_workhorse.models import Job, JobStatus, Workflow
from django_workhorse.tasks.retry import DEFAULT_RETRY_POLICY


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    job_type = "tests.noop"
    queue = "default"
    payload = factory.Sequence(lambda n: {"n": n})
    status = JobStatus.QUEUED
    priority = 0
    run_at = factory.LazyFunction(timezone.now)
    created_at = factory.LazyFunction(timezone.now)
    retry_policy = factory.LazyFunction(DEFAULT_RETRY_POLICY.to_json)


class WorkflowFactory(factory.django.DjangoModelFactory):
    """An unkeyed workflow row."""

    class Meta:
        model = Workflow

    name = "tests.flow"
    fingerprint = bytes(32)
    step_count = 2
    created_at = factory.LazyFunction(timezone.now)


class WaitingStepFactory(JobFactory):
    """A workflow step that waits for one parent (a new workflow unless one is given)."""

    status = JobStatus.WAITING
    workflow = factory.SubFactory(WorkflowFactory)
    step_name = factory.Sequence(lambda n: f"step-{n}")
    pending_parents = 1
