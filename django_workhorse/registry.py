"""Handlers by job type: ``@task`` functions and plain ``register(job_type, fn)`` handlers."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django_workhorse.exceptions import HandlerNotRegisteredError

F = TypeVar("F", bound=Callable[..., Any])
CONTEXT_NAMES = frozenset({"ctx", "context"})

_handlers: dict[str, Handler] = {}
# Asked, in order, for a job type nothing registered: the django.tasks backend resolves module paths.
_resolvers: list[Callable[[str], Handler | None]] = []
_task_backends_imported = False


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
        args, kwargs = _unbind(self.func, payload, skip=len(head))
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
    _handlers[handler.job_type] = handler


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


def declares_context(func: Callable[..., Any]) -> bool:
    """Return whether ``func``'s first parameter is the handler context."""
    params = list(inspect.signature(func).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return False
    annotation = params[0].annotation
    named = getattr(annotation, "__name__", annotation)
    return params[0].name in CONTEXT_NAMES or named == "HandlerContext"


def bind_arguments(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Bind a call to ``func``'s signature (defaults applied) and return ``{parameter: value}``.

    Raise ``TypeError`` in the caller, as calling ``func`` would, if the arguments do not fit.
    """
    signature = inspect.signature(func)
    if declares_context(func):
        params = list(signature.parameters.values())[1:]
        signature = signature.replace(parameters=params)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _unbind(func: Callable[..., Any], payload: dict[str, Any], *, skip: int) -> tuple[list[Any], dict[str, Any]]:
    """Turn stored ``{parameter: value}`` back into a call: positionally up to the first missing
    parameter (so ``def f(first, *rest)`` gets ``(1, 2, 3)``), by keyword after it (so a missing
    parameter raises ``TypeError`` instead of shifting the others)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional = True
    for param in list(inspect.signature(func).parameters.values())[skip:]:
        if param.name not in payload:
            positional = False
            continue
        value = payload[param.name]
        if param.kind == param.VAR_POSITIONAL:
            args.extend(value)
        elif param.kind == param.VAR_KEYWORD:
            kwargs.update(value)
        elif param.kind == param.KEYWORD_ONLY or not positional:
            kwargs[param.name] = value
        else:
            args.append(value)
    return args, kwargs
