"""The effect ledger: ``once()`` effects and ``@idempotent`` HTTP records."""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from django_workhorse import conf
from django_workhorse.models.base import (
    EFFECT_EXPIRES_IDX,
    EFFECT_KEY_HASH_CHECK,
    EFFECT_KEY_UNIQ,
    EFFECT_SCOPE_CHECK,
    HashedKey,
    hashed_key_constraints,
    hashed_key_indexes,
)


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
