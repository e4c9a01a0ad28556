"""django-workhorse: a durable PostgreSQL job queue for Django with idempotent enqueue."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from django_workhorse.admission.breakers import Breaker
from django_workhorse.admission.rate_limits import RateLimit
from django_workhorse.exceptions import (
    AttemptTimeoutError,
    BreakerValidationError,
    CheckpointNotStorableError,
    DatabaseUnavailableError,
    DecryptionError,
    DjangoTaskNotFoundError,
    DrainTimeoutError,
    EffectAlreadyDoneError,
    EffectInFlightError,
    EffectValidationError,
    EncryptionNotConfiguredError,
    EnqueueIdempotencyConflictError,
    EnqueueValidationError,
    HandlerNotRegisteredError,
    IdempotencyKeyError,
    IdempotentViewError,
    InvalidArgumentError,
    JobCancelledError,
    JobDoesNotExist,
    JobFailedError,
    JobNotDeadError,
    KeyNotSettledError,
    LeaseLostError,
    OutcomeValidationError,
    RateLimitTimeoutError,
    RateLimitValidationError,
    RedriveConflictError,
    ResultNotStorableError,
    ScheduleDefinitionError,
    ScheduleNotFoundError,
    StepNotSucceededError,
    TaskDefinitionError,
    WaitNotAllowedError,
    WaitTimeoutError,
    WorkerThreadError,
    WorkflowConflictError,
    WorkflowDefinitionError,
    WorkflowDoesNotExist,
    WorkhorseBackendNotConfiguredError,
    WorkhorseError,
)
from django_workhorse.outcomes.retry_after import retry_after
from django_workhorse.outcomes.values import Cancel, Fail, Retry, Snooze
from django_workhorse.schedules.definition import Schedule
from django_workhorse.tasks.retry import RetryPolicy
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
    from django_workhorse.awaiting.waiting import await_for, wait_for
    from django_workhorse.effects.ledger import Operation, once, once_block
    from django_workhorse.enqueueing.api import (
        aenqueue,
        aenqueue_many,
        aenqueue_with_result,
        enqueue,
        enqueue_many,
        enqueue_with_result,
    )
    from django_workhorse.operations.actions import cancel, purge, redrive
    from django_workhorse.operations.breakers import breaker_states, reset_breaker
    from django_workhorse.operations.maintenance import prune_expired_bindings, prune_expired_effects
    from django_workhorse.operations.queues import drain_queue, pause_queue, paused_queues, resume_queue
    from django_workhorse.schedules.actions import pause_schedules, resume_schedules, run_schedule_now
    from django_workhorse.schedules.evaluation import enqueue_due_schedules
    from django_workhorse.tasks.decorator import Task, task
    from django_workhorse.tasks.registry import register
    from django_workhorse.worker import HandlerContext
    from django_workhorse.workflows.canvas import chain, chord, group
    from django_workhorse.workflows.definition import Workflow
    from django_workhorse.workflows.operations import cancel_workflow, workflow_state
    from django_workhorse.workflows.result import WorkflowResult

try:
    __version__ = version("django-workhorse")
except PackageNotFoundError:  # pragma: no cover (running from a source tree)
    __version__ = "0.0.0"

# Functions that touch models are imported lazily, so `import django_workhorse` works before
# Django's app registry is ready (settings modules import it for the value objects).
_LAZY = {
    "enqueue": "django_workhorse.enqueueing.api",
    "aenqueue": "django_workhorse.enqueueing.api",
    "aenqueue_with_result": "django_workhorse.enqueueing.api",
    "aenqueue_many": "django_workhorse.enqueueing.api",
    "enqueue_with_result": "django_workhorse.enqueueing.api",
    "enqueue_many": "django_workhorse.enqueueing.api",
    "purge": "django_workhorse.operations.actions",
    "prune_expired_bindings": "django_workhorse.operations.maintenance",
    "prune_expired_effects": "django_workhorse.operations.maintenance",
    "register": "django_workhorse.tasks.registry",
    "enqueue_due_schedules": "django_workhorse.schedules.evaluation",
    "pause_schedules": "django_workhorse.schedules.actions",
    "resume_schedules": "django_workhorse.schedules.actions",
    "run_schedule_now": "django_workhorse.schedules.actions",
    "cancel": "django_workhorse.operations.actions",
    "redrive": "django_workhorse.operations.actions",
    "pause_queue": "django_workhorse.operations.queues",
    "resume_queue": "django_workhorse.operations.queues",
    "paused_queues": "django_workhorse.operations.queues",
    "drain_queue": "django_workhorse.operations.queues",
    "reset_breaker": "django_workhorse.operations.breakers",
    "breaker_states": "django_workhorse.operations.breakers",
    "task": "django_workhorse.tasks.decorator",
    "Task": "django_workhorse.tasks.decorator",
    "HandlerContext": "django_workhorse.worker",
    "once": "django_workhorse.effects.ledger",
    "once_block": "django_workhorse.effects.ledger",
    "Operation": "django_workhorse.effects.ledger",
    "Workflow": "django_workhorse.workflows.definition",
    "WorkflowResult": "django_workhorse.workflows.result",
    "chain": "django_workhorse.workflows.canvas",
    "group": "django_workhorse.workflows.canvas",
    "chord": "django_workhorse.workflows.canvas",
    "cancel_workflow": "django_workhorse.workflows.operations",
    "workflow_state": "django_workhorse.workflows.operations",
    "wait_for": "django_workhorse.awaiting.waiting",
    "await_for": "django_workhorse.awaiting.waiting",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'django_workhorse' has no attribute {name!r}")


__all__ = [
    "AttemptTimeoutError",
    "Breaker",
    "BreakerValidationError",
    "Cancel",
    "CheckpointNotStorableError",
    "DatabaseUnavailableError",
    "Debounce",
    "DecryptionError",
    "DjangoTaskNotFoundError",
    "DrainTimeoutError",
    "EffectAlreadyDoneError",
    "EffectInFlightError",
    "EffectValidationError",
    "EncryptionNotConfiguredError",
    "EnqueueIdempotencyConflictError",
    "EnqueueOptions",
    "EnqueueOutcome",
    "EnqueueRequest",
    "EnqueueResult",
    "EnqueueValidationError",
    "Fail",
    "HandlerContext",
    "HandlerNotRegisteredError",
    "Idempotency",
    "IdempotencyKeyError",
    "IdempotentViewError",
    "InvalidArgumentError",
    "JobCancelledError",
    "JobDoesNotExist",
    "JobFailedError",
    "JobId",
    "JobNotDeadError",
    "KeyNotSettledError",
    "LeaseLostError",
    "NonReplaceableReason",
    "Operation",
    "OutcomeValidationError",
    "RateLimit",
    "RateLimitTimeoutError",
    "RateLimitValidationError",
    "RedriveConflictError",
    "ResultNotStorableError",
    "Retry",
    "RetryPolicy",
    "Schedule",
    "ScheduleDefinitionError",
    "ScheduleNotFoundError",
    "Snooze",
    "StepNotSucceededError",
    "Task",
    "TaskDefinitionError",
    "Throttle",
    "Unique",
    "WaitNotAllowedError",
    "WaitTimeoutError",
    "WorkerThreadError",
    "Workflow",
    "WorkflowConflictError",
    "WorkflowDefinitionError",
    "WorkflowDoesNotExist",
    "WorkflowResult",
    "WorkhorseBackendNotConfiguredError",
    "WorkhorseError",
    "__version__",
    "aenqueue",
    "aenqueue_many",
    "aenqueue_with_result",
    "await_for",
    "breaker_states",
    "cancel",
    "cancel_workflow",
    "chain",
    "chord",
    "drain_queue",
    "enqueue",
    "enqueue_due_schedules",
    "enqueue_many",
    "enqueue_with_result",
    "group",
    "once",
    "once_block",
    "pause_queue",
    "pause_schedules",
    "paused_queues",
    "prune_expired_bindings",
    "prune_expired_effects",
    "purge",
    "redrive",
    "register",
    "reset_breaker",
    "resume_queue",
    "resume_schedules",
    "retry_after",
    "run_schedule_now",
    "task",
    "wait_for",
    "workflow_state",
]
