"""Jobs, the bindings that give keyed requests their owner, the job history and the effect ledger.

Constraint and index names are module constants: ``enqueue_api.py`` and the ``sql`` package refer to them, so
a rename cannot silently break the code that translates their violations.
"""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.functions import Length

from django_workhorse import conf
from django_workhorse.enqueueing.fingerprints import key_digest
from django_workhorse.enqueueing.key_lifetimes import TERMINAL_JOB_STATUSES
from django_workhorse.querysets import BindingQuerySet
from django_workhorse.types import KeyMode

JOB_READY_IDX = "workhorse_job_ready_idx"
JOB_LEASE_IDX = "workhorse_job_lease_idx"
JOB_FINISHED_IDX = "workhorse_job_finished_idx"
JOB_DEAD_IDX = "workhorse_job_dead_idx"
WORKER_NAME_UNIQ = "workhorse_worker_name_uniq"
CHECKPOINT_NAME_UNIQ = "workhorse_checkpoint_job_name_uniq"
REDRIVE_REQUEST_UNIQ = "workhorse_redrive_source_request_uniq"
JOB_PRIORITY_CHECK = "workhorse_job_priority_check"
JOB_MAX_ATTEMPTS_CHECK = "workhorse_job_max_attempts_check"
JOB_ATTEMPT_CHECK = "workhorse_job_attempt_check"
JOB_STATUS_CHECK = "workhorse_job_status_check"
JOB_TAGS_CHECK = "workhorse_job_tags_check"
JOB_QUEUE_CHECK = "workhorse_job_queue_check"
JOB_TYPE_CHECK = "workhorse_job_type_check"
JOB_CONCURRENCY_KEY_CHECK = "workhorse_job_concurrency_key_check"
JOB_RUN_AT_CHECK = "workhorse_job_run_at_check"
JOB_DEADLINE_CHECK = "workhorse_job_deadline_check"
BINDING_KEY_UNIQ = "workhorse_binding_scope_key_hash_uniq"
BINDING_EXPIRES_IDX = "workhorse_binding_expires_idx"
BINDING_KEY_HASH_CHECK = "workhorse_binding_key_hash_check"
BINDING_SCOPE_CHECK = "workhorse_binding_scope_check"
BINDING_MODE_CHECK = "workhorse_binding_mode_check"
JOB_CONCURRENCY_SLOT_UNIQ = "workhorse_job_concurrency_slot_uniq"
JOB_CONCURRENCY_LIMIT_CHECK = "workhorse_job_concurrency_limit_check"
EFFECT_KEY_UNIQ = "workhorse_effect_scope_key_hash_uniq"
EFFECT_EXPIRES_IDX = "workhorse_effect_expires_idx"
EFFECT_KEY_HASH_CHECK = "workhorse_effect_key_hash_check"
EFFECT_SCOPE_CHECK = "workhorse_effect_scope_check"
SCHEDULE_NAME_UNIQ = "workhorse_schedule_name_uniq"
SCHEDULE_EVENT_REQUEST_UNIQ = "workhorse_schedule_event_request_uniq"
# The identity sequence PostgreSQL creates for workhorse_job.id; enqueue draws ids from it
# before inserting so that a binding and its job can be written in one statement.
JOB_ID_SEQUENCE = "workhorse_job_id_seq"
# How a job's children (bindings, events, checkpoints, redrive records) reference it. The database
# deletes them with the job (ON DELETE CASCADE, set by migration 0007, since Django 5.2 cannot declare
# it), so purge and prune delete only jobs and ``Job.objects.filter(...).delete()`` is one DELETE:
# DO_NOTHING keeps the ORM from collecting and deleting the children itself.
JOB_CHILD = models.DO_NOTHING


def _octet_length(field: str) -> models.Func:
    return models.Func(models.F(field), function="octet_length", output_field=models.IntegerField())


def _readable_instant(field: str) -> models.Q:
    return models.Q(**{f"{field}__gte": conf.MIN_STORED_DATETIME, f"{field}__lte": conf.MAX_STORED_DATETIME})


class JobStatus(models.TextChoices):
    """Where a job is in its life. ``succeeded``, ``dead`` and ``cancelled`` are terminal."""

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

    class Meta:
        db_table = "workhorse_job"
        # Operator actions, each its own permission (viewing needs only "view job").
        permissions = [
            ("cancel_job", "Can cancel jobs"),
            ("redrive_job", "Can redrive dead jobs"),
            ("purge_job", "Can purge queued jobs"),
            ("run_job_now", "Can run scheduled jobs now"),
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
                    _octet_length("concurrency_key"), conf.MAX_CONCURRENCY_KEY_BYTES
                ),
                name=JOB_CONCURRENCY_KEY_CHECK,
            ),
            # Instants Python can read back (PostgreSQL stores more): UTC years 1..9999.
            models.CheckConstraint(condition=_readable_instant("run_at"), name=JOB_RUN_AT_CHECK),
            models.CheckConstraint(condition=_readable_instant("deadline"), name=JOB_DEADLINE_CHECK),
        ]

    def __str__(self) -> str:
        return f"{self.job_type} #{self.pk}"

    def enqueued_event(self, details: dict[str, object] | None = None) -> JobEvent:
        """The job's enqueue as an unsaved event at ``created_at``: the job row is its record, no
        event row is stored for it (decision 0013). Histories start with it."""
        return JobEvent(job=self, kind=EventKind.ENQUEUED, attempt=0, at=self.created_at, details=details or {})


