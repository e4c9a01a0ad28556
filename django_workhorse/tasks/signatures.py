"""Calls and function signatures: binding a call as calling the function would, and back again.

``@task`` functions and django.tasks tasks both store a call bound to the function's signature
(defaults applied), so that ``f(1)`` and ``f(x=1)`` are the same request; a call that does not
fit raises ``TypeError`` in the caller, not later in the worker.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

CONTEXT_NAMES = frozenset({"ctx", "context"})


def declares_context(func: Callable[..., Any]) -> bool:
    """Return whether ``func``'s first parameter is the handler context."""
    params = list(inspect.signature(func).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return False
    annotation = params[0].annotation
    named = getattr(annotation, "__name__", annotation)
    return params[0].name in CONTEXT_NAMES or named == "HandlerContext"


def bind_call(
    func: Callable[..., Any], args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any], *, skip_context: bool
) -> inspect.BoundArguments:
    """Bind ``func(*args, **kwargs)`` to ``func``'s signature, defaults applied.

    ``skip_context`` leaves the first parameter out: the context is the runner's to pass, not the
    caller's. Raise ``TypeError``, as calling ``func`` would, if the arguments do not fit.
    """
    signature = inspect.signature(func)
    if skip_context:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound


def bind_arguments(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Bind a call to a handler's signature (defaults applied) and return ``{parameter: value}``.

    The first parameter is left out when it is the handler context (:func:`declares_context`).
    Raise ``TypeError`` in the caller, as calling ``func`` would, if the arguments do not fit.
    """
    return dict(bind_call(func, args, kwargs, skip_context=declares_context(func)).arguments)


def unbind(func: Callable[..., Any], payload: dict[str, Any], *, skip: int) -> tuple[list[Any], dict[str, Any]]:
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
