"""Constraint and index names, and what every table of keys shares (``HashedKey``).

The names are constants: the ``sql`` package refers to them, so a rename cannot silently break
the code that translates their violations.
"""

from __future__ import annotations

from django.db import models

from django_workhorse import conf
from django_workhorse.enqueueing.fingerprints import key_digest

JOB_READY_IDX = "workhorse_job_ready_idx"
JOB_LEASE_IDX = "workhorse_job_lease_idx"
JOB_FINISHED_IDX = "workhorse_job_finished_idx"
JOB_DEAD_IDX = "workhorse_job_dead_idx"
JOB_BREAKER_HELD_IDX = "workhorse_job_breaker_held_idx"
JOB_FAIR_READY_IDX = "workhorse_job_fair_ready_idx"
RATE_BUDGET_UNIQ = "workhorse_rate_budget_name_partition_uniq"
JOB_SNOOZES_CHECK = "workhorse_job_snoozes_check"
JOB_BREAKER_KEY_CHECK = "workhorse_job_breaker_key_check"
BREAKER_STATE_CHECK = "workhorse_breaker_state_check"
BREAKER_KEY_CHECK = "workhorse_breaker_key_check"
QUEUE_NAME_CHECK = "workhorse_queue_name_check"
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
# Workflows (decision 0022): the workflow row, its steps' columns on workhorse_job, and the edges.
WORKFLOW_NAME_CHECK = "workhorse_workflow_name_check"
WORKFLOW_FINGERPRINT_CHECK = "workhorse_workflow_fingerprint_check"
WORKFLOW_KEY_CHECK = "workhorse_workflow_key_check"
WORKFLOW_KEY_HASH_CHECK = "workhorse_workflow_key_hash_check"
WORKFLOW_SCOPE_CHECK = "workhorse_workflow_scope_check"
WORKFLOW_STEP_COUNT_CHECK = "workhorse_workflow_step_count_check"
JOB_WORKFLOW_STEP_CHECK = "workhorse_job_workflow_step_check"
JOB_PENDING_PARENTS_CHECK = "workhorse_job_pending_parents_check"
JOB_WAITING_CHECK = "workhorse_job_waiting_check"
JOB_WORKFLOW_STEP_UNIQ = "workhorse_job_workflow_step_uniq"
JOB_WORKFLOW_IDX = "workhorse_job_workflow_idx"
JOB_WAITING_IDX = "workhorse_job_waiting_idx"
JOB_ENCRYPTED_IDX = "workhorse_job_encrypted_idx"
DEPENDENCY_CHILD_PARENT_UNIQ = "workhorse_dependency_child_parent_uniq"
# Django caps index names at 30 characters.
DEPENDENCY_PARENT_IDX = "workhorse_dep_parent_idx"
DEPENDENCY_NOT_SELF_CHECK = "workhorse_dependency_not_self_check"
# The identity sequence PostgreSQL creates for workhorse_job.id; enqueue draws ids from it
# before inserting so that a binding and its job can be written in one statement.
JOB_ID_SEQUENCE = "workhorse_job_id_seq"
# How a job's children (bindings, events, checkpoints, redrive records, dependency edges) reference
# it, and a workflow's jobs their workflow. The database deletes them with their parent row (ON DELETE
# CASCADE, set by migrations 0007 and 0021, since Django 5.2 cannot declare it), so purge and prune
# delete only jobs (or workflows) and ``Job.objects.filter(...).delete()`` is one DELETE: DO_NOTHING
# keeps the ORM from collecting and deleting the children itself.
JOB_CHILD = models.DO_NOTHING


def octet_length(field: str) -> models.Func:
    return models.Func(models.F(field), function="octet_length", output_field=models.IntegerField())


def readable_instant(field: str) -> models.Q:
    return models.Q(**{f"{field}__gte": conf.MIN_STORED_DATETIME, f"{field}__lte": conf.MAX_STORED_DATETIME})


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


def key_hash_condition() -> models.lookups.Exact:
    """A 32-byte SHA-256 (NULL passes, as in every CHECK)."""
    return models.lookups.Exact(octet_length("key_hash"), 32)


def scope_condition() -> models.Q:
    """A scope of 1..MAX_SCOPE_BYTES bytes (NULL passes, as in every CHECK)."""
    return models.Q(
        models.lookups.GreaterThanOrEqual(octet_length("scope"), 1),
        models.lookups.LessThanOrEqual(octet_length("scope"), conf.MAX_SCOPE_BYTES),
    )


def hashed_key_constraints(*, unique: str, key_hash_check: str, scope_check: str) -> list[models.BaseConstraint]:
    """One owner per ``(scope, key_hash)``, a 32-byte hash and a scope of 1..MAX_SCOPE_BYTES bytes."""
    return [
        models.UniqueConstraint(fields=["scope", "key_hash"], name=unique),
        models.CheckConstraint(condition=key_hash_condition(), name=key_hash_check),
        models.CheckConstraint(condition=scope_condition(), name=scope_check),
    ]


def hashed_key_indexes(*, expires: str) -> list[models.Index]:
    """The index maintenance prunes expired rows by."""
    return [models.Index(fields=["expires_at"], name=expires)]
