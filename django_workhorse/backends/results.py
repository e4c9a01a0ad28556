"""Jobs as django.tasks ``TaskResult`` values: ``WorkhorseTaskResult`` and how a job maps onto one.

A job's status maps onto the framework's (a cancelled job is FAILED: django.tasks has no other
final state), its claimed events give the worker ids and attempt times, its failed events one
``TaskError`` each. The task is found again by importing the job type, its module path, from the
modules a job type may name (:func:`may_import`).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.utils import timezone
from django.utils.module_loading import import_string

from django_workhorse.backends._framework import (
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from django_workhorse.conf import app_settings
from django_workhorse.encryption.jobs import EVENT_ERROR, LAST_ERROR, PAYLOAD, RESULT, opened_json, opened_text
from django_workhorse.exceptions import WorkhorseError
from django_workhorse.types import EnqueueResult, JobId

if TYPE_CHECKING:
    from django_workhorse.models import Job

    _ResultBase = TaskResult[..., Any]
else:  # Django's runtime TaskResult is not generic (the backport's is).
    _ResultBase = TaskResult

# By value: django-stubs types the members themselves as `...`.
READY, RUNNING = TaskResultStatus("READY"), TaskResultStatus("RUNNING")
SUCCESSFUL, FAILED = TaskResultStatus("SUCCESSFUL"), TaskResultStatus("FAILED")
# Job status -> TaskResult status. A cancelled job is FAILED: django.tasks has no other final state; a
# waiting workflow step is READY, as a queued job that is not due yet is.
STATUSES = {
    "waiting": READY,
    "queued": READY,
    "running": RUNNING,
    "succeeded": SUCCESSFUL,
    "dead": FAILED,
    "cancelled": FAILED,
}
# The exception class of an error no exception stands for (a deadline, an expired lease).
WORKHORSE_ERROR = f"{WorkhorseError.__module__}.{WorkhorseError.__qualname__}"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkhorseTaskResult(_ResultBase):  # type: ignore[misc]  # django-stubs declare TaskResult unfrozen; it is frozen
    """A ``TaskResult`` that also says what enqueue did: ``enqueue_result.outcome`` is ACCEPTED,
    REPLAYED, COALESCED, REPLACED or NON_REPLACEABLE. ``None`` on results read by ``get_result``."""

    enqueue_result: EnqueueResult | None = field(default=None, compare=False)

    @property
    def job_id(self) -> JobId:
        """The id of the workhorse job (the result id, as an integer)."""
        return int(self.id)


def import_task(job_type: str) -> Task[..., Any] | None:
    """Return the django.tasks ``Task`` that a job type names by module path, else None.

    A job type is text from the database: its module is imported only if :func:`may_import` says so.
    """
    module = job_type.rpartition(".")[0]
    if not module or not may_import(module):
        return None
    try:
        found = import_string(job_type)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


def may_import(module: str) -> bool:
    """Return whether a job type's module may be imported to look for its task: it is imported
    already, or it is (in) the package of an installed app or of a ``WORKHORSE_TASK_MODULES`` entry.

    Importing runs the module's code: any other module a job type named would run whatever it does
    on import in the worker (or in whoever reads the job's result).
    """
    if module in sys.modules:
        return True
    return any(module == root or module.startswith(f"{root}.") for root in import_roots())


def import_roots() -> list[str]:
    """Return the packages whose modules may be imported to find a task: the installed apps and the
    ``WORKHORSE_TASK_MODULES`` entries. A worker advertises them as ``root.*`` (its claims take those)."""
    return [config.name for config in apps.get_app_configs()] + list(app_settings.TASK_MODULES)


def new_result(task: Task[..., Any], args: Any, kwargs: Any, *, backend: str) -> WorkhorseTaskResult:
    """Return the READY result of a call not written yet (Django normalizes the arguments to JSON)."""
    return WorkhorseTaskResult(
        task=task,
        id="",
        status=READY,
        enqueued_at=None,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[],
        worker_ids=[],
    )


def mark_accepted(result: WorkhorseTaskResult, payload: dict[str, Any], enqueued: EnqueueResult) -> None:
    """Make ``result`` that of its newly accepted job: its id, the arguments as stored, now."""
    object.__setattr__(result, "id", str(enqueued.job_id))
    object.__setattr__(result, "args", payload["args"])
    object.__setattr__(result, "kwargs", payload["kwargs"])
    object.__setattr__(result, "enqueued_at", timezone.now())
    object.__setattr__(result, "enqueue_result", enqueued)


def read_result(
    job_id: JobId, *, backend: str, database: str, enqueue_result: EnqueueResult | None = None
) -> WorkhorseTaskResult:
    """Build the result of job ``job_id`` (in ``database``) from its row and its claimed/failed events.

    ``backend`` is the alias of the task backend the result belongs to. Raise
    ``TaskResultDoesNotExist`` if there is no such job, or it is not a django.tasks task's.
    """
    from django_workhorse.models import EventKind, Job, JobEvent

    job = Job.objects.using(database).filter(pk=job_id).first()
    if job is None:
        raise TaskResultDoesNotExist(str(job_id))
    task = _task_of(job, backend)
    salt = None if job.cipher_salt is None else bytes(job.cipher_salt)
    payload = opened_json(job.payload, field=PAYLOAD, salt=salt, job_id=job.pk)
    if not isinstance(payload, dict) or not isinstance(payload.get("args"), list):
        raise TaskResultDoesNotExist(f"{job_id} (job type {job.job_type!r} is not a django.tasks task)")
    events = (
        JobEvent.objects.using(database)
        .filter(job_id=job_id, kind__in=[EventKind.CLAIMED, EventKind.FAILED])
        .order_by("id")
        .values_list("kind", "attempt", "at", "details")
    )
    claims: dict[int, tuple[str, datetime]] = {}  # attempt -> (worker, when): the last claim of each
    failures: list[dict[str, Any]] = []
    for kind, attempt, at, details in events:
        if kind == EventKind.CLAIMED:
            claims[attempt] = (str(details.get("worker", "")), at)
        else:
            failures.append(_opened_details(details, salt, job.pk))
    attempts = range(1, job.attempt + 1)
    status = STATUSES[job.status]
    result = WorkhorseTaskResult(
        task=task,
        id=str(job.pk),
        status=status,
        enqueued_at=job.created_at,
        started_at=claims[1][1] if 1 in claims and job.attempt else None,
        finished_at=job.finished_at if status in (SUCCESSFUL, FAILED) else None,
        last_attempted_at=claims[job.attempt][1] if job.attempt in claims else None,
        args=payload["args"],
        kwargs=payload.get("kwargs") or {},
        backend=backend,
        errors=_errors(job.status, opened_text(job.last_error, field=LAST_ERROR, salt=salt, job_id=job.pk), failures),
        worker_ids=[claims[n][0] if n in claims else job.claimed_by for n in attempts],
        enqueue_result=enqueue_result,
    )
    if status == SUCCESSFUL:
        object.__setattr__(result, "_return_value", opened_json(job.result, field=RESULT, salt=salt, job_id=job.pk))
    return result


def _task_of(job: Job, backend: str) -> Task[..., Any]:
    """The task a job runs, with the job's priority and queue, on ``backend``."""
    task = import_task(job.job_type)
    if task is None:
        raise TaskResultDoesNotExist(f"{job.pk} (job type {job.job_type!r} is not a django.tasks task)")
    changes: dict[str, Any] = {}
    if task.priority != job.priority:
        changes["priority"] = job.priority
    if task.queue_name != job.queue:
        changes["queue_name"] = job.queue
    if task.backend != backend:
        changes["backend"] = backend
    if changes:
        with contextlib.suppress(InvalidTask, InvalidTaskBackend):  # else: the task as it is defined
            task = task.using(**changes)
    return task


def _opened_details(details: dict[str, Any], salt: bytes | None, job_id: int) -> dict[str, Any]:
    """A failed event's details with an encrypted job's error opened (``DecryptionError`` if it does not)."""
    error = details.get("error")
    if salt is None or not isinstance(error, str):
        return details
    return {**details, "error": opened_text(error, field=EVENT_ERROR, salt=salt, job_id=job_id)}


def _errors(status: str, last_error: str, failures: list[dict[str, Any]]) -> list[TaskError]:
    """One error per failed attempt; the last one's full text is the job's ``last_error``."""
    errors = []
    used_last_error = False
    for position, details in enumerate(failures):
        text = str(details.get("error", ""))
        if position == len(failures) - 1 and last_error and last_error.startswith(text):
            text, used_last_error = last_error, True
        errors.append(
            TaskError(exception_class_path=str(details.get("exception_class", WORKHORSE_ERROR)), traceback=text)
        )
    if status == "dead" and last_error and not used_last_error:
        # Died without raising on its last attempt: the lease expired, or a shutdown interrupted it.
        errors.append(TaskError(exception_class_path=WORKHORSE_ERROR, traceback=last_error))
    return errors
