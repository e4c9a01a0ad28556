"""Handlers by job type: ``@task`` functions and plain ``register(job_type, fn)`` handlers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django_workhorse.exceptions import HandlerNotRegisteredError
from django_workhorse.tasks.signatures import declares_context, unbind

if TYPE_CHECKING:
    from django_workhorse.schedules.definition import Schedule

F = TypeVar("F", bound=Callable[..., Any])

_handlers: dict[str, Handler] = {}
# Asked, in order, for a job type nothing registered: the django.tasks backend resolves module paths.
_resolvers: list[Callable[[str], Handler | None]] = []
_task_backends_imported = False
# Counts registrations, so that what is derived from the registry (schedules) knows to look again.
generation = 0


@dataclass(frozen=True)
class Handler:
    """How to call the code registered for a job type."""

    job_type: str
    func: Callable[..., Any]
    takes_context: bool
    # Task functions get their bound arguments back as parameters; plain handlers get the payload.
    spreads_payload: bool

    def call(self, payload: Any, context: Any) -> Any:
        """Call the handler with ``payload`` (and ``context`` if it declares one)."""
        head = (context,) if self.takes_context else ()
        if not self.spreads_payload:
            return self.func(*head, payload)
        args, kwargs = unbind(self.func, payload, skip=len(head))
        return self.func(*head, *args, **kwargs)


def register(job_type: str, func: F | None = None) -> Any:
    """Register ``func`` as the handler of ``job_type``; usable as ``@register("type")`` too.

    The handler is called as ``func(payload)``, or ``func(ctx, payload)`` when its first
    parameter is named ``ctx``/``context`` or annotated ``HandlerContext``.
    """

    def decorate(fn: F) -> F:
        add_handler(Handler(job_type, fn, takes_context=declares_context(fn), spreads_payload=False))
        return fn

    return decorate(func) if func is not None else decorate


def add_handler(handler: Handler) -> None:
    """Register ``handler``; a job type has exactly one handler (re-registering replaces it)."""
    global generation
    _handlers[handler.job_type] = handler
    generation += 1


def registered(job_type: str) -> Handler | None:
    """Return the handler registered for ``job_type`` in this process (resolvers are not asked)."""
    return _handlers.get(job_type)


def add_resolver(resolver: Callable[[str], Handler | None]) -> None:
    """Let ``resolver`` supply the handler of a job type that has none registered (once; it is then kept)."""
    if resolver not in _resolvers:
        _resolvers.append(resolver)


def get_handler(job_type: str) -> Handler:
    """Return the handler of ``job_type``. Raise ``HandlerNotRegisteredError`` if there is none."""
    handler = _handlers.get(job_type)
    if handler is not None:
        return handler
    _import_task_backends()
    for resolver in _resolvers:
        handler = resolver(job_type)
        if handler is not None:
            add_handler(handler)
            return handler
    raise HandlerNotRegisteredError(job_type)


def _import_task_backends() -> None:
    """Import the backends of ``settings.TASKS`` once, so that a worker that never built one still
    gets the resolvers they add (``django_workhorse.backends`` adds the django.tasks one)."""
    global _task_backends_imported
    if _task_backends_imported:
        return
    _task_backends_imported = True
    from django.conf import settings
    from django.utils.module_loading import import_string

    configured = getattr(settings, "TASKS", None)
    for params in configured.values() if isinstance(configured, dict) else ():
        backend = params.get("BACKEND") if isinstance(params, dict) else None
        if isinstance(backend, str):
            with contextlib.suppress(ImportError):  # a broken path is Django's to report
                import_string(backend)


# Task name -> the (schedule name, schedule) pairs its @task declared, in declaration order; a task
# declared again (a module imported again) replaces its entries. ``schedules.sources`` reads them:
# the schedules depend on the tasks, never the other way round.
task_schedules: dict[str, list[tuple[str, Schedule]]] = {}


def add_task_schedules(task_name: str, schedules: list[Schedule], *, indexed: bool) -> None:
    """Declare the schedules of a ``@task``: named by ``Schedule.name``, else the task name (with
    ``[i]`` when declared with ``schedules=``)."""
    global generation
    task_schedules[task_name] = [
        (schedule.name or (f"{task_name}[{i}]" if indexed else task_name), schedule)
        for i, schedule in enumerate(schedules)
    ]
    generation += 1
