"""Jobs, their statuses, their history (events), checkpoints and redrives."""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.functions import Length

from django_workhorse import conf
from django_workhorse.enqueueing.key_lifetimes import TERMINAL_JOB_STATUSES
from django_workhorse.models.base import (
    CHECKPOINT_NAME_UNIQ,
    JOB_ATTEMPT_CHECK,
    JOB_BREAKER_HELD_IDX,
    JOB_BREAKER_KEY_CHECK,
    JOB_CHILD,
    JOB_CONCURRENCY_KEY_CHECK,
    JOB_CONCURRENCY_LIMIT_CHECK,
    JOB_CONCURRENCY_SLOT_UNIQ,
    JOB_DEAD_IDX,
    JOB_DEADLINE_CHECK,
    JOB_ENCRYPTED_IDX,
    JOB_FAIR_READY_IDX,
    JOB_FINISHED_IDX,
    JOB_LEASE_IDX,
    JOB_MAX_ATTEMPTS_CHECK,
    JOB_PENDING_PARENTS_CHECK,
    JOB_PRIORITY_CHECK,
    JOB_QUEUE_CHECK,
    JOB_READY_IDX,
    JOB_RUN_AT_CHECK,
    JOB_SNOOZES_CHECK,
    JOB_STATUS_CHECK,
    JOB_TAGS_CHECK,
    JOB_TYPE_CHECK,
    JOB_WAITING_CHECK,
    JOB_WAITING_IDX,
    JOB_WORKFLOW_IDX,
    JOB_WORKFLOW_STEP_CHECK,
    JOB_WORKFLOW_STEP_UNIQ,
    REDRIVE_REQUEST_UNIQ,
    octet_length,
    readable_instant,
)


class JobStatus(models.TextChoices):
    """Where a job is in its life. ``succeeded``, ``dead`` and ``cancelled`` are terminal; a
    ``waiting`` workflow step is not, but no worker claims it until its parents release it."""

    WAITING = "waiting"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = tuple(JobStatus(status) for status in TERMINAL_JOB_STATUSES)


class EventKind(models.TextChoices):
    """What a job event records."""

    ENQUEUED = "enqueued"
    CLAIMED = "claimed"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRY_SCHEDULED = "retry_scheduled"
    LEASE_EXPIRED = "lease_expired"
    DEAD = "dead"
    CANCELLED = "cancelled"
    REDRIVEN = "redriven"
    CHECKPOINT_SAVED = "checkpoint_saved"
    PURGED = "purged"
    RELEASED = "released"
    CANCEL_REQUESTED = "cancel_requested"
    REPLACED = "replaced"
    RUN_NOW = "run_now"
    KEY_RELEASED = "key_released"
    SNOOZED = "snoozed"  # the handler raised Snooze: back to queued, no attempt consumed
    HELD = "held"  # admission at claim deferred it (an open breaker, a spent rate budget): no attempt consumed
    READY = "ready"  # a workflow step's last parent released it: waiting -> queued (decision 0022)


