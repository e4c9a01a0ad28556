"""``WorkhorseBackend``: django.tasks tasks enqueued as workhorse jobs, run by ``workhorse_worker``.

A task's job type is its ``module_path``; its payload is ``{"args": [...], "kwargs": {...}}``; the
``TaskResult`` id is the job id. Enqueue writes the job in the caller's transaction. The worker
finds the task by importing its module path (see :func:`resolve_handler`) and runs it as Django's
own backends do: ``task_started`` before, ``task_finished`` after, a ``TaskContext`` first when the
task ``takes_context``. ``get_result`` reads the job and its events back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from traceback import format_exception
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import router
from django.utils import timezone
from django.utils.module_loading import import_string

from django_workhorse import conf, eager
from django_workhorse.backends._framework import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_workhorse.backends.task import WorkhorseTask, build_request
from django_workhorse.exceptions import (
    DjangoTaskNotFoundError,
    EnqueueValidationError,
    WorkhorseBackendNotConfiguredError,
    WorkhorseError,
)
from django_workhorse.registry import Handler, add_resolver
from django_workhorse.retry import RetryPolicy
from django_workhorse.storable import json_depth
from django_workhorse.types import EnqueueOptions, EnqueueOutcome, EnqueueResult, JobId
from django_workhorse.validation import MODE_OPTIONS, check_options

if TYPE_CHECKING:
    from django_workhorse.models import Job
    from django_workhorse.worker.context import HandlerContext

    _ResultBase = TaskResult[..., Any]
else:  # Django's runtime TaskResult is not generic (the backport's is).
    _ResultBase = TaskResult

# By value: django-stubs types the members themselves as `...`.
READY, RUNNING = TaskResultStatus("READY"), TaskResultStatus("RUNNING")
SUCCESSFUL, FAILED = TaskResultStatus("SUCCESSFUL"), TaskResultStatus("FAILED")
# Job status -> TaskResult status. A cancelled job is FAILED: django.tasks has no other final state.
STATUSES = {"queued": READY, "running": RUNNING, "succeeded": SUCCESSFUL, "dead": FAILED, "cancelled": FAILED}
# The exception class of an error no exception stands for (a deadline, an expired lease).
WORKHORSE_ERROR = f"{WorkhorseError.__module__}.{WorkhorseError.__qualname__}"
# Backend OPTIONS: the workhorse defaults of every task of the backend, and the database alias.
OPTION_NAMES = ("database", "max_attempts", "retry_policy", "timeout")
MAX_JOB_ID = 2**63 - 1
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkhorseTaskResult(_ResultBase):  # type: ignore[misc]  # django-stubs declare TaskResult unfrozen; it is frozen
    """A ``TaskResult`` that also says what enqueue did: ``enqueue_result.outcome`` is ACCEPTED,
    REPLAYED, COALESCED, REPLACED or NON_REPLACEABLE. ``None`` on results read by ``get_result``."""

    enqueue_result: EnqueueResult | None = field(default=None, compare=False)

    @property
    def job_id(self) -> JobId:
        """The id of the workhorse job (the result id, as an integer)."""
        return int(self.id)


class WorkhorseBackend(BaseTaskBackend):
    """Enqueue django.tasks tasks as durable workhorse jobs, in the caller's transaction.

    ``OPTIONS`` may set ``database`` (the alias jobs are written to; default: the router's) and the
    defaults ``max_attempts``, ``retry_policy`` and ``timeout`` of every task of this backend.
    Priorities are workhorse's 0..100 (higher first): negative ones raise ``InvalidTask``.
    """

    task_class = WorkhorseTask
    supports_defer = True
    supports_async_task = True  # coroutine tasks run through Task.call (async_to_sync) on the worker
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTION_NAMES))
        if unknown:
            raise InvalidTaskBackend(
                f"Unknown OPTIONS for {type(self).__name__} {alias!r}: {', '.join(unknown)} "
                f"(known: {', '.join(OPTION_NAMES)})."
            )
        database = self.options.get("database")
        if database is not None and not isinstance(database, str):
            raise InvalidTaskBackend(f"OPTIONS['database'] of task backend {alias!r} must be a database alias.")
        self.database: str | None = database
        self.defaults: dict[str, Any] = {name: self.options[name] for name in OPTION_NAMES[1:] if name in self.options}
        try:
            check_options(EnqueueOptions(**self.defaults))
        except EnqueueValidationError as exc:
            raise InvalidTaskBackend(f"OPTIONS of task backend {alias!r}: {exc}") from exc

    # -- the framework's contract ------------------------------------------------------------------

    def validate_task(self, task: Task[..., Any]) -> None:
        """Check ``task`` as Django does, then against workhorse's bounds; raise ``InvalidTask``."""
        super().validate_task(task)
        if task.priority < 0:
            raise InvalidTask(
                f"priority must be a whole number between 0 and 100 with {type(self).__name__} "
                "(workhorse runs higher priorities first and has nothing below the default 0)."
            )
        if task.run_after is not None and not timezone.is_aware(task.run_after):
            raise InvalidTask("run_after must be an aware datetime.")
        if len(task.module_path) > conf.MAX_JOB_TYPE_CHARS:
            raise InvalidTask(
                f"The task's module path (its job type) is longer than {conf.MAX_JOB_TYPE_CHARS} characters."
            )
        if isinstance(task, WorkhorseTask):
            _validate_workhorse_options(task)
        try:
            check_options(_static_options(task, self.defaults))
        except EnqueueValidationError as exc:
            raise InvalidTask(str(exc)) from exc

    def enqueue(self, task: Task[P, R], args: list[Any], kwargs: dict[str, Any]) -> TaskResult[P, R]:
        """Write ``task(*args, **kwargs)`` as a job in the caller's transaction; return its READY result.

        A keyed call that maps to an existing job returns that job's current result, with
        ``enqueue_result.outcome`` saying why (REPLAYED, COALESCED...). Raise ``InvalidTask`` for
        an option out of workhorse's bounds, ``TypeError`` for arguments that are not JSON, and
        ``EnqueueIdempotencyConflictError`` when a live key was given a different request.
        """
        from django_workhorse.enqueuing import enqueue_with_result

        self.validate_task(task)
        # Django normalizes the arguments recursively: refuse nesting past the bound before it does.
        if json_depth([args, kwargs]) > conf.MAX_JSON_DEPTH:  # the depth of the payload {"args", "kwargs"}
            raise InvalidTask(f"The task's arguments must be JSON nested at most {conf.MAX_JSON_DEPTH} deep.")
        # Built first: it normalizes the arguments to JSON, raising TypeError as Django's backends do.
        result = self._new_result(task, args, kwargs)
        payload, options = build_request(task, result.args, result.kwargs, self.defaults)
        run_now = eager.is_active()
        try:
            with eager.eager(active=False) if run_now else contextlib.nullcontext():
                enqueued = enqueue_with_result(task.module_path, payload, options, using=self.database)
        except EnqueueValidationError as exc:
            raise InvalidTask(str(exc)) from exc
        if enqueued.outcome is EnqueueOutcome.ACCEPTED:
            object.__setattr__(result, "id", str(enqueued.job_id))
            object.__setattr__(result, "args", payload["args"])
            object.__setattr__(result, "kwargs", payload["kwargs"])
            object.__setattr__(result, "enqueued_at", timezone.now())
            object.__setattr__(result, "enqueue_result", enqueued)
        else:
            result = self._load(enqueued.job_id, enqueue_result=enqueued)
        if enqueued.outcome in (EnqueueOutcome.ACCEPTED, EnqueueOutcome.REPLACED):
            task_enqueued.send(type(self), task_result=result)
        if run_now:  # eager mode: run it now, after task_enqueued, as a worker would
            eager.run_accepted(self._alias(), [enqueued])
            result = self._load(enqueued.job_id, enqueue_result=enqueued)
        return cast("TaskResult[P, R]", result)  # a WorkhorseTaskResult

    def get_result(self, result_id: str) -> WorkhorseTaskResult:
        """Read the task's job back as a ``TaskResult``; raise ``TaskResultDoesNotExist`` if none has this id."""
        text = str(result_id)
        if not text.isascii() or not text.isdigit() or not 0 < int(text) <= MAX_JOB_ID:
            raise TaskResultDoesNotExist(result_id)
        return self._load(int(text))

    def check(self, **kwargs: Any) -> list[Any]:
        """Django's checks, plus: django_workhorse is installed (workhorse.E101), ``database`` exists (E102)."""
        messages: list[Any] = list(super().check(**kwargs))
        if not apps.is_installed("django_workhorse"):
            messages.append(
                checks.Error(
                    f"Task backend {self.alias!r} is a {type(self).__name__}, but django_workhorse is not installed.",
                    hint="Add 'django_workhorse' to INSTALLED_APPS.",
                    id="workhorse.E101",
                )
            )
        if self.database is not None and self.database not in settings.DATABASES:
            messages.append(
                checks.Error(
                    f"OPTIONS['database'] of task backend {self.alias!r} is {self.database!r}, which is not in DATABASES.",
                    id="workhorse.E102",
                )
            )
        return messages

    # -- results -----------------------------------------------------------------------------------

    def _alias(self) -> str:
        from django_workhorse.models import Job

        return self.database or router.db_for_write(Job)

    def _new_result(self, task: Task[..., Any], args: Any, kwargs: Any) -> WorkhorseTaskResult:
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
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    def _load(self, job_id: JobId, *, enqueue_result: EnqueueResult | None = None) -> WorkhorseTaskResult:
        """Build the result of job ``job_id`` from its row and its claimed/failed events."""
        from django_workhorse.models import EventKind, Job, JobEvent

        alias = self._alias()
        job = Job.objects.using(alias).filter(pk=job_id).first()
        if job is None:
            raise TaskResultDoesNotExist(str(job_id))
        task = self._task_of(job)
        payload = job.payload
        if not isinstance(payload, dict) or not isinstance(payload.get("args"), list):
            raise TaskResultDoesNotExist(f"{job_id} (job type {job.job_type!r} is not a django.tasks task)")
        events = (
            JobEvent.objects.using(alias)
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
                failures.append(details)
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
            backend=self.alias,
            errors=_errors(job, failures),
            worker_ids=[claims[n][0] if n in claims else job.claimed_by for n in attempts],
            enqueue_result=enqueue_result,
        )
        if status == SUCCESSFUL:
            object.__setattr__(result, "_return_value", job.result)
        return result

    def _task_of(self, job: Job) -> Task[..., Any]:
        """The task a job runs, with the job's priority and queue, on this backend."""
        task = _import_task(job.job_type)
        if task is None:
            raise TaskResultDoesNotExist(f"{job.pk} (job type {job.job_type!r} is not a django.tasks task)")
        changes: dict[str, Any] = {}
        if task.priority != job.priority:
            changes["priority"] = job.priority
        if task.queue_name != job.queue:
            changes["queue_name"] = job.queue
        if task.backend != self.alias:
            changes["backend"] = self.alias
        if changes:
            with contextlib.suppress(InvalidTask, InvalidTaskBackend):  # else: the task as it is defined
                task = task.using(**changes)
        return task


# -- the worker's side -------------------------------------------------------------------------------


class TaskRunner:
    """The workhorse handler of a django.tasks task: runs one attempt as Django's backends run a task."""

    def __init__(self, job_type: str) -> None:
        self.job_type = job_type

    def __repr__(self) -> str:
        return f"<TaskRunner {self.job_type}>"

    def __call__(self, ctx: HandlerContext, payload: Any) -> Any:
        """Run the task of job ``ctx.job_id``, sending ``task_started`` and ``task_finished``; return its value."""
        backend = _backend_for(self.job_type)
        result = backend._load(ctx.job_id)  # RUNNING, one worker id per attempt so far
        task = result.task
        sender = type(backend)
        task_started.send(sender=sender, task_result=result)
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
            else:
                value = task.call(*result.args, **result.kwargs)
            value = normalize_json(value)  # a value that is not JSON fails the attempt, as in Django
        except KeyboardInterrupt:
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
    that another process enqueued without any registration step.
    """
    if _import_task(job_type) is None:
        return None
    return Handler(job_type, TaskRunner(job_type), takes_context=True, spreads_payload=False)


add_resolver(resolve_handler)


def _import_task(job_type: str) -> Task[..., Any] | None:
    try:
        found = import_string(job_type)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


def _backend_for(job_type: str) -> WorkhorseBackend:
    """The backend a job's task names if it is a WorkhorseBackend, else the first one configured."""
    task = _import_task(job_type)
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


def _errors(job: Job, failures: list[dict[str, Any]]) -> list[TaskError]:
    """One error per failed attempt; the last one's full text is the job's ``last_error``."""
    errors = []
    used_last_error = False
    for position, details in enumerate(failures):
        text = str(details.get("error", ""))
        if position == len(failures) - 1 and job.last_error and job.last_error.startswith(text):
            text, used_last_error = job.last_error, True
        errors.append(
            TaskError(exception_class_path=str(details.get("exception_class", WORKHORSE_ERROR)), traceback=text)
        )
    if job.status == "dead" and job.last_error and not used_last_error:
        # Died without raising on its last attempt: the lease expired, or a shutdown interrupted it.
        errors.append(TaskError(exception_class_path=WORKHORSE_ERROR, traceback=job.last_error))
    return errors


def _static_options(task: Task[..., Any], defaults: dict[str, Any]) -> EnqueueOptions:
    """The options of ``task`` that do not depend on a call, for validation."""
    options: dict[str, Any] = {
        **defaults,
        "queue": task.queue_name,
        "priority": int(task.priority),
        "run_at": task.run_after,
    }
    if isinstance(task, WorkhorseTask):
        for name in ("concurrency_limit", "max_attempts", "retry_policy", "timeout", "deadline"):
            if getattr(task, name) is not None:
                options[name] = getattr(task, name)
        options["tags"] = task.tags
        key = task.concurrency_key
        options["concurrency_key"] = "(per call)" if callable(key) else key
    return EnqueueOptions(**options)


def _validate_workhorse_options(task: WorkhorseTask) -> None:
    modes = task.keyed_mode_names()
    if len(modes) > 1:
        raise InvalidTask(f"A task takes at most one keyed mode; this one sets {', '.join(modes)}.")
    if not isinstance(task.idempotent, bool):
        raise InvalidTask("idempotent must be True or False.")
    for name, mode_class in MODE_OPTIONS.items():
        spec = getattr(task, name)
        if spec is not None and not callable(spec) and not isinstance(spec, mode_class):
            raise InvalidTask(
                f"{name} must be a {mode_class.__name__} or a callable that returns one (or None) for a call."
            )
    if task.debounce is not None and task.run_after is not None:
        raise InvalidTask("run_after cannot be combined with debounce: the debounce window schedules the job.")
    if task.retry_policy is not None and not isinstance(task.retry_policy, RetryPolicy):
        raise InvalidTask("retry_policy must be a django_workhorse.RetryPolicy.")
