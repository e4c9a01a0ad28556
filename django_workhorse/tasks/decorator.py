"""``@task``: a function that runs on a worker, enqueued by calling its ``enqueue`` method."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypeVar

from django_workhorse import conf
from django_workhorse.admission.breakers import Breaker
from django_workhorse.admission.rate_limits import check_name
from django_workhorse.encryption.jobs import is_encrypted
from django_workhorse.enqueueing.call_keys import call_key, checked_derived_key
from django_workhorse.enqueueing.fingerprints import derived_key
from django_workhorse.enqueueing.validation import MODE_OPTIONS, resolve_options
from django_workhorse.exceptions import BreakerValidationError, ScheduleDefinitionError, TaskDefinitionError
from django_workhorse.outcomes.values import exception_classes
from django_workhorse.schedules.definition import Schedule
from django_workhorse.tasks import registry
from django_workhorse.tasks.registry import Handler, add_handler
from django_workhorse.tasks.retry import RetryPolicy
from django_workhorse.tasks.signatures import bind_arguments, declares_context
from django_workhorse.types import EnqueueOptions, EnqueueRequest, EnqueueResult, JobId, Unique

P = ParamSpec("P")
R = TypeVar("R")

_tasks: dict[str, Task[Any, Any]] = {}


def get_task(name: str) -> Task[Any, Any] | None:
    """Return the ``@task`` registered under ``name`` in this process, else None."""
    return _tasks.get(name)


class Task(Generic[P, R]):
    """A registered function and its default enqueue options."""

    def __init__(
        self,
        func: Callable[..., R],
        *,
        name: str,
        defaults: EnqueueOptions,
        idempotent: bool = False,
        fail_on: tuple[type[BaseException], ...] = (),
        retry_on: tuple[type[BaseException], ...] | None = None,
        breaker: Breaker | None = None,
    ) -> None:
        self.func = func
        self.name = name
        # A task with a breaker keys it by its job type unless a call names another breaker_key.
        self.defaults = defaults if breaker is None else replace(defaults, breaker_key=name)
        self.idempotent = idempotent
        self.fail_on = fail_on
        self.retry_on = retry_on
        self.breaker = breaker
        handler = Handler(
            name, func, takes_context=declares_context(func), spreads_payload=True, defaults=self.defaults,
            fail_on=fail_on, retry_on=retry_on, breaker=breaker,
        )  # fmt: skip
        add_handler(handler)
        _tasks[name] = self

    def __repr__(self) -> str:
        return f"<Task {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        """Call the function directly, in this process."""
        return self.func(*args, **kwargs)

    def enqueue(self, *args: Any, **kwargs: Any) -> JobId:
        """Enqueue a call with the task's default options; return the job id."""
        return self.apply_async(args, kwargs).job_id

    delay = enqueue

    def enqueue_with_result(self, *args: Any, **kwargs: Any) -> EnqueueResult:
        """Enqueue a call like :meth:`enqueue`, returning the job id and the outcome."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        using: str | None = None,
        unique_key: str | None = None,
        idempotency_key: str | None = None,
        idempotent: bool | None = None,
        **options: Any,
    ) -> EnqueueResult:
        """Enqueue a call with option overrides (``queue=``, ``debounce=``…).

        Arguments are bound to the function's signature now: a call that does not fit raises
        ``TypeError`` here, not later in the worker. Keys, first set wins: ``unique_key``, then
        ``idempotency_key`` (both in ``unique`` mode), then a key derived from the call when
        ``idempotent`` (default: the task's ``idempotent=``) is true.
        """
        from django_workhorse.enqueueing.api import enqueue_with_result

        request = self.as_request(
            args, kwargs, unique_key=unique_key, idempotency_key=idempotency_key, idempotent=idempotent, **options
        )
        return enqueue_with_result(request.job_type, request.payload, request.options, using=using)

    def as_request(
        self,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        unique_key: str | None = None,
        idempotency_key: str | None = None,
        idempotent: bool | None = None,
        **options: Any,
    ) -> EnqueueRequest:
        """Build the :class:`EnqueueRequest` that :meth:`apply_async` would submit, for ``enqueue_many``."""
        payload = bind_arguments(self.func, tuple(args), dict(kwargs or {}))
        encrypted = options.get("encrypted", self.defaults.encrypted)
        key = call_key(
            lambda: checked_derived_key(self.name, payload, encrypted=encrypted),
            unique_key=unique_key,
            idempotency_key=idempotency_key,
            idempotent=idempotent,
            task_idempotent=self.idempotent,
            modes=[name for name in MODE_OPTIONS if options.get(name) is not None],
        )
        if key is not None:
            options["unique"] = Unique(key)
        return EnqueueRequest(self.name, payload, resolve_options(None, options, self.defaults))

    def s(self, *args: Any, **kwargs: Any) -> EnqueueRequest:
        """Build the :class:`EnqueueRequest` of a call with the task's default options, for a workflow step.

        Arguments are bound now (``TypeError`` here for a call that does not fit). No key is ever
        derived, even for an ``idempotent=True`` task: a workflow's own key deduplicates its steps.
        """
        return self.as_request(args, kwargs, idempotent=False)

    def signature(
        self, args: tuple[Any, ...] | list[Any] = (), kwargs: dict[str, Any] | None = None, **options: Any
    ) -> EnqueueRequest:
        """Build the :class:`EnqueueRequest` of a call with option overrides (``queue=``, ``priority=``…).

        Like :meth:`s`: arguments bound now, no derived key. Options are those of :meth:`apply_async`
        but ``using`` and ``idempotent`` (a step has no key of its own).
        """
        if "idempotent" in options:
            raise TypeError("signature() takes no idempotent=: a step never derives a key of its own")
        return self.as_request(args, kwargs, idempotent=False, **options)

    def derived_key(self, *args: Any, **kwargs: Any) -> str:
        """Return the key ``idempotent=True`` derives for this call (see docs/derived-keys.md).

        Keyed by ``WORKHORSE_ENCRYPTION``'s fingerprint key when the task's calls are encrypted.
        """
        encrypted = is_encrypted(self.defaults.encrypted)
        return derived_key(self.name, bind_arguments(self.func, args, kwargs), encrypted=encrypted)


def task(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int = conf.DEFAULT_MAX_ATTEMPTS,
    retry_policy: RetryPolicy | None = None,
    timeout: timedelta | None = None,
    idempotent: bool = False,
    schedule: Schedule | None = None,
    schedules: Sequence[Schedule] = (),
    fail_on: type[BaseException] | Sequence[type[BaseException]] = (),
    retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
    breaker: Breaker | None = None,
    rate_limit: str | None = None,
    encrypted: bool | None = None,
) -> Any:
    """Turn a function into a :class:`Task` (usable as ``@task`` or ``@task(queue=...)``).

    The job type is ``name`` or the function's dotted path. A first parameter named ``ctx`` or
    annotated ``HandlerContext`` receives the handler context. ``idempotent=True`` gives every
    call a key derived from the task name and its bound arguments, in ``unique`` mode: a repeat
    while the job is queued or running coalesces onto it.

    ``schedule=Schedule(...)`` runs the task periodically (named after the task); ``schedules=[...]``
    declares several (named ``<task>[0]``, ``<task>[1]``… unless a ``Schedule`` has a ``name``).

    ``fail_on=(PermissionDenied, ...)``: exception classes that make the job dead at once (a dead
    letter), whatever attempts remain. ``retry_on=(TransportError, ...)``: when given, the only
    exceptions that retry; any other makes the job dead at once. Raise ``TaskDefinitionError`` if
    either is not an exception class or a tuple or list of them.

    ``breaker=Breaker(...)`` runs the task's jobs behind a circuit breaker keyed by the job type,
    or by the ``breaker_key`` a call passes (a destination); see docs/circuit-breakers.md.

    ``rate_limit="stripe"`` starts the task's jobs under that limit of ``WORKHORSE_RATE_LIMITS``
    unless a call names another (checked at enqueue); see docs/rate-limits.md.

    ``encrypted=True`` encrypts the task's jobs (payload, result, errors, checkpoints) under
    ``WORKHORSE_ENCRYPTION`` unless a call says ``encrypted=False``; None follows ``encrypt_all``
    (decision 0024). Whether it is configured is checked at enqueue.
    """
    fail_classes = exception_classes(fail_on, "fail_on", TaskDefinitionError)
    retry_classes = None if retry_on is None else exception_classes(retry_on, "retry_on", TaskDefinitionError)
    if breaker is not None and not isinstance(breaker, Breaker):
        raise BreakerValidationError(field="breaker", bound="a Breaker value", value=type(breaker).__name__)
    if schedule is not None and schedules:
        raise ScheduleDefinitionError(field="schedules", bound="schedule= or schedules=, not both")
    declared = [schedule] if schedule is not None else list(schedules)
    for item in declared:
        if not isinstance(item, Schedule):
            raise ScheduleDefinitionError(field="schedule", bound="Schedule values", value=type(item).__name__)
    if rate_limit is not None:
        check_name(rate_limit)
    defaults = EnqueueOptions(
        queue=queue, priority=priority, max_attempts=max_attempts, retry_policy=retry_policy, timeout=timeout,
        rate_limit=rate_limit, encrypted=encrypted,
    )  # fmt: skip

    def decorate(fn: Callable[..., Any]) -> Task[Any, Any]:
        made: Task[Any, Any] = Task(
            fn,
            name=name or f"{fn.__module__}.{fn.__qualname__}",
            defaults=defaults,
            idempotent=idempotent,
            fail_on=fail_classes,
            retry_on=retry_classes,
            breaker=breaker,
        )
        if declared:
            registry.add_task_schedules(made.name, declared, indexed=schedule is None)
        return made

    return decorate(func) if func is not None else decorate