class Job(models.Model):
    """A unit of work: a job type, a JSON payload and how to run it."""

    job_type = models.CharField(max_length=conf.MAX_JOB_TYPE_CHARS)
    queue = models.CharField(max_length=conf.MAX_QUEUE_CHARS, default="default")
    payload = models.JSONField(encoder=DjangoJSONEncoder, null=True)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    priority = models.SmallIntegerField(default=0, help_text="0..100, higher runs first.")
    run_at = models.DateTimeField()
    attempt = models.IntegerField(default=0, help_text="Attempts started so far.")
    max_attempts = models.SmallIntegerField(default=conf.DEFAULT_MAX_ATTEMPTS)
    retry_policy = models.JSONField()
    deadline = models.DateTimeField(null=True, blank=True)
    timeout = models.DurationField(null=True, blank=True)
    # NULL, not "", means "no key": the claim query groups by it.
    concurrency_key = models.CharField(max_length=conf.MAX_CONCURRENCY_KEY_BYTES, null=True, blank=True)  # noqa: DJ001
    concurrency_limit = models.SmallIntegerField(
        null=True, blank=True, help_text="How many jobs of this concurrency key may run at once."
    )
    # Which of the key's concurrency_limit slots a running job holds; the partial unique index on
    # (concurrency_key, concurrency_slot) over running jobs is what enforces the limit.
    concurrency_slot = models.SmallIntegerField(null=True, blank=True, editable=False)
    tags = models.JSONField(default=list, blank=True, help_text="Sorted, distinct strings.")
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(encoder=DjangoJSONEncoder, null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    claimed_by = models.CharField(max_length=255, blank=True, db_default="", help_text="The worker of the last claim.")
    cancel_requested = models.BooleanField(db_default=False, help_text="Asks a running handler to stop.")
    root_id = models.BigIntegerField(
        null=True, blank=True, help_text="The first job of a redrive lineage; its id is the handlers' idempotency key."
    )
    scheduled_for = models.DateTimeField(
        null=True, blank=True, help_text="The schedule tick this job runs for (handlers see ctx.scheduled_for)."
    )
    trace_context = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text="The W3C trace context (traceparent, tracestate) of the traced enqueue that created the job.",
    )
    snoozes = models.IntegerField(
        db_default=0, editable=False, help_text="Times its handler snoozed it (no attempt consumed)."
    )
    # The circuit breaker the job runs behind (a destination or its job type); NULL: none.
    breaker_key = models.CharField(  # noqa: DJ001
        max_length=conf.MAX_BREAKER_KEY_BYTES, null=True, blank=True, editable=False
    )
    # Set while admission at claim holds the job back (its breaker is open); cleared by its next claim.
    held_since = models.DateTimeField(null=True, blank=True, editable=False)
    # Admission at claim (issue 26): a named rate limit, its partition, and a fair queue's share key.
    rate_limit = models.CharField(  # noqa: DJ001
        max_length=conf.MAX_RATE_LIMIT_NAME_CHARS, null=True, blank=True, editable=False
    )
    rate_partition = models.CharField(  # noqa: DJ001
        max_length=conf.MAX_RATE_PARTITION_BYTES, null=True, blank=True, editable=False
    )
    partition_key = models.CharField(  # noqa: DJ001
        max_length=conf.MAX_PARTITION_KEY_BYTES, null=True, blank=True, editable=False
    )
    # Workflow steps (decision 0022): the workflow and the step's name, both NULL for a plain job. No
    # index of its own: the partial workflow indexes lead with it (and serve the cascade's lookup).
    workflow = models.ForeignKey(
        "workhorse.Workflow",
        on_delete=JOB_CHILD,
        null=True,
        blank=True,
        db_index=False,
        related_name="jobs",
        editable=False,
    )
    step_name = models.CharField(  # noqa: DJ001
        max_length=conf.MAX_STEP_NAME_CHARS, null=True, blank=True, editable=False
    )
    pending_parents = models.IntegerField(
        db_default=0, editable=False, help_text="Dependencies not yet satisfied; the step waits while it is above 0."
    )
    awaited = models.BooleanField(db_default=False, editable=False, help_text="A caller waits for its outcome.")
    # Payload encryption at rest (decision 0024): NULL for a clear job; 16 random bytes when its
    # payload, result, errors and checkpoints are envelopes (their associated data holds the salt).
    cipher_salt = models.BinaryField(
        null=True, blank=True, editable=False, help_text="Set when the job's values are encrypted (its salt)."
    )

    class Meta:
        db_table = "workhorse_job"
        # Operator actions, each its own permission (viewing needs only "view job").
        permissions = [
            ("cancel_job", "Can cancel jobs"),
            ("redrive_job", "Can redrive dead jobs"),
            ("purge_job", "Can purge queued jobs"),
            ("run_job_now", "Can run scheduled jobs now"),
            ("view_encrypted", "Can view encrypted values"),
        ]
        indexes = [
            # Matches the claim order exactly: queue, priority DESC, run_at, id.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_at",
                "id",
                name=JOB_READY_IDX,
                condition=models.Q(status=JobStatus.QUEUED),
            ),
            # Finds running jobs whose lease expired, for any worker to reclaim.
            models.Index(fields=["lease_expires_at"], name=JOB_LEASE_IDX, condition=models.Q(status=JobStatus.RUNNING)),
            # Finds finished jobs past the retention window, for maintenance to prune.
            models.Index(
                fields=["finished_at"], name=JOB_FINISHED_IDX, condition=models.Q(status__in=TERMINAL_STATUSES)
            ),
            # The dead letters alone: newest first (the dashboard's recent failures, the dead
            # letters page), and counted by queue from the index (the gauges) without reading
            # the finished history.
            models.Index(
                fields=["-finished_at", "-id"],
                include=["queue"],
                name=JOB_DEAD_IDX,
                condition=models.Q(status=JobStatus.DEAD),
            ),
            # A fair queue's ready jobs by partition key, each key in claim order: a loose index scan
            # finds the keys with ready work and the head of each.
            models.Index(
                "queue",
                "partition_key",
                models.F("priority").desc(),
                "run_at",
                "id",
                name=JOB_FAIR_READY_IDX,
                condition=models.Q(status=JobStatus.QUEUED, partition_key__isnull=False),
            ),
            # The jobs a circuit breaker holds back, to give them back at once when it closes.
            models.Index(
                fields=["breaker_key"],
                name=JOB_BREAKER_HELD_IDX,
                condition=models.Q(status=JobStatus.QUEUED, held_since__isnull=False),
            ),
            # Workflow steps only, so plain jobs never enter it: a step's jobs, its lineage's latest
            # (a redriven job joins it) the highest id.
            models.Index(
                fields=["workflow", "step_name", "id"],
                name=JOB_WORKFLOW_IDX,
                condition=models.Q(workflow__isnull=False),
            ),
            # Waiting steps by workflow (blocked workflows, without reading the history), covering the
            # queue so that the queue depths count them from the index alone.
            models.Index(
                fields=["workflow"],
                include=["queue"],
                name=JOB_WAITING_IDX,
                condition=models.Q(status=JobStatus.WAITING),
            ),
            # Encrypted jobs only (decision 0024), so clear jobs never enter it: check workhorse.W005
            # and workhorse_rekey's census read the encrypted jobs (and, through them, their events and
            # checkpoints) without reading a history of clear ones.
            models.Index(fields=["id"], name=JOB_ENCRYPTED_IDX, condition=models.Q(cipher_salt__isnull=False)),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(priority__gte=conf.MIN_PRIORITY, priority__lte=conf.MAX_PRIORITY),
                name=JOB_PRIORITY_CHECK,
            ),
            models.CheckConstraint(
                condition=models.Q(max_attempts__gte=conf.MIN_ATTEMPTS, max_attempts__lte=conf.MAX_ATTEMPTS),
                name=JOB_MAX_ATTEMPTS_CHECK,
            ),
            models.CheckConstraint(condition=models.Q(attempt__gte=0), name=JOB_ATTEMPT_CHECK),
            # A limit exactly when there is a key, within bounds.
            models.CheckConstraint(
                condition=models.Q(concurrency_key__isnull=True, concurrency_limit__isnull=True)
                | models.Q(
                    concurrency_key__isnull=False,
                    concurrency_limit__isnull=False,  # NULL >= 1 is unknown, which a CHECK lets through
                    concurrency_limit__gte=conf.MIN_CONCURRENCY_LIMIT,
                    concurrency_limit__lte=conf.MAX_CONCURRENCY_LIMIT,
                ),
                name=JOB_CONCURRENCY_LIMIT_CHECK,
            ),
            # At most concurrency_limit running jobs per key: each holds a distinct slot in 1..limit.
            models.UniqueConstraint(
                fields=["concurrency_key", "concurrency_slot"],
                name=JOB_CONCURRENCY_SLOT_UNIQ,
                condition=models.Q(status=JobStatus.RUNNING, concurrency_key__isnull=False),
            ),
            models.CheckConstraint(condition=models.Q(status__in=JobStatus.values), name=JOB_STATUS_CHECK),
            models.CheckConstraint(
                condition=models.lookups.LessThanOrEqual(
                    models.Func(models.F("tags"), function="jsonb_array_length", output_field=models.IntegerField()),
                    conf.MAX_TAGS,
                ),
                name=JOB_TAGS_CHECK,
            ),
            models.CheckConstraint(
                condition=models.lookups.GreaterThanOrEqual(Length("queue"), 1), name=JOB_QUEUE_CHECK
            ),
            models.CheckConstraint(
                condition=models.lookups.GreaterThanOrEqual(Length("job_type"), 1), name=JOB_TYPE_CHECK
            ),
            models.CheckConstraint(
                condition=models.lookups.LessThanOrEqual(
                    octet_length("concurrency_key"), conf.MAX_CONCURRENCY_KEY_BYTES
                ),
                name=JOB_CONCURRENCY_KEY_CHECK,
            ),
            # Instants Python can read back (PostgreSQL stores more): UTC years 1..9999.
            models.CheckConstraint(condition=readable_instant("run_at"), name=JOB_RUN_AT_CHECK),
            models.CheckConstraint(condition=readable_instant("deadline"), name=JOB_DEADLINE_CHECK),
            models.CheckConstraint(condition=models.Q(snoozes__gte=0), name=JOB_SNOOZES_CHECK),
            # A workflow step has both, a plain job neither.
            models.CheckConstraint(
                condition=models.Q(workflow__isnull=True, step_name__isnull=True)
                | models.Q(workflow__isnull=False, step_name__isnull=False),
                name=JOB_WORKFLOW_STEP_CHECK,
            ),
            models.CheckConstraint(
                condition=models.Q(pending_parents__gte=0, pending_parents__lte=conf.MAX_WORKFLOW_STEPS),
                name=JOB_PENDING_PARENTS_CHECK,
            ),
            # No waiting job that nothing can release.
            models.CheckConstraint(
                condition=~models.Q(status=JobStatus.WAITING) | models.Q(pending_parents__gt=0), name=JOB_WAITING_CHECK
            ),
            # One original job per step; redriven jobs (root_id set) join its lineage.
            models.UniqueConstraint(
                fields=["workflow", "step_name"],
                name=JOB_WORKFLOW_STEP_UNIQ,
                condition=models.Q(workflow__isnull=False, root_id__isnull=True),
            ),
            models.CheckConstraint(
                condition=models.lookups.LessThanOrEqual(octet_length("breaker_key"), conf.MAX_BREAKER_KEY_BYTES)
                & models.lookups.GreaterThanOrEqual(octet_length("breaker_key"), 1),
                name=JOB_BREAKER_KEY_CHECK,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_type} #{self.pk}"

    def enqueued_event(self, details: dict[str, object] | None = None) -> JobEvent:
        """The job's enqueue as an unsaved event at ``created_at``: the job row is its record, no
        event row is stored for it (decision 0013). Histories start with it."""
        return JobEvent(job=self, kind=EventKind.ENQUEUED, attempt=0, at=self.created_at, details=details or {})


