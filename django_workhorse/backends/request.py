"""The job a django.tasks call becomes: its payload and its enqueue options.

The payload is ``{"args": [...], "kwargs": {...}}``. A ``WorkhorseTask``'s options join the
backend's defaults and Django's own (queue, priority, run_after); a keyed call gets its key here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django_workhorse.backends._framework import Task, normalize_json
from django_workhorse.backends.task import WorkhorseTask
from django_workhorse.enqueueing.call_keys import call_key
from django_workhorse.enqueueing.validation import MODE_OPTIONS
from django_workhorse.types import EnqueueOptions, Unique

# The options a WorkhorseTask passes on as they are (None: the backend's default).
JOB_OPTIONS = ("concurrency_limit", "max_attempts", "retry_policy", "timeout", "deadline")
# What validation checks in place of a concurrency key that each call computes.
PER_CALL = "(per call)"


def build_request(
    task: Task[..., Any], args: list[Any], kwargs: dict[str, Any], defaults: Mapping[str, Any]
) -> tuple[dict[str, Any], EnqueueOptions]:
    """Return the payload and options that enqueue ``task(*args, **kwargs)`` (already JSON-normalized).

    A keyed call stores its arguments canonically (bound to the signature, defaults applied), so
    ``f(1)`` and ``f(x=1)`` are the same request under the same key. Raise ``TypeError`` if a keyed
    call does not fit the signature.
    """
    options = _task_options(task, defaults)
    payload: dict[str, Any] = {"args": args, "kwargs": kwargs}
    if not isinstance(task, WorkhorseTask):
        return payload, EnqueueOptions(**options)
    key = task.concurrency_key
    options["concurrency_key"] = key(*args, **kwargs) if callable(key) else key
    mode = _keyed_mode(task, args, kwargs)
    if mode is not None:
        bound = task.bind(*args, **kwargs)
        payload = {"args": normalize_json(list(bound.args)), "kwargs": normalize_json(dict(bound.kwargs))}
        options[mode[0]] = mode[1]
    return payload, EnqueueOptions(**options)


def static_options(task: Task[..., Any], defaults: Mapping[str, Any]) -> EnqueueOptions:
    """Return the options of ``task`` that do not depend on a call, for validation."""
    options = _task_options(task, defaults)
    if isinstance(task, WorkhorseTask):
        key = task.concurrency_key
        options["concurrency_key"] = PER_CALL if callable(key) else key
    return EnqueueOptions(**options)


def _task_options(task: Task[..., Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {
        **defaults,
        "queue": task.queue_name,
        "priority": int(task.priority),
        "run_at": task.run_after,
    }
    if isinstance(task, WorkhorseTask):
        options.update((name, getattr(task, name)) for name in JOB_OPTIONS if getattr(task, name) is not None)
        if task.tags:
            options["tags"] = task.tags
    return options


def _keyed_mode(task: WorkhorseTask, args: list[Any], kwargs: dict[str, Any]) -> tuple[str, Any] | None:
    modes: dict[str, Any] = {}  # validate_task lets at most one through, and none with idempotent=True
    for name in MODE_OPTIONS:
        spec = getattr(task, name)
        value = spec(*args, **kwargs) if callable(spec) else spec
        if value is not None:
            modes[name] = value
    key = call_key(lambda: task.derived_key(*args, **kwargs), task_idempotent=task.idempotent, modes=modes)
    if key is not None:
        return "unique", Unique(key)
    return next(iter(modes.items()), None)
