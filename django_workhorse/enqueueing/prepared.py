"""The shape of a checked enqueue request, as the enqueue statements take it.

``validation.prepare`` builds these; ``sql.enqueue`` writes them. Neither the hash nor the
preview can be turned back into the raw key. They are built once per request on the enqueue's hot
path: plain slotted dataclasses, because a frozen one sets every field through
``object.__setattr__`` (a keyed ``prepare`` 15.5 -> 12.9 µs). Treat them as immutable; derive a
changed copy with ``dataclasses.replace``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django_workhorse.enqueueing.fingerprints import key_digest
from django_workhorse.types import KeyMode


@dataclass(slots=True)
class PreparedBinding:
    """The storable form of a keyed mode: hash, preview and fingerprint, never the raw key."""

    mode: KeyMode
    scope: str
    key_hash: bytes
    key_preview: str
    # How long the binding lives from now (None: while its job is live, for unique); debounce
    # keeps its key one window past the job's scheduled time.
    lifetime: timedelta | None
    field_digests: dict[str, str]
    request_digest: bytes
    window: timedelta | None = None  # debounce: how far a replacement schedules the job
    reset: bool = True  # debounce: a replacement moves run_at to now + window

    @property
    def key_digest(self) -> str:
        return key_digest(self.key_hash)

    @property
    def slot(self) -> tuple[str, bytes]:
        return (self.scope, self.key_hash)


@dataclass(slots=True)
class PreparedJob:
    """A validated request, in the shape the insert statement takes."""

    job_type: str
    queue: str
    payload_json: str
    priority: int
    run_at: datetime | None
    delay: timedelta | None
    tags: list[str]
    max_attempts: int
    retry_policy_json: str
    deadline: datetime | None
    timeout: timedelta | None
    concurrency_key: str | None
    concurrency_limit: int | None
    binding: PreparedBinding | None
    scheduled_for: datetime | None = None  # the schedule tick this job runs for
    # The W3C trace context of the enqueue's span as JSON text, set by ``tracing`` just before the
    # statement (never part of the fingerprint: a replay from another trace still replays).
    trace_context_json: str | None = None
    breaker_key: str | None = None  # admission, not content: outside the fingerprint
    rate_limit: str | None = None
    rate_partition: str | None = None
    partition_key: str | None = None
    # An encrypted job (decision 0024): its salt (``payload_json`` is then the JSON string of the
    # payload's envelope) and, unkeyed, its plaintext payload's JSON (never stored, never shown), to
    # be digested only if a workflow's fingerprint asks for it (most unkeyed jobs never are).
    cipher_salt: bytes | None = None
    plain_payload_json: str | None = field(default=None, repr=False)


# The keyed-mode name of a request without a key, in metrics and traces.
UNKEYED = "none"


def mode_name(request: PreparedJob) -> str:
    """The keyed mode of ``request`` as metrics and traces name it (``none`` without a key)."""
    return UNKEYED if request.binding is None else request.binding.mode.value