class HashedKey(models.Model):
    """A scoped key stored only as its SHA-256 (``fingerprint.key_hash``), a bounded preview and,
    derived from the hash, a digest: the columns, checks and display shared by bindings and effects.

    Each model declares its own ``expires_at`` (a unique key's binding has none; an effect always
    has one) and passes its constraint and index names to ``hashed_key_constraints`` and
    ``hashed_key_indexes``, so the schema keeps the names the sql package refers to.
    """

    scope = models.CharField(max_length=conf.MAX_SCOPE_BYTES)
    key_hash = models.BinaryField(max_length=32)
    key_preview = models.CharField(max_length=16)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.scope}:{self.key_preview} [{self.key_digest}]"

    @property
    def key_digest(self) -> str:
        """The 12-hex digest of the key, for display and search."""
        return key_digest(bytes(self.key_hash))


def hashed_key_constraints(*, unique: str, key_hash_check: str, scope_check: str) -> list[models.BaseConstraint]:
    """One owner per ``(scope, key_hash)``, a 32-byte hash and a scope of 1..MAX_SCOPE_BYTES bytes."""
    return [
        models.UniqueConstraint(fields=["scope", "key_hash"], name=unique),
        models.CheckConstraint(condition=models.lookups.Exact(_octet_length("key_hash"), 32), name=key_hash_check),
        models.CheckConstraint(
            condition=models.Q(
                models.lookups.GreaterThanOrEqual(_octet_length("scope"), 1),
                models.lookups.LessThanOrEqual(_octet_length("scope"), conf.MAX_SCOPE_BYTES),
            ),
            name=scope_check,
        ),
    ]


def hashed_key_indexes(*, expires: str) -> list[models.Index]:
    """The index maintenance prunes expired rows by."""
    return [models.Index(fields=["expires_at"], name=expires)]


class IdempotencyBinding(HashedKey):
    """Ownership of a scoped key by one job, in one keyed mode.

    The unique constraint on ``(scope, key_hash)`` is the only arbiter of racing producers. The raw
    key is never stored: only its hash, a bounded preview and, derived from the hash, a digest.
    """

    mode = models.CharField(max_length=16, choices=[(mode.value, mode.value) for mode in KeyMode])
    request_digest = models.BinaryField(max_length=32)
    field_digests = models.JSONField()
    previous_request_digest = models.BinaryField(
        max_length=32, null=True, blank=True, help_text="The request digest the last debounce replacement superseded."
    )
    job = models.ForeignKey(Job, on_delete=JOB_CHILD, related_name="bindings")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)

    objects = BindingQuerySet.as_manager()

    class Meta:
        db_table = "workhorse_binding"
        verbose_name = "idempotency binding"
        permissions = [("release_binding", "Can release idempotency bindings")]
        constraints = [
            *hashed_key_constraints(
                unique=BINDING_KEY_UNIQ, key_hash_check=BINDING_KEY_HASH_CHECK, scope_check=BINDING_SCOPE_CHECK
            ),
            models.CheckConstraint(
                condition=models.Q(mode__in=[mode.value for mode in KeyMode]), name=BINDING_MODE_CHECK
            ),
        ]
        indexes = hashed_key_indexes(expires=BINDING_EXPIRES_IDX)


class DeadJob(Job):
    """Dead jobs (dead letters), for their own admin page."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"


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


class WorkerRecord(models.Model):
    """A running worker process, registered at start and removed on a clean exit."""

    name = models.CharField(max_length=255)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.IntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()

    class Meta:
        db_table = "workhorse_worker"
        verbose_name = "worker"
        constraints = [models.UniqueConstraint(fields=["name"], name=WORKER_NAME_UNIQ)]

    def __str__(self) -> str:
        return self.name


class EffectKind(models.TextChoices):
    """What a ledger entry records: an effect of ``once()``, or a view's response to an HTTP request."""

    EFFECT = "effect", "once() effect"
    HTTP = "http", "HTTP response"


