"""django-workhorse: a durable PostgreSQL job queue for Django with idempotent enqueue."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from django_workhorse.exceptions import (
    AttemptTimeoutError,
    CheckpointNotStorableError,
    DjangoTaskNotFoundError,
    EffectAlreadyDoneError,
    EffectInFlightError,
    EffectValidationError,
    EnqueueIdempotencyConflictError,
    EnqueueValidationError,
    HandlerNotRegisteredError,
    IdempotencyKeyError,
    IdempotentViewError,
    InvalidArgumentError,
    JobCancelledError,
    JobDoesNotExist,
    JobNotDeadError,
    KeyNotSettledError,
    LeaseLostError,
    RedriveConflictError,
    ResultNotStorableError,
    ScheduleDefinitionError,
    ScheduleNotFoundError,
    WorkerThreadError,
    WorkhorseBackendNotConfiguredError,
    WorkhorseError,
)
from django_workhorse.retry import RetryPolicy
from django_workhorse.schedules import Schedule
from django_workhorse.types import (
    Debounce,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    EnqueueResult,
    Idempotency,
    JobId,
    NonReplaceableReason,
    Throttle,
    Unique,
)

if TYPE_CHECKING:
    from django_workhorse.actions import cancel, purge, redrive
    from django_workhorse.effects import Operation, once, once_block
    from django_workhorse.enqueue_api import (
        aenqueue,
        aenqueue_many,
        aenqueue_with_result,
        enqueue,
        enqueue_many,
        enqueue_with_result,
    )
    from django_workhorse.maintenance import prune_expired_bindings, prune_expired_effects
    from django_workhorse.registry import register
    from django_workhorse.schedule_actions import pause_schedules, resume_schedules, run_schedule_now
    from django_workhorse.scheduler import enqueue_due_schedules
    from django_workhorse.tasks import Task, task
    from django_workhorse.worker import HandlerContext

try:
    __version__ = version("django-workhorse")
except PackageNotFoundError:  # pragma: no cover (running from a source tree)
    __version__ = "0.0.0"

# Functions that touch models are imported lazily, so `import django_workhorse` works before
# Django's app registry is ready (settings modules import it for the value objects).
_LAZY = {
    "enqueue": "django_workhorse.enqueue_api",
    "aenqueue": "django_workhorse.enqueue_api",
    "aenqueue_with_result": "django_workhorse.enqueue_api",
    "aenqueue_many": "django_workhorse.enqueue_api",
    "enqueue_with_result": "django_workhorse.enqueue_api",
    "enqueue_many": "django_workhorse.enqueue_api",
    "purge": "django_workhorse.actions",
    "prune_expired_bindings": "django_workhorse.maintenance",
    "prune_expired_effects": "django_workhorse.maintenance",
    "register": "django_workhorse.registry",
    "enqueue_due_schedules": "django_workhorse.scheduler",
    "pause_schedules": "django_workhorse.schedule_actions",
    "resume_schedules": "django_workhorse.schedule_actions",
    "run_schedule_now": "django_workhorse.schedule_actions",
    "cancel": "django_workhorse.actions",
    "redrive": "django_workhorse.actions",
    "task": "django_workhorse.tasks",
    "Task": "django_workhorse.tasks",
    "HandlerContext": "django_workhorse.worker",
    "once": "django_workhorse.effects",
    "once_block": "django_workhorse.effects",
    "Operation": "django_workhorse.effects",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'django_workhorse' has no attribute {name!r}")


__all__ = [
    "AttemptTimeoutError",
    "CheckpointNotStorableError",
    "Debounce",
    "DjangoTaskNotFoundError",
    "EffectAlreadyDoneError",
    "EffectInFlightError",
    "EffectValidationError",
    "EnqueueIdempotencyConflictError",
    "EnqueueOptions",
    "EnqueueOutcome",
    "EnqueueRequest",
    "EnqueueResult",
    "EnqueueValidationError",
    "HandlerContext",
    "HandlerNotRegisteredError",
    "Idempotency",
    "IdempotencyKeyError",
    "IdempotentViewError",
    "InvalidArgumentError",
    "JobCancelledError",
    "JobDoesNotExist",
    "JobId",
    "JobNotDeadError",
    "KeyNotSettledError",
    "LeaseLostError",
    "NonReplaceableReason",
    "Operation",
    "RedriveConflictError",
    "ResultNotStorableError",
    "RetryPolicy",
    "Schedule",
    "ScheduleDefinitionError",
    "ScheduleNotFoundError",
    "Task",
    "Throttle",
    "Unique",
    "WorkerThreadError",
    "WorkhorseBackendNotConfiguredError",
    "WorkhorseError",
    "__version__",
    "aenqueue",
    "aenqueue_many",
    "aenqueue_with_result",
    "cancel",
    "enqueue",
    "enqueue_due_schedules",
    "enqueue_many",
    "enqueue_with_result",
    "once",
    "once_block",
    "pause_schedules",
    "prune_expired_bindings",
    "prune_expired_effects",
    "purge",
    "redrive",
    "register",
    "resume_schedules",
    "run_schedule_now",
    "task",
]
