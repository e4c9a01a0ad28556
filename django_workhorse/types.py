"""Value objects of the public API: keyed modes, enqueue options, requests and results."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, ClassVar, Literal

from django_workhorse.conf import DEFAULT_MAX_ATTEMPTS
from django_workhorse.tasks.retry import RetryPolicy

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


class _HidesKey:
    """Keyed modes: the repr shows the key's length, never the key."""

    key: str

    def __repr__(self) -> str:
        shown = "".join(f", {f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name != "key")  # type: ignore[arg-type]
        return f"{type(self).__name__}(key=<{len(self.key)} chars>{shown})"


@dataclass(frozen=True, repr=False)
class Idempotency(_HidesKey):
    """One acceptance per request while the binding lives (``ttl``, 1 ms..365 days)."""

    key: str
    scope: str = DEFAULT_SCOPE
    ttl: timedelta = DEFAULT_IDEMPOTENCY_TTL


@dataclass(frozen=True, repr=False)
class Unique(_HidesKey):
    """One live job per key: repeats coalesce onto the pending or running job."""

    key: str
    scope: str = DEFAULT_SCOPE


@dataclass(frozen=True, repr=False)
class Debounce(_HidesKey):
    """The latest pending definition wins until the job starts or ``window`` elapses."""

    key: str
    window: timedelta
    schedule: Literal["reset", "preserve"] = "reset"
    scope: str = DEFAULT_SCOPE


@dataclass(frozen=True, repr=False)
class Throttle(_HidesKey):
    """One acceptance per ``window``: repeats coalesce onto the accepted job."""

    key: str
    window: timedelta
    scope: str = DEFAULT_SCOPE


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
    # The circuit breaker the job runs behind (a destination); a @task(breaker=...) defaults it to
    # its job type. Admission, not content: not part of the fingerprint.
    breaker_key: str | None = None
    # Admission at claim (issue 26): the named rate limit (WORKHORSE_RATE_LIMITS) the job's attempts
    # start under, the partition of a partitioned limit, and the key a fair queue shares out by.
    rate_limit: str | None = None
    rate_partition: str | None = None
    partition_key: str | None = None
    # Payload encryption at rest (decision 0024): True seals the job's payload, result, errors and
    # checkpoints; None follows WORKHORSE_ENCRYPTION["encrypt_all"]; False keeps the job in clear.
    encrypted: bool | None = None
    idempotency: Idempotency | None = None
    unique: Unique | None = None
    debounce: Debounce | None = None
    throttle: Throttle | None = None

    # The names the caller passed, whatever their values: a task's defaults fill in only the others
    # (decision 0020). ``dataclasses.replace`` passes every field, so its result gives them all.
    _given: ClassVar[frozenset[str]] = frozenset()

    def __new__(cls, **given: Any) -> EnqueueOptions:  # noqa: D102 - dataclass __init__ documents the fields
        options = super().__new__(cls)
        object.__setattr__(options, "_given", frozenset(given))
        return options

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Return the option names, in declaration order."""
        return tuple(f.name for f in fields(cls))

    def given(self) -> dict[str, Any]:
        """Return the options this value was built with by name, even those equal to their default."""
        return {name: getattr(self, name) for name in self._given}


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

    def wait(self, timeout: float | timedelta, *, using: str | None = None) -> Any:
        """Wait until the job has finished and return its result: see :func:`~django_workhorse.wait_for`."""
        if _wait_for is None:
            raise RuntimeError("django_workhorse is not in INSTALLED_APPS (or the app registry is not ready)")
        return _wait_for(self.job_id, timeout=timeout, using=using)


# How EnqueueResult waits: ``awaiting.waiting.wait_for``, registered when the app is ready
# (apps.py), so the value objects never import the database rooms.
_wait_for: Callable[..., Any] | None = None


def set_result_waiter(wait_for: Callable[..., Any]) -> None:
    """Register how :meth:`EnqueueResult.wait` waits."""
    global _wait_for
    _wait_for = wait_for