class EffectRecord(HashedKey):
    """One operation of the effect ledger: a ``once()`` effect, or an ``@idempotent`` view's response.

    Written in the same transaction as the effect it records, so both commit or neither does. The
    unique constraint on ``(scope, key_hash)`` is the only arbiter of racing attempts. As for
    bindings, the raw key is never stored: only its hash, a bounded preview and a digest. An HTTP
    record's hash covers its owner too (``fingerprint.http_key_hash``), so two owners' equal keys
    are two entries.
    """

    # Defaults in the database too: once()'s claim statement does not name these columns.
    kind = models.CharField(max_length=6, choices=EffectKind.choices, default=EffectKind.EFFECT, db_default="effect")
    owner = models.CharField(
        max_length=conf.MAX_IDEMPOTENT_OWNER_CHARS,
        blank=True,
        default="",
        db_default="",
        help_text="Whose request an HTTP record answers (the user, or what the view's owner= returned).",
    )
    result = models.JSONField(encoder=DjangoJSONEncoder, null=True, blank=True)
    request_digest = models.BinaryField(
        max_length=32, null=True, blank=True, help_text="SHA-256 of the HTTP request's fingerprint."
    )
    field_digests = models.JSONField(
        null=True, blank=True, help_text="A digest per fingerprint part, to name the parts a reused key changed."
    )
    status_code = models.PositiveSmallIntegerField(null=True, blank=True, help_text="The stored response's status.")
    response_headers = models.JSONField(null=True, blank=True, help_text="The stored response's replayed headers.")
    response_body = models.BinaryField(null=True, blank=True)
    created_at = models.DateTimeField(help_text="When the operation was claimed.")
    completed_at = models.DateTimeField(
        null=True, blank=True, help_text="When its result was stored (in the same transaction as the claim)."
    )
    expires_at = models.DateTimeField(help_text="After this, a repeat runs the effect again; maintenance prunes it.")

    class Meta:
        db_table = "workhorse_effect"
        verbose_name = "ledger entry"
        verbose_name_plural = "ledger entries"
        permissions = [("release_effect", "Can release a ledger entry (its key runs again)")]
        constraints = hashed_key_constraints(
            unique=EFFECT_KEY_UNIQ, key_hash_check=EFFECT_KEY_HASH_CHECK, scope_check=EFFECT_SCOPE_CHECK
        )
        indexes = hashed_key_indexes(expires=EFFECT_EXPIRES_IDX)


class ScheduleState(models.Model):
    """What the database knows of one periodic schedule: synced from code at each evaluation.

    A schedule removed from code is kept, marked inactive, with its history. ``evaluated_until``
    is where the next evaluation's window starts: ticks up to it have been enqueued or skipped.
    """

    name = models.CharField(max_length=conf.MAX_SCHEDULE_NAME_CHARS)
    task = models.CharField(max_length=conf.MAX_JOB_TYPE_CHARS, help_text="The job type each tick enqueues.")
    definition = models.JSONField(help_text="The schedule as declared in code, for display.")
    digest = models.CharField(max_length=64, help_text="SHA-256 of the definition; changes when the code does.")
    active = models.BooleanField(default=True, help_text="Declared by the code of the last evaluator.")
    paused = models.BooleanField(default=False, help_text="A paused schedule makes no ticks.")
    evaluated_until = models.DateTimeField(help_text="Ticks up to this instant have been enqueued or skipped.")
    last_tick_at = models.DateTimeField(null=True, blank=True, help_text="The newest tick enqueued.")
    # A plain id, not a foreign key: maintenance prunes finished jobs, the schedule outlives them.
    last_job_id = models.BigIntegerField(null=True, blank=True, help_text="The job of the newest tick or run-now.")
    last_skip_at = models.DateTimeField(null=True, blank=True, help_text="The newest tick not enqueued.")
    last_skip_reason = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "workhorse_schedule"
        verbose_name = "schedule"
        ordering = ["name"]
        permissions = [
            ("pause_schedule", "Can pause and resume schedules"),
            ("run_schedule_now", "Can run schedules now"),
        ]
        constraints = [models.UniqueConstraint(fields=["name"], name=SCHEDULE_NAME_UNIQ)]

    def __str__(self) -> str:
        return self.name


class ScheduleEventKind(models.TextChoices):
    """What an operator did to a schedule."""

    PAUSED = "paused"
    RESUMED = "resumed"
    RUN_NOW = "run_now"


class ScheduleEvent(models.Model):
    """One operator action on a schedule, with who asked; a run-now is one per request id."""

    schedule = models.ForeignKey(ScheduleState, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=16, choices=ScheduleEventKind.choices)
    at = models.DateTimeField()
    requested_by = models.CharField(max_length=conf.MAX_REQUESTED_BY_CHARS, blank=True)
    request_id = models.CharField(max_length=conf.MAX_REQUEST_ID_CHARS, blank=True)
    job_id = models.BigIntegerField(null=True, blank=True, help_text="The job a run-now enqueued.")

    class Meta:
        db_table = "workhorse_schedule_event"
        ordering = ["schedule", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "request_id"],
                name=SCHEDULE_EVENT_REQUEST_UNIQ,
                condition=models.Q(kind="run_now"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} ({self.schedule_id})"


class Lease(models.Model):
    """A named lease one process holds at a time, until it gives it back or ``expires_at`` passes.

    Maintenance runs under the ``maintenance`` lease (``sql.leases``). A row taken by compare and swap,
    not a session advisory lock: it holds behind a transaction pooler, and every statement that takes,
    renews or gives it back commits on its own (see decision 0010).
    """

    name = models.CharField(max_length=100, primary_key=True)
    holder = models.UUIDField(help_text="The token of the run that holds it.")
    expires_at = models.DateTimeField(help_text="Free again from this instant, if not given back before.")

    class Meta:
        db_table = "workhorse_lease"

    def __str__(self) -> str:
        return self.name
