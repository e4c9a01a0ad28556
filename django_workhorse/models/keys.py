"""Idempotency bindings: the rows that give keyed requests their owner."""

from __future__ import annotations

from django.db import models

from django_workhorse.models.base import (
    BINDING_EXPIRES_IDX,
    BINDING_KEY_HASH_CHECK,
    BINDING_KEY_UNIQ,
    BINDING_MODE_CHECK,
    BINDING_SCOPE_CHECK,
    JOB_CHILD,
    HashedKey,
    hashed_key_constraints,
    hashed_key_indexes,
)
from django_workhorse.models.jobs import Job
from django_workhorse.querysets import BindingQuerySet
from django_workhorse.types import KeyMode


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
