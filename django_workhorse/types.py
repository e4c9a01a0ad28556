"""Value objects of the public API: keyed modes, enqueue options, requests and results."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Literal

from django_workhorse.conf import DEFAULT_MAX_ATTEMPTS
from django_workhorse.retry import RetryPolicy

JobId = int
DEFAULT_SCOPE = "default"
DEFAULT_IDEMPOTENCY_TTL = timedelta(hours=24)


class _TextEnum(str, Enum):
    def __str__(self) -> str:
        return str(self.value)


class EnqueueOutcome(_TextEnum):
    """What PostgreSQL did with an enqueue request."""

    ACCEPTED = "accepted"
    REPLAYED = "replayed"
    REPLACED = "replaced"
    NON_REPLACEABLE = "non_replaceable"
    COALESCED = "coalesced"


class NonReplaceableReason(_TextEnum):
    """Why a debounce request could not replace the retained job."""

    INCOMPATIBLE_KEY_MODE = "incompatible_key_mode"
    NOT_PENDING = "not_pending"
    WINDOW_ELAPSED_PENDING = "window_elapsed_pending"


class KeyMode(_TextEnum):
    """The keyed mode that owns a binding."""

    IDEMPOTENCY = "idempotency"
    UNIQUE = "unique"
    DEBOUNCE = "debounce"
    THROTTLE = "throttle"


@dataclass(frozen=True)
class Idempotency:
    """One acceptance per request while the binding lives (``ttl``, 1 ms..365 days)."""

    key: str
    scope: str = DEFAULT_SCOPE
    ttl: timedelta = DEFAULT_IDEMPOTENCY_TTL

    def __repr__(self) -> str:  # never show the raw key
        return f"Idempotency(key=<{len(self.key)} chars>, scope={self.scope!r}, ttl={self.ttl!r})"


@dataclass(frozen=True)
class Unique:
    """One live job per key: repeats coalesce onto the pending or running job."""

    key: str
    scope: str = DEFAULT_SCOPE

    def __repr__(self) -> str:
        return f"Unique(key=<{len(self.key)} chars>, scope={self.scope!r})"


@dataclass(frozen=True)
class Debounce:
    """The latest pending definition wins until the job starts or ``window`` elapses."""

    key: str
    window: timedelta
    schedule: Literal["reset", "preserve"] = "reset"
    scope: str = DEFAULT_SCOPE

    def __repr__(self) -> str:
        return f"Debounce(key=<{len(self.key)} chars>, window={self.window!r}, schedule={self.schedule!r}, scope={self.scope!r})"


@dataclass(frozen=True)
class Throttle:
    """One acceptance per ``window``: repeats coalesce onto the accepted job."""

    key: str
    window: timedelta
    scope: str = DEFAULT_SCOPE

    def __repr__(self) -> str:
        return f"Throttle(key=<{len(self.key)} chars>, window={self.window!r}, scope={self.scope!r})"


KeyedMode = Idempotency | Unique | Debounce | Throttle


@dataclass(frozen=True, kw_only=True)
class EnqueueOptions:
    """Everything an enqueue call may say about a job besides its type and payload."""

    queue: str = "default"
    priority: int = 0
    run_at: datetime | None = None
    delay: timedelta | None = None
    tags: tuple[str, ...] | list[str] = ()
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_policy: RetryPolicy | None = None
    deadline: datetime | None = None
    timeout: timedelta | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    idempotency: Idempotency | None = None
    unique: Unique | None = None
    debounce: Debounce | None = None
    throttle: Throttle | None = None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Return the option names, in declaration order."""
        return tuple(f.name for f in fields(cls))


# Shared by every request that gives no options (they are immutable), so a batch checks them once.
DEFAULT_OPTIONS = EnqueueOptions()


@dataclass(frozen=True)
class EnqueueRequest:
    """One entry of an :func:`~django_workhorse.enqueue_many` batch."""

    job_type: str
    payload: Any = None
    options: EnqueueOptions = field(default_factory=lambda: DEFAULT_OPTIONS)


@dataclass(frozen=True)
class EnqueueResult:
    """The job that owns a request, and what PostgreSQL decided."""

    job_id: JobId
    outcome: EnqueueOutcome
    reason: NonReplaceableReason | None = None
