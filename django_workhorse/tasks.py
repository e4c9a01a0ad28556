"""``@task``: a function that runs on a worker, enqueued by calling its ``enqueue`` method."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypeVar

from django_workhorse.registry import Handler, add_handler, bind_arguments, declares_context
from django_workhorse.retry import RetryPolicy
from django_workhorse.types import EnqueueOptions, EnqueueResult, JobId

P = ParamSpec("P")
R = TypeVar("R")


class Task(Generic[P, R]):
    """A registered function and its default enqueue options."""

    def __init__(
        self, func: Callable[..., R], *, name: str, defaults: EnqueueOptions, idempotent: bool = False
    ) -> None:
        self.func = func
        self.name = name
        self.defaults = defaults
        self.idempotent = idempotent
        add_handler(Handler(name, func, takes_context=declares_context(func), spreads_payload=True))

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
        **options: Any,
    ) -> EnqueueResult:
        """Enqueue a call with option overrides (``queue=``, ``idempotency=``…).

        Arguments are bound to the function's signature now: a call that does not fit raises
        ``TypeError`` here, not later in the worker.
        """
        from django_workhorse.enqueuing import enqueue_with_result

        payload = bind_arguments(self.func, tuple(args), dict(kwargs or {}))
        if self.idempotent:
            raise NotImplementedError("derived keys (idempotent=True) use the unique mode, which is not available yet")
        return enqueue_with_result(self.name, payload, self.defaults, using=using, **options)


def task(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int = 25,
    retry_policy: RetryPolicy | None = None,
    timeout: timedelta | None = None,
    idempotent: bool = False,
) -> Any:
    """Turn a function into a :class:`Task` (usable as ``@task`` or ``@task(queue=...)``).

    The job type is ``name`` or the function's dotted path. A first parameter named ``ctx`` or
    annotated ``HandlerContext`` receives the handler context. ``idempotent=True`` (derived
    unique keys) is accepted but enqueueing such a task raises ``NotImplementedError`` until the
    unique mode is available.
    """
    defaults = EnqueueOptions(
        queue=queue, priority=priority, max_attempts=max_attempts, retry_policy=retry_policy, timeout=timeout
    )

    def decorate(fn: Callable[..., Any]) -> Task[Any, Any]:
        return Task(fn, name=name or f"{fn.__module__}.{fn.__qualname__}", defaults=defaults, idempotent=idempotent)

    return decorate(func) if func is not None else decorate
