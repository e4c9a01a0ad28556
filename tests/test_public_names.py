"""The public names: importable from ``django_workhorse`` exactly as before the package was cut into
rooms (issue 23), each the object of the module that now defines it. A name added or removed is a
change of the public API: it changes this list on purpose."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import django_workhorse
from tests.processes import subprocess_database_url

PUBLIC = {
    # Errors (django_workhorse.exceptions)
    "AttemptTimeoutError": "django_workhorse.exceptions",
    "BreakerValidationError": "django_workhorse.exceptions",
    "CheckpointNotStorableError": "django_workhorse.exceptions",
    "DecryptionError": "django_workhorse.exceptions",
    "DjangoTaskNotFoundError": "django_workhorse.exceptions",
    "DrainTimeoutError": "django_workhorse.exceptions",
    "EffectAlreadyDoneError": "django_workhorse.exceptions",
    "EffectInFlightError": "django_workhorse.exceptions",
    "EffectValidationError": "django_workhorse.exceptions",
    "EncryptionNotConfiguredError": "django_workhorse.exceptions",
    "EnqueueIdempotencyConflictError": "django_workhorse.exceptions",
    "EnqueueValidationError": "django_workhorse.exceptions",
    "HandlerNotRegisteredError": "django_workhorse.exceptions",
    "IdempotencyKeyError": "django_workhorse.exceptions",
    "IdempotentViewError": "django_workhorse.exceptions",
    "InvalidArgumentError": "django_workhorse.exceptions",
    "JobCancelledError": "django_workhorse.exceptions",
    "JobDoesNotExist": "django_workhorse.exceptions",
    "JobFailedError": "django_workhorse.exceptions",
    "JobNotDeadError": "django_workhorse.exceptions",
    "KeyNotSettledError": "django_workhorse.exceptions",
    "LeaseLostError": "django_workhorse.exceptions",
    "OutcomeValidationError": "django_workhorse.exceptions",
    "RateLimitTimeoutError": "django_workhorse.exceptions",
    "RateLimitValidationError": "django_workhorse.exceptions",
    "RedriveConflictError": "django_workhorse.exceptions",
    "ResultNotStorableError": "django_workhorse.exceptions",
    "ScheduleDefinitionError": "django_workhorse.exceptions",
    "ScheduleNotFoundError": "django_workhorse.exceptions",
    "StepNotSucceededError": "django_workhorse.exceptions",
    "TaskDefinitionError": "django_workhorse.exceptions",
    "WaitNotAllowedError": "django_workhorse.exceptions",
    "WaitTimeoutError": "django_workhorse.exceptions",
    "WorkerThreadError": "django_workhorse.exceptions",
    "DatabaseUnavailableError": "django_workhorse.exceptions",
    "WorkflowConflictError": "django_workhorse.exceptions",
    "WorkflowDoesNotExist": "django_workhorse.exceptions",
    "WorkflowDefinitionError": "django_workhorse.exceptions",
    "WorkhorseBackendNotConfiguredError": "django_workhorse.exceptions",
    "WorkhorseError": "django_workhorse.exceptions",
    # Values (django_workhorse.types) and definitions
    "Debounce": "django_workhorse.types",
    "EnqueueOptions": "django_workhorse.types",
    "EnqueueOutcome": "django_workhorse.types",
    "EnqueueRequest": "django_workhorse.types",
    "EnqueueResult": "django_workhorse.types",
    "Idempotency": "django_workhorse.types",
    "JobId": "django_workhorse.types",
    "NonReplaceableReason": "django_workhorse.types",
    "Throttle": "django_workhorse.types",
    "Unique": "django_workhorse.types",
    "RetryPolicy": "django_workhorse.tasks.retry",
    "Schedule": "django_workhorse.schedules.definition",
    "Breaker": "django_workhorse.admission.breakers",
    "RateLimit": "django_workhorse.admission.rate_limits",
    # Enqueue
    "enqueue": "django_workhorse.enqueueing.api",
    "enqueue_with_result": "django_workhorse.enqueueing.api",
    "enqueue_many": "django_workhorse.enqueueing.api",
    "aenqueue": "django_workhorse.enqueueing.api",
    "aenqueue_with_result": "django_workhorse.enqueueing.api",
    "aenqueue_many": "django_workhorse.enqueueing.api",
    # Tasks and handlers
    "task": "django_workhorse.tasks.decorator",
    "Task": "django_workhorse.tasks.decorator",
    "register": "django_workhorse.tasks.registry",
    "HandlerContext": "django_workhorse.worker.context",
    # Waiting for results
    "wait_for": "django_workhorse.awaiting.waiting",
    "await_for": "django_workhorse.awaiting.waiting",
    # Handler outcomes
    "Snooze": "django_workhorse.outcomes.values",
    "Retry": "django_workhorse.outcomes.values",
    "Cancel": "django_workhorse.outcomes.values",
    "Fail": "django_workhorse.outcomes.values",
    "retry_after": "django_workhorse.outcomes.retry_after",
    # The effect ledger
    "once": "django_workhorse.effects.ledger",
    "once_block": "django_workhorse.effects.ledger",
    "Operation": "django_workhorse.effects.ledger",
    # Schedules
    "enqueue_due_schedules": "django_workhorse.schedules.evaluation",
    "pause_schedules": "django_workhorse.schedules.actions",
    "resume_schedules": "django_workhorse.schedules.actions",
    "run_schedule_now": "django_workhorse.schedules.actions",
    # Workflows
    "Workflow": "django_workhorse.workflows.definition",
    "WorkflowResult": "django_workhorse.workflows.result",
    "chain": "django_workhorse.workflows.canvas",
    "group": "django_workhorse.workflows.canvas",
    "chord": "django_workhorse.workflows.canvas",
    "cancel_workflow": "django_workhorse.workflows.operations",
    "workflow_state": "django_workhorse.workflows.operations",
    # Operations
    "cancel": "django_workhorse.operations.actions",
    "purge": "django_workhorse.operations.actions",
    "redrive": "django_workhorse.operations.actions",
    "prune_expired_bindings": "django_workhorse.operations.maintenance",
    "prune_expired_effects": "django_workhorse.operations.maintenance",
    # Queue control
    "pause_queue": "django_workhorse.operations.queues",
    "resume_queue": "django_workhorse.operations.queues",
    "paused_queues": "django_workhorse.operations.queues",
    "drain_queue": "django_workhorse.operations.queues",
    "reset_breaker": "django_workhorse.operations.breakers",
    "breaker_states": "django_workhorse.operations.breakers",
}


def test_all_lists_exactly_the_public_names():
    assert sorted(django_workhorse.__all__) == sorted([*PUBLIC, "__version__"])


def test_every_public_name_is_the_object_its_module_defines():
    for name, module in PUBLIC.items():
        assert getattr(django_workhorse, name) is getattr(importlib.import_module(module), name), name


def test_every_public_name_imports_from_the_package_in_a_fresh_process():
    names = ", ".join(PUBLIC)
    code = f"import django; django.setup(); from django_workhorse import {names}"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": subprocess_database_url()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_the_value_objects_import_before_django_is_set_up():
    code = (
        "from django_workhorse import Idempotency, Debounce, Throttle, Unique, RetryPolicy, Schedule, EnqueueOptions, "
        "Snooze, Retry, Cancel, Fail, retry_after, RateLimit"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
