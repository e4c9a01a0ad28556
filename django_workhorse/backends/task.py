"""``WorkhorseTask``: the ``Task`` of the django.tasks backend, carrying workhorse's enqueue options.

``WorkhorseBackend.task_class`` is this class, so ``@django.tasks.task(...)`` builds one, and from
Django 6.1 (or the ``django-tasks`` 0.12 backport) the decorator's extra keyword arguments arrive
here: ``@task(idempotent=True)``, ``@task(unique=...)``, ``@task(max_attempts=3)``. ``using()``
takes the same options per call, and keeps them when it copies the task.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django_workhorse.backends._framework import InvalidTask, Task, normalize_json
from django_workhorse.enqueueing.call_keys import checked_derived_key
from django_workhorse.enqueueing.validation import MODE_OPTIONS
from django_workhorse.tasks.retry import RetryPolicy
from django_workhorse.tasks.signatures import bind_call
from django_workhorse.types import Debounce, Idempotency, Throttle, Unique

if TYPE_CHECKING:
    _TaskBase = Task[..., Any]
else:  # Django's runtime Task is not generic (the backport's is); both subclass the same way.
    _TaskBase = Task

# The options a WorkhorseTask adds to Django's, besides the keyed modes.
EXTRA_OPTIONS = (
    "concurrency_key",
    "concurrency_limit",
    "max_attempts",
    "retry_policy",
    "timeout",
    "tags",
    "deadline",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkhorseTask(_TaskBase):
    """A django.tasks ``Task`` with workhorse's keyed modes and job options.

    Keyed modes (at most one per task): ``idempotent=True`` derives a ``unique`` key from the task's
    module path and its bound arguments, exactly as ``django_workhorse.task(idempotent=True)`` does;
    ``idempotency``, ``unique``, ``debounce`` and ``throttle`` take a mode value (``Unique("k")``) or
    a callable that receives the call's arguments and returns one, or ``None`` for no key.
    ``concurrency_key`` likewise takes a string or a callable. The other options are those of
    ``EnqueueOptions``; ``None`` keeps the backend's default.
    """

    idempotent: bool = False
    idempotency: Idempotency | Callable[..., Idempotency | None] | None = None
    unique: Unique | Callable[..., Unique | None] | None = None
    debounce: Debounce | Callable[..., Debounce | None] | None = None
    throttle: Throttle | Callable[..., Throttle | None] | None = None
    concurrency_key: str | Callable[..., str | None] | None = None
    concurrency_limit: int | None = None
    max_attempts: int | None = None
    retry_policy: RetryPolicy | None = None
    timeout: timedelta | None = None
    tags: tuple[str, ...] = ()
    deadline: datetime | None = None

    def __post_init__(self) -> None:
        Task.__post_init__(self)  # the backend's validate_task (zero-argument super() fails in slots classes)
        if self.has_workhorse_options():
            backend = self.get_backend()
            # A capability flag, not a class check: the backend module imports this one.
            if not getattr(backend, "supports_workhorse_options", False):
                raise InvalidTask(
                    f"Backend {self.backend!r} ({type(backend).__name__}) cannot honour workhorse options "
                    f"({', '.join(self.workhorse_option_names())}); use a WorkhorseBackend."
                )

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        idempotent: bool | None = None,
        idempotency: Idempotency | Callable[..., Idempotency | None] | None = None,
        unique: Unique | Callable[..., Unique | None] | None = None,
        debounce: Debounce | Callable[..., Debounce | None] | None = None,
        throttle: Throttle | Callable[..., Throttle | None] | None = None,
        concurrency_key: str | Callable[..., str | None] | None = None,
        concurrency_limit: int | None = None,
        max_attempts: int | None = None,
        retry_policy: RetryPolicy | None = None,
        timeout: timedelta | None = None,
        tags: Iterable[str] | None = None,
        deadline: datetime | None = None,
    ) -> WorkhorseTask:
        """Return a copy with these options changed (``None`` leaves one as it is), keeping all the others.

        A keyed mode given here (or ``idempotent=True``) replaces the task's keyed mode;
        ``idempotent=False`` turns the derived key off.
        """
        given: dict[str, Any] = {
            "priority": priority,
            "queue_name": queue_name,
            "run_after": run_after,
            "backend": backend,
            "concurrency_key": concurrency_key,
            "concurrency_limit": concurrency_limit,
            "max_attempts": max_attempts,
            "retry_policy": retry_policy,
            "timeout": timeout,
            "tags": None if tags is None else tuple(tags),
            "deadline": deadline,
        }
        changes = {name: value for name, value in given.items() if value is not None}
        modes = {"idempotency": idempotency, "unique": unique, "debounce": debounce, "throttle": throttle}
        chosen = {name: value for name, value in modes.items() if value is not None}
        if chosen or idempotent:
            changes.update(dict.fromkeys(modes), idempotent=bool(idempotent), **chosen)
        elif idempotent is False:
            changes["idempotent"] = False
        return replace(self, **changes)

    def derived_key(self, *args: Any, **kwargs: Any) -> str:
        """Return the key ``idempotent=True`` derives for this call (docs/django-tasks.md gives the recipe)."""
        args_list, kwargs_dict = _normalized(args, kwargs)
        arguments: dict[str, Any] = normalize_json(dict(self.bind(*args_list, **kwargs_dict).arguments))  # type: ignore[assignment]
        return checked_derived_key(self.module_path, arguments)

    def bind(self, *args: Any, **kwargs: Any) -> inspect.BoundArguments:
        """Bind a call to the task's function, defaults applied; raise ``TypeError`` if it does not fit.

        A ``takes_context`` task's first parameter is left out: the ``TaskContext`` is the worker's.
        """
        return bind_call(self.func, args, kwargs, skip_context=self.takes_context)

    def keyed_mode_names(self) -> list[str]:
        """Return the keyed modes this task sets: ``"idempotent"`` and/or names of ``MODE_OPTIONS``."""
        names = ["idempotent"] if self.idempotent else []
        return names + [name for name in MODE_OPTIONS if getattr(self, name) is not None]

    def workhorse_option_names(self) -> list[str]:
        """Return the workhorse options this task sets (keyed modes first)."""
        return self.keyed_mode_names() + [name for name in EXTRA_OPTIONS if getattr(self, name) not in (None, ())]

    def has_workhorse_options(self) -> bool:
        """Return whether this task sets any option that only a WorkhorseBackend honours."""
        return bool(self.workhorse_option_names())


def _normalized(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    normalized_args: list[Any] = normalize_json(list(args))  # type: ignore[assignment]
    normalized_kwargs: dict[str, Any] = normalize_json(kwargs)  # type: ignore[assignment]
    return normalized_args, normalized_kwargs