class DeadJob(Job):
    """Dead jobs (dead letters), for their own admin page."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"


class Dashboard(Job):
    """The dashboard's entry in the admin index and side bar (its page is ``admin/dashboard.py``'s)."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"


class JobEvent(models.Model):
    """One transition in a job's history."""

    job = models.ForeignKey(Job, on_delete=JOB_CHILD, related_name="events")
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    attempt = models.IntegerField(default=0)
    at = models.DateTimeField()
    details = models.JSONField(encoder=DjangoJSONEncoder, default=dict, blank=True)

    class Meta:
        db_table = "workhorse_job_event"
        ordering = ["job", "id"]

    def __str__(self) -> str:
        return f"{self.kind} (job {self.job_id})"


class Checkpoint(models.Model):
    """The stored result of one named stage of a job, reused by its later attempts."""

    job = models.ForeignKey(Job, on_delete=JOB_CHILD, related_name="checkpoints")
    name = models.CharField(max_length=200)
    value = models.JSONField(encoder=DjangoJSONEncoder, null=True)
    attempt = models.IntegerField(help_text="The attempt that saved it.")
    created_at = models.DateTimeField()

    class Meta:
        db_table = "workhorse_checkpoint"
        constraints = [models.UniqueConstraint(fields=["job", "name"], name=CHECKPOINT_NAME_UNIQ)]

    def __str__(self) -> str:
        return f"{self.name} (job {self.job_id})"


class Redrive(models.Model):
    """A request to run a dead job again as a new job; one per (source job, request id)."""

    source = models.ForeignKey(Job, on_delete=JOB_CHILD, related_name="redrives")
    request_id = models.CharField(max_length=conf.MAX_REQUEST_ID_CHARS)
    new_job = models.ForeignKey(Job, on_delete=JOB_CHILD, related_name="redriven_from")
    requested_by = models.CharField(max_length=conf.MAX_REQUESTED_BY_CHARS, blank=True)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "workhorse_redrive"
        constraints = [models.UniqueConstraint(fields=["source", "request_id"], name=REDRIVE_REQUEST_UNIQ)]

    def __str__(self) -> str:
        return f"redrive of job {self.source_id} as {self.new_job_id}"
