"""The worker's side of the django.tasks backend: finding a task by its module path and running it.

When this module is imported it adds :func:`resolve_handler` to the workhorse registry, so a worker
runs tasks that another process enqueued without any registration step. Each attempt runs as
Django's own backends run a task: ``task_started`` before, ``task_finished`` after, a
``TaskContext`` first when the task ``takes_context``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from traceback import format_exception
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from django_workhorse.backends._framework import (
    InvalidTaskBackend,
    TaskContext,
    TaskError,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from django_workhorse.backends.backend import WorkhorseBackend
from django_workhorse.backends.results import (
    FAILED,
    SUCCESSFUL,
    WorkhorseTaskResult,
    import_roots,
    import_task,
    may_import,
)
from django_workhorse.exceptions import DjangoTaskNotFoundError, WorkhorseBackendNotConfiguredError
from django_workhorse.outcomes.values import Cancel, Snooze
from django_workhorse.tasks.registry import Handler, add_resolver

if TYPE_CHECKING:
    from django_workhorse.worker.context import HandlerContext

logger = logging.getLogger(__name__)


class TaskRunner:
    """The workhorse handler of a django.tasks task: runs one attempt as Django's backends run a task."""

    def __init__(self, job_type: str) -> None:
        self.job_type = job_type

    def __repr__(self) -> str:
        return f"<TaskRunner {self.job_type}>"

    def __call__(self, ctx: HandlerContext, payload: Any) -> Any:
        """Run the task of job ``ctx.job_id``, sending ``task_started`` and ``task_finished``; return its value."""
        backend = _backend_for(self.job_type)
        result = backend.get_result(str(ctx.job_id))  # RUNNING, one worker id per attempt so far
        task = result.task
        sender = type(backend)
        task_started.send(sender=sender, task_result=result)
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
            else:
                value = task.call(*result.args, **result.kwargs)
            value = normalize_json(value)  # a value that is not JSON fails the attempt, as in Django
        except (KeyboardInterrupt, Snooze):  # a snoozed task has not finished: it runs again later
            raise
        except Cancel:  # cancelled: FAILED, django.tasks' only final state besides SUCCESSFUL, with no error
            _finish(result, FAILED)
            task_finished.send(sender=sender, task_result=result)
            raise
        except BaseException as exc:
            exc_type = type(exc)
            result.errors.append(
                TaskError(
                    exception_class_path=f"{exc_type.__module__}.{exc_type.__qualname__}",
                    traceback="".join(format_exception(exc)),
                )
            )
            _finish(result, FAILED)
            task_finished.send(sender=sender, task_result=result)  # inside except: receivers see exc_info
            raise
        object.__setattr__(result, "_return_value", value)
        _finish(result, SUCCESSFUL)
        task_finished.send(sender=sender, task_result=result)
        return value


def resolve_handler(job_type: str) -> Handler | None:
    """Return the handler of a job type naming a django.tasks ``Task`` by module path, else None.

    Registered with the workhorse registry when this module is imported, so a worker runs tasks
    that another process enqueued without any registration step. Only the modules ``may_import``
    allows are imported: a job naming another one fails as unregistered, and a warning says why.
    """
    module = job_type.rpartition(".")[0]
    if module and not may_import(module):
        logger.warning(
            "Not importing module=%s for job type=%s: it is in no installed app and not in WORKHORSE_TASK_MODULES",
            module,
            job_type,
        )
        return None
    if import_task(job_type) is None:
        return None
    return Handler(job_type, TaskRunner(job_type), takes_context=True, spreads_payload=False)


add_resolver(resolve_handler, prefixes=import_roots)


def _backend_for(job_type: str) -> WorkhorseBackend:
    """The backend a job's task names if it is a WorkhorseBackend, else the first one configured."""
    task = import_task(job_type)
    if task is None:
        raise DjangoTaskNotFoundError(job_type)
    with contextlib.suppress(InvalidTaskBackend):
        backend = task.get_backend()
        if isinstance(backend, WorkhorseBackend):
            return backend
    configured = next(_configured_backends(), None)
    if configured is None:
        raise WorkhorseBackendNotConfiguredError(job_type)
    return configured


def _configured_backends() -> Iterator[WorkhorseBackend]:
    for alias in task_backends.settings:
        with contextlib.suppress(InvalidTaskBackend):
            backend = task_backends[alias]
            if isinstance(backend, WorkhorseBackend):
                yield backend


def _finish(result: WorkhorseTaskResult, status: TaskResultStatus) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
