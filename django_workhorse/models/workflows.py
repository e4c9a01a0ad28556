"""Workflows (decision 0022): a workflow row, whose steps are ordinary jobs (``Job.workflow``,
``Job.step_name``), and the dependency edges between those jobs."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Length

from django_workhorse import conf
from django_workhorse.enqueueing.fingerprints import key_digest
from django_workhorse.models.base import (
    DEPENDENCY_CHILD_PARENT_UNIQ,
    DEPENDENCY_NOT_SELF_CHECK,
    DEPENDENCY_PARENT_IDX,
    JOB_CHILD,
    WORKFLOW_FINGERPRINT_CHECK,
    WORKFLOW_KEY_CHECK,
    WORKFLOW_KEY_HASH_CHECK,
    WORKFLOW_NAME_CHECK,
    WORKFLOW_SCOPE_CHECK,
    WORKFLOW_STEP_COUNT_CHECK,
    key_hash_condition,
    octet_length,
    scope_condition,
)
from django_workhorse.models.jobs import Job


class Workflow(models.Model):
    """A graph of steps enqueued together: its name, the digest of its graph and, for a keyed
    workflow, a copy of its key (the binding, which names the workflow's first step, expires long
    before the workflow's jobs are pruned). ``workhorse_binding`` stays the one arbiter of keys: no
    unique constraint here, and a key reused after its binding expired makes a second workflow."""

    name = models.CharField(max_length=conf.MAX_WORKFLOW_NAME_CHARS)
    fingerprint = models.BinaryField(max_length=32, help_text="The SHA-256 of the graph.")
    # NULL, all three, for an unkeyed workflow.
    scope = models.CharField(max_length=conf.MAX_SCOPE_BYTES, null=True, blank=True)  # noqa: DJ001
    key_hash = models.BinaryField(max_length=32, null=True, blank=True)
    key_preview = models.CharField(max_length=16, null=True, blank=True)  # noqa: DJ001
    step_count = models.IntegerField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "workhorse_workflow"
        constraints = [
            models.CheckConstraint(
                condition=models.lookups.GreaterThanOrEqual(Length("name"), 1), name=WORKFLOW_NAME_CHECK
            ),
            models.CheckConstraint(
                condition=models.lookups.Exact(octet_length("fingerprint"), 32), name=WORKFLOW_FINGERPRINT_CHECK
            ),
            # A key is whole or absent.
            models.CheckConstraint(
                condition=models.Q(scope__isnull=True, key_hash__isnull=True, key_preview__isnull=True)
                | models.Q(scope__isnull=False, key_hash__isnull=False, key_preview__isnull=False),
                name=WORKFLOW_KEY_CHECK,
            ),
            models.CheckConstraint(condition=key_hash_condition(), name=WORKFLOW_KEY_HASH_CHECK),
            models.CheckConstraint(condition=scope_condition(), name=WORKFLOW_SCOPE_CHECK),
            models.CheckConstraint(
                condition=models.Q(step_count__gte=1, step_count__lte=conf.MAX_WORKFLOW_STEPS),
                name=WORKFLOW_STEP_COUNT_CHECK,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk}"

    @property
    def key_digest(self) -> str | None:
        """The 12-hex digest of the key, for display and search; None for an unkeyed workflow."""
        return None if self.key_hash is None else key_digest(bytes(self.key_hash))


class JobDependency(models.Model):
    """An edge of a workflow's graph: ``child`` waits for ``parent``. With ``allow_failure``, the
    parent's death satisfies the edge as its success does."""

    child = models.ForeignKey(Job, on_delete=JOB_CHILD, related_name="parent_edges", db_index=False)
    parent = models.ForeignKey(Job, on_delete=JOB_CHILD, related_name="child_edges", db_index=False)
    allow_failure = models.BooleanField(default=False)

    class Meta:
        db_table = "workhorse_job_dependency"
        verbose_name_plural = "job dependencies"
        constraints = [
            # A child's parents (its unique index leads with child_id).
            models.UniqueConstraint(fields=["child", "parent"], name=DEPENDENCY_CHILD_PARENT_UNIQ),
            models.CheckConstraint(condition=~models.Q(child=models.F("parent")), name=DEPENDENCY_NOT_SELF_CHECK),
        ]
        indexes = [
            # A parent's children, read by release without visiting the table (an index-only probe).
            models.Index(fields=["parent"], include=["child", "allow_failure"], name=DEPENDENCY_PARENT_IDX),
        ]

    def __str__(self) -> str:
        return f"job {self.child_id} after job {self.parent_id}"
