"""Handlers by job type: ``@task`` functions and plain ``register(job_type, fn)`` handlers."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django_workhorse.exceptions import HandlerNotRegisteredError
from django_workhorse.tasks.signatures import declares_context, unbind

if TYPE_CHECKING:
    from django_workhorse.admission.breakers import Breaker
    from django_workhorse.schedules.definition import Schedule
    from django_workhorse.types import EnqueueOptions

F = TypeVar("F", bound=Callable[..., Any])

_handlers: dict[str, Handler] = {}
# Asked, in order, for a job type nothing registered: the django.tasks backend resolves module paths.
_resolvers: list[Callable[[str], Handler | None]] = []
# What each resolver may supply, as module prefixes: what a worker advertises for it (capabilities()).
_resolver_prefixes: list[Callable[[], list[str]]] = []
# The job types a resolver supplied (kept in _handlers): advertised by their resolver's prefixes only,
# so what a worker claims does not depend on what its process happened to resolve before.
_resolved: set[str] = set()
_task_backends_imported = False
# Whether this process imported the installed apps' tasks modules, for task_defaults.
_tasks_discovered = _discovering = False
_discover_lock = threading.RLock()
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
    # A @task's enqueue options, which every enqueue of its job type starts from (decision 0020).
    defaults: EnqueueOptions | None = None
    # @task(fail_on=, retry_on=): exceptions that make the job dead at once, or (when given) the
    # only ones that retry.
    fail_on: tuple[type[BaseException], ...] = ()
    retry_on: tuple[type[BaseException], ...] | None = None
    # A @task's circuit breaker: the policy of its job type's breaker, and of its per-call keys.
    breaker: Breaker | None = None

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
    _resolved.discard(handler.job_type)
    generation += 1


def registered(job_type: str) -> Handler | None:
    """Return the handler registered for ``job_type`` in this process (resolvers are not asked)."""
    return _handlers.get(job_type)


def task_defaults(job_type: object) -> EnqueueOptions | None:
    """Return the enqueue defaults of the ``@task`` named ``job_type``, or None (a plain handler, or none).

    A job type this process has no handler for makes it import every installed app's ``tasks``
    module, once, as the worker does: a process that enqueues only by name still finds the task.
    """
    if not isinstance(job_type, str):  # refused later, naming the field
        return None
    handler = _handlers.get(job_type)
    if handler is None and not _tasks_discovered:
        _discover_tasks()
        handler = _handlers.get(job_type)
    return None if handler is None else handler.defaults


def _discover_tasks() -> None:
    global _tasks_discovered, _discovering
    from django.apps import apps

    if not apps.ready:  # called while the apps load: look again later
        return
    with _discover_lock:  # other threads wait for the defaults; a tasks module that enqueues does not
        if _tasks_discovered or _discovering:
            return
        from django.utils.module_loading import autodiscover_modules

        _discovering = True
        try:
            autodiscover_modules("tasks")
        finally:  # a module that fails to import raises here once, as it does when the worker starts
            _tasks_discovered, _discovering = True, False


def add_resolver(resolver: Callable[[str], Handler | None], *, prefixes: Callable[[], list[str]] | None = None) -> None:
    """Let ``resolver`` supply the handler of a job type that has none registered (once; it is then kept).

    ``prefixes`` says which job types it may supply: those that start with one of the module names it
    returns followed by a dot. A worker advertises them (``capabilities``) and claims such jobs.
    """
    if resolver not in _resolvers:
        _resolvers.append(resolver)
        if prefixes is not None:
            _resolver_prefixes.append(prefixes)


def capabilities() -> list[str]:
    """Return the job types this process has handlers for, as a worker advertises them: each registered
    job type, then ``module.*`` for each module prefix a resolver (the django.tasks backend's) may supply.

    A worker's claim takes only jobs whose type is in this list or starts with one of its ``module.``
    prefixes (decision 0021, "Capability").
    """
    _import_task_backends()
    prefixes = sorted({f"{prefix}.*" for listed in _resolver_prefixes for prefix in listed()})
    return sorted(name for name in _handlers if name not in _resolved) + prefixes


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
            _resolved.add(job_type)
            return handler
    raise HandlerNotRegisteredError(job_type)


def can_run(job_types: Sequence[str] | None, job_type: str) -> bool:
    """Return whether a worker that registered ``job_types`` (``capabilities()``) claims jobs of ``job_type``
    (None: a worker from before capabilities, which claims any type)."""
    if job_types is None or job_type in job_types:
        return True
    return any(entry.endswith(".*") and job_type.startswith(entry[:-1]) for entry in job_types)


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
