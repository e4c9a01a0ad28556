"""``WorkhorseBackend``: django.tasks tasks enqueued as workhorse jobs, run by ``workhorse_worker``.

A task's job type is its ``module_path``; its payload is ``{"args": [...], "kwargs": {...}}``; the
``TaskResult`` id is the job id. Enqueue writes the job in the caller's transaction (the request a
call becomes is built in :mod:`.request`); ``get_result`` reads the job and its events back
(:mod:`.results`). The worker runs the task through :mod:`.runner`.
"""

from __future__ import annotations

from typing import Any, ParamSpec, TypeVar, cast

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import router
from django.utils import timezone

from django_workhorse import conf
from django_workhorse.backends._framework import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    task_enqueued,
)
from django_workhorse.backends.request import build_request, static_options
from django_workhorse.backends.results import WorkhorseTaskResult, mark_accepted, new_result, read_result
from django_workhorse.backends.task import WorkhorseTask
from django_workhorse.enqueueing.after_write import runs_inline
from django_workhorse.enqueueing.storable import json_depth
from django_workhorse.enqueueing.validation import MODE_OPTIONS, check_options
from django_workhorse.exceptions import EnqueueValidationError
from django_workhorse.tasks.retry import RetryPolicy
from django_workhorse.types import EnqueueOptions, EnqueueOutcome, EnqueueResult, JobId

# Backend OPTIONS: the workhorse defaults of every task of the backend, and the database alias.
OPTION_NAMES = ("database", "max_attempts", "retry_policy", "timeout")
MAX_JOB_ID = 2**63 - 1
P = ParamSpec("P")
R = TypeVar("R")


class WorkhorseBackend(BaseTaskBackend):
    """Enqueue django.tasks tasks as durable workhorse jobs, in the caller's transaction.

    ``OPTIONS`` may set ``database`` (the alias jobs are written to; default: the router's) and the
    defaults ``max_attempts``, ``retry_policy`` and ``timeout`` of every task of this backend.
    Priorities are workhorse's 0..100 (higher first): negative ones raise ``InvalidTask``.
    """

    task_class = WorkhorseTask
    supports_workhorse_options = True  # what a WorkhorseTask with workhorse options asks of its backend
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
            check_options(static_options(task, self.defaults))
        except EnqueueValidationError as exc:
            raise InvalidTask(str(exc)) from exc

    def enqueue(self, task: Task[P, R], args: list[Any], kwargs: dict[str, Any]) -> TaskResult[P, R]:
        """Write ``task(*args, **kwargs)`` as a job in the caller's transaction; return its READY result.

        A keyed call that maps to an existing job returns that job's current result, with
        ``enqueue_result.outcome`` saying why (REPLAYED, COALESCED...). Raise ``InvalidTask`` for
        an option out of workhorse's bounds, ``TypeError`` for arguments that are not JSON, and
        ``EnqueueIdempotencyConflictError`` when a live key was given a different request.
        """
        from django_workhorse.enqueueing.api import enqueue_with_result

        self.validate_task(task)
        # Django normalizes the arguments recursively: refuse nesting past the bound before it does.
        if json_depth([args, kwargs]) > conf.MAX_JSON_DEPTH:  # the depth of the payload {"args", "kwargs"}
            raise InvalidTask(f"The task's arguments must be JSON nested at most {conf.MAX_JSON_DEPTH} deep.")
        # Built first: it normalizes the arguments to JSON, raising TypeError as Django's backends do.
        result = new_result(task, args, kwargs, backend=self.alias)
        try:  # a derived key is computed from the arguments, checked as the payload first
            payload, options = build_request(task, result.args, result.kwargs, self.defaults)
        except EnqueueValidationError as exc:
            raise InvalidTask(str(exc)) from exc
        announced: list[WorkhorseTaskResult] = []

        def announce(enqueued: EnqueueResult) -> None:  # the job is written; eager mode has not run it
            announced.append(self._enqueued_result(result, payload, enqueued))
            if enqueued.outcome in (EnqueueOutcome.ACCEPTED, EnqueueOutcome.REPLACED):
                task_enqueued.send(type(self), task_result=announced[0])

        run_now = runs_inline()
        try:
            enqueued = enqueue_with_result(
                task.module_path, payload, options, using=self.database, _on_written=announce
            )
        except EnqueueValidationError as exc:
            if announced:  # raised after the write, by a receiver or the task run eagerly: theirs to see
                raise
            raise InvalidTask(str(exc)) from exc
        # Eager mode ran the job: read back how it ended.
        result = self._read(enqueued.job_id, enqueue_result=enqueued) if run_now else announced[0]
        return cast("TaskResult[P, R]", result)  # a WorkhorseTaskResult

    def get_result(self, result_id: str) -> WorkhorseTaskResult:
        """Read the task's job back as a ``TaskResult``; raise ``TaskResultDoesNotExist`` if none has this id."""
        text = str(result_id)
        if not text.isascii() or not text.isdigit() or not 0 < int(text) <= MAX_JOB_ID:
            raise TaskResultDoesNotExist(result_id)
        return self._read(int(text))

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

    # -- reading jobs back -----------------------------------------------------------------------

    def _database(self) -> str:
        from django_workhorse.models import Job

        return self.database or router.db_for_write(Job)

    def _enqueued_result(
        self, result: WorkhorseTaskResult, payload: dict[str, Any], enqueued: EnqueueResult
    ) -> WorkhorseTaskResult:
        """The result of a call just enqueued: ``result`` made the new job's, else the existing job's."""
        if enqueued.outcome is EnqueueOutcome.ACCEPTED:
            mark_accepted(result, payload, enqueued)
            return result
        return self._read(enqueued.job_id, enqueue_result=enqueued)

    def _read(self, job_id: JobId, *, enqueue_result: EnqueueResult | None = None) -> WorkhorseTaskResult:
        return read_result(job_id, backend=self.alias, database=self._database(), enqueue_result=enqueue_result)


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
