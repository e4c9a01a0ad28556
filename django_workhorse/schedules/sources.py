"""Where schedules are declared, and what each of their ticks enqueues.

Two sources: ``@task(schedule=...)`` / ``@task(schedules=[...])`` (collected when the task's module
is imported; every installed app's ``tasks`` module is imported before the first read) and the
``WORKHORSE_SCHEDULES`` setting, read at each call so ``override_settings`` works. A setting entry
names its task: a ``@task`` name, a job type registered with ``register()`` (its payload is the
schedule's ``kwargs``) or a ``django.tasks`` task by module path.

Problems (a definition out of bounds, an unknown task, a duplicate name, arguments that do not fit)
are reported, never raised: the system checks show them (``workhorse.E203``-``E208``) and the
evaluation leaves those schedules out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import autodiscover_modules

from django_workhorse.conf import app_settings
from django_workhorse.enqueueing.prepared import PreparedJob
from django_workhorse.enqueueing.validation import prepare
from django_workhorse.exceptions import EnqueueValidationError, ScheduleDefinitionError
from django_workhorse.schedules.definition import Schedule, check_schedule_name, definition, definition_digest
from django_workhorse.tasks import registry
from django_workhorse.tasks.decorator import get_task
from django_workhorse.types import EnqueueOptions, EnqueueRequest, Idempotency

SETTING = "WORKHORSE_SCHEDULES"
# The keys of a WORKHORSE_SCHEDULES entry: "task" and the fields of Schedule but its name.
ENTRY_KEYS = ("task", "cron", "every", "timezone", "catch_up", "overlap", "args", "kwargs", "queue", "priority")

# Check ids, by kind of problem.
INVALID_CRON = "workhorse.E203"
UNKNOWN_TIMEZONE = "workhorse.E204"
UNKNOWN_TASK = "workhorse.E205"
DUPLICATE_NAME = "workhorse.E206"
INVALID_DEFINITION = "workhorse.E207"
ARGUMENTS_DO_NOT_FIT = "workhorse.E208"
_CHECK_BY_FIELD = {"cron": INVALID_CRON, "timezone": UNKNOWN_TIMEZONE}

_discovered = False
# Bumped when a source changes; declared_schedules keeps its answer for one generation.
_generation = 0
_cached: tuple[tuple[int, int], tuple[list[DeclaredSchedule], list[ScheduleProblem]]] | None = None
_discover_lock = threading.Lock()

# What a tick of a schedule enqueues, without its key.
RequestBuilder = Callable[[Schedule], EnqueueRequest]


@dataclass(frozen=True)
class DeclaredSchedule:
    """A valid schedule, with its task and where it was declared."""

    name: str
    task: str
    schedule: Schedule
    origin: str
    build: RequestBuilder
    definition: dict[str, Any]
    digest: str

    def prepare(self, key: Idempotency | None, scheduled_for: datetime | None) -> PreparedJob:
        """Return the checked job one run of the schedule enqueues: the task's request under ``key``,
        standing for ``scheduled_for``. Raise as ``prepare`` (or the task's signature) does."""
        base = self.build(self.schedule)
        options = base.options if key is None else replace(base.options, idempotency=key)
        return replace(prepare(base.job_type, base.payload, options), scheduled_for=scheduled_for)


@dataclass(frozen=True)
class ScheduleProblem:
    """Why a declared schedule cannot run, for the system checks."""

    name: str
    origin: str
    message: str
    check_id: str


def declared_schedules() -> tuple[list[DeclaredSchedule], list[ScheduleProblem]]:
    """Return the valid schedules of every source (``@task`` declarations in ``tasks.registry``,
    and ``WORKHORSE_SCHEDULES``) and the problems of the others.

    Two declarations with one name are both left out (``workhorse.E206``). The answer is kept
    until a task declares schedules, a handler is registered or the settings change.
    """
    global _cached
    _discover()
    key = (_generation, registry.generation)
    if _cached is None or _cached[0] != key:
        _cached = (key, _read_sources())
    return _cached[1]


@receiver(setting_changed)
def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    global _generation
    if setting in (SETTING, "TASKS"):
        _generation += 1


def _read_sources() -> tuple[list[DeclaredSchedule], list[ScheduleProblem]]:
    found: list[DeclaredSchedule] = []
    problems: list[ScheduleProblem] = []
    for task_name, entries in list(registry.task_schedules.items()):
        for name, schedule in entries:
            origin = f"@task {task_name}"
            _add(found, problems, name, task_name, schedule, origin)
    for name, entry in _setting_entries(problems):
        origin = f"{SETTING}[{name!r}]"
        parsed = _parse_entry(name, entry, origin, problems)
        if parsed is not None:
            _add(found, problems, name, parsed[0], parsed[1], origin)
    return _without_duplicates(found, problems), problems


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    with _discover_lock:
        if not _discovered:
            autodiscover_modules("tasks")
            _discovered = True


def _setting_entries(problems: list[ScheduleProblem]) -> list[tuple[str, Any]]:
    configured: object = app_settings.SCHEDULES
    if not isinstance(configured, Mapping):
        problems.append(
            ScheduleProblem("", SETTING, f"{SETTING} must be a dict of schedule name -> definition", INVALID_DEFINITION)
        )
        return []
    entries = []
    for name, entry in configured.items():
        try:
            check_schedule_name(name)
        except ScheduleDefinitionError as exc:
            problems.append(ScheduleProblem(str(name), SETTING, f"its name: {exc}", INVALID_DEFINITION))
            continue
        entries.append((name, entry))
    return entries


def _parse_entry(name: str, entry: Any, origin: str, problems: list[ScheduleProblem]) -> tuple[str, Schedule] | None:
    def problem(message: str, check_id: str = INVALID_DEFINITION) -> None:
        problems.append(ScheduleProblem(name, origin, message, check_id))

    if not isinstance(entry, Mapping):
        problem(f"must be a dict with 'task' and 'cron' or 'every', got {type(entry).__name__}")
        return None
    unknown = sorted(str(key) for key in entry if key not in ENTRY_KEYS)
    if unknown:
        problem(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(ENTRY_KEYS)}")
        return None
    task = entry.get("task")
    if not isinstance(task, str) or not task:
        problem("'task' must name a task (a @task name, a registered job type or a django.tasks module path)")
        return None
    fields = {key: value for key, value in entry.items() if key != "task"}
    if "args" in fields and isinstance(fields["args"], list):
        fields["args"] = tuple(fields["args"])
    try:
        schedule = Schedule(**fields, name=name)
    except ScheduleDefinitionError as exc:
        problem(str(exc), _CHECK_BY_FIELD.get(exc.field, INVALID_DEFINITION))
        return None
    except TypeError as exc:
        problem(str(exc))
        return None
    return task, schedule


def _add(
    found: list[DeclaredSchedule],
    problems: list[ScheduleProblem],
    name: str,
    task: str,
    schedule: Schedule,
    origin: str,
) -> None:
    build = _builder(task, schedule)
    if build is None:
        message = f"task {task!r} is neither a @task, a registered job type nor a django.tasks task"
        problems.append(ScheduleProblem(name, origin, message, UNKNOWN_TASK))
        return
    data = definition(schedule, task)
    found.append(DeclaredSchedule(name, task, schedule, origin, build, data, definition_digest(data)))


def _without_duplicates(found: list[DeclaredSchedule], problems: list[ScheduleProblem]) -> list[DeclaredSchedule]:
    origins: dict[str, list[str]] = {}
    for declared in found:
        origins.setdefault(declared.name, []).append(declared.origin)
    for name, where in origins.items():
        if len(where) > 1:
            message = f"the name is declared {len(where)} times ({'; '.join(where)}); names must be unique"
            problems.append(ScheduleProblem(name, where[0], message, DUPLICATE_NAME))
    return [declared for declared in found if len(origins[declared.name]) == 1]


def _builder(task: str, schedule: Schedule) -> RequestBuilder | None:
    """Return how a tick of ``schedule`` becomes a request for ``task``, or None if no task has that name."""
    overrides: dict[str, Any] = {}
    if schedule.queue is not None:
        overrides["queue"] = schedule.queue
    if schedule.priority is not None:
        overrides["priority"] = schedule.priority
    declared = get_task(task)
    if declared is not None:
        return lambda s: declared.as_request(s.args, dict(s.kwargs), idempotent=False, **overrides)
    if registry.registered(task) is not None:
        return lambda s: EnqueueRequest(task, dict(s.kwargs), EnqueueOptions(**overrides))
    return _django_task_builder(task, overrides)


def _django_task_builder(task: str, overrides: dict[str, Any]) -> RequestBuilder | None:
    try:
        from django_workhorse.backends._framework import task_backends
        from django_workhorse.backends.request import build_request
        from django_workhorse.backends.results import import_task
    except ImportError:  # no django.tasks in this Django
        return None
    found = import_task(task)
    if found is None:
        return None

    def build(schedule: Schedule) -> EnqueueRequest:
        defaults = getattr(task_backends[found.backend], "defaults", {})
        payload, options = build_request(found, list(schedule.args), dict(schedule.kwargs), defaults)
        return EnqueueRequest(found.module_path, payload, replace(options, **overrides))

    return build


def check_arguments(declared: DeclaredSchedule) -> str | None:
    """Return why a tick's request would be refused (arguments that do not fit, bounds), else None."""
    try:
        declared.prepare(None, None)
    except (TypeError, ValueError, EnqueueValidationError, LookupError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
