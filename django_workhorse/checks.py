"""System checks: PostgreSQL only, settings within their bounds, and valid schedules.

Settings are read through ``conf.app_settings``, so a check sees the same value, default included,
as the code that uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Tags, register
from django.db import connections

from django_workhorse import conf
from django_workhorse.conf import app_settings


@register(Tags.database)
def check_database(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Every database alias the checks run for must be PostgreSQL (workhorse.E001)."""
    errors: list[CheckMessage] = []
    for alias in databases or []:
        if connections[alias].vendor != "postgresql":
            errors.append(
                Error(
                    f"django-workhorse needs PostgreSQL; database {alias!r} is {connections[alias].vendor}.",
                    hint="Use the django.db.backends.postgresql engine (PostgreSQL 13+, psycopg 3).",
                    id="workhorse.E001",
                )
            )
    return errors


def _configured(name: str) -> object:
    """Return ``app_settings.<name>`` as configured: typed for the code that uses it, untrusted here."""
    value: object = getattr(app_settings, name)
    return value


# app_settings attribute -> check id; the setting is WORKHORSE_<attribute>.
DURATION_SETTINGS = {
    "JOB_RETENTION": "workhorse.E004",
    "MAINTENANCE_INTERVAL": "workhorse.E005",
    "WORKER_STALE_AFTER": "workhorse.E006",
}


def _positive_durations() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for name, check_id in DURATION_SETTINGS.items():
        value = _configured(name)
        if not isinstance(value, timedelta) or value <= timedelta(0):
            errors.append(Error(f"WORKHORSE_{name} must be a timedelta > 0, got {value!r}.", id=check_id))
    return errors


@register
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """WORKHORSE_* settings must have the right type and stay within bounds (workhorse.E002-E010, E201-E202,
    E209, E301)."""
    errors: list[CheckMessage] = []
    size = _configured("MAX_PAYLOAD_BYTES")
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= conf.MAX_PAYLOAD_BYTES_LIMIT:
        errors.append(
            Error(
                f"WORKHORSE_MAX_PAYLOAD_BYTES must be an integer in 1..{conf.MAX_PAYLOAD_BYTES_LIMIT}, got {size!r}.",
                id="workhorse.E002",
            )
        )
    result = _configured("MAX_RESULT_BYTES")
    low, high = conf.MIN_RESULT_BYTES_LIMIT, conf.MAX_RESULT_BYTES_LIMIT
    if not isinstance(result, int) or isinstance(result, bool) or not low <= result <= high:
        errors.append(
            Error(
                f"WORKHORSE_MAX_RESULT_BYTES must be an integer in {low}..{high}, got {result!r}.", id="workhorse.E009"
            )
        )
    stored = _configured("IDEMPOTENT_RESPONSE_MAX_BYTES")
    low, high = conf.MIN_IDEMPOTENT_RESPONSE_MAX_BYTES, conf.MAX_IDEMPOTENT_RESPONSE_MAX_BYTES
    if not isinstance(stored, int) or isinstance(stored, bool) or not low <= stored <= high:
        errors.append(
            Error(
                f"WORKHORSE_IDEMPOTENT_RESPONSE_MAX_BYTES must be an integer in {low}..{high}, got {stored!r}.",
                id="workhorse.E209",
            )
        )
    channel = _configured("NOTIFY_CHANNEL")
    if not isinstance(channel, str) or not 1 <= len(channel.encode()) <= 63:
        errors.append(
            Error(f"WORKHORSE_NOTIFY_CHANNEL must be a string of 1..63 bytes, got {channel!r}.", id="workhorse.E003")
        )
    errors.extend(_positive_durations())
    errors.extend(_concurrency_limits())
    prepared = _configured("PREPARED_STATEMENTS")
    if not isinstance(prepared, bool):
        errors.append(
            Error(f"WORKHORSE_PREPARED_STATEMENTS must be True or False, got {prepared!r}.", id="workhorse.E010")
        )
    errors.extend(_schedule_settings())
    errors.extend(_metrics_token())
    return errors


def _metrics_token() -> list[CheckMessage]:
    """WORKHORSE_METRICS_TOKEN (workhorse.E301): None, or a token the error never echoes."""
    token = _configured("METRICS_TOKEN")
    if token is None or _is_metrics_token(token):
        return []
    low, high = conf.MIN_METRICS_TOKEN_CHARS, conf.MAX_METRICS_TOKEN_CHARS
    got = f"a string of {len(token)} characters" if isinstance(token, str) else type(token).__name__
    message = f"WORKHORSE_METRICS_TOKEN must be None or {low}..{high} visible ASCII characters, got {got}."
    return [Error(message, id="workhorse.E301")]


def _is_metrics_token(token: Any) -> bool:
    """Whether ``token`` can be the metrics endpoint's bearer token: visible ASCII, within bounds."""
    return (
        isinstance(token, str)
        and conf.MIN_METRICS_TOKEN_CHARS <= len(token) <= conf.MAX_METRICS_TOKEN_CHARS
        and all("!" <= char <= "~" for char in token)
    )


def _schedule_settings() -> list[CheckMessage]:
    """The schedule settings (workhorse.E201, E202)."""
    errors: list[CheckMessage] = []
    low, high = conf.MIN_SCHEDULE_MAX_CATCH_UP, conf.MAX_SCHEDULE_MAX_CATCH_UP
    catch_up = _configured("SCHEDULE_MAX_CATCH_UP")
    if not isinstance(catch_up, int) or isinstance(catch_up, bool) or not low <= catch_up <= high:
        errors.append(
            Error(
                f"WORKHORSE_SCHEDULE_MAX_CATCH_UP must be an integer in {low}..{high}, got {catch_up!r}.",
                id="workhorse.E201",
            )
        )
    shortest, longest = conf.MIN_SCHEDULE_INTERVAL, conf.MAX_SCHEDULE_INTERVAL
    interval = _configured("SCHEDULE_INTERVAL")
    if not isinstance(interval, timedelta) or not shortest <= interval <= longest:
        errors.append(
            Error(
                f"WORKHORSE_SCHEDULE_INTERVAL must be a timedelta in {shortest}..{longest}, got {interval!r}.",
                id="workhorse.E202",
            )
        )
    return errors


def _is_limit(value: Any) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and conf.MIN_CONCURRENCY_LIMIT <= value <= conf.MAX_CONCURRENCY_LIMIT
    )


def _concurrency_limits() -> list[CheckMessage]:
    bounds = f"{conf.MIN_CONCURRENCY_LIMIT}..{conf.MAX_CONCURRENCY_LIMIT}"
    errors: list[CheckMessage] = []
    default = _configured("DEFAULT_CONCURRENCY_LIMIT")
    if not _is_limit(default):
        errors.append(
            Error(
                f"WORKHORSE_DEFAULT_CONCURRENCY_LIMIT must be an integer in {bounds}, got {default!r}.",
                id="workhorse.E007",
            )
        )
    limits = _configured("CONCURRENCY_LIMITS")
    if not isinstance(limits, dict) or not all(isinstance(k, str) and _is_limit(v) for k, v in limits.items()):
        errors.append(
            Error(
                f"WORKHORSE_CONCURRENCY_LIMITS must map concurrency keys to integers in {bounds}.", id="workhorse.E008"
            )
        )
    return errors


@register
def check_schedules(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Every declared schedule must be valid, each error naming it (workhorse.E203-E208).

    E203 an invalid cron expression, E204 an unknown time zone, E205 an unknown task, E206 a
    duplicate name, E207 another value out of bounds, E208 arguments that do not fit the task.
    """
    from django_workhorse.schedule_sources import ARGUMENTS_DO_NOT_FIT, check_arguments, declared_schedules

    declared, problems = declared_schedules()
    errors: list[CheckMessage] = [
        Error(f"Schedule {p.name!r} ({p.origin}): {p.message}.", id=p.check_id) for p in problems
    ]
    for schedule in declared:
        why = check_arguments(schedule)
        if why is not None:
            message = f"Schedule {schedule.name!r} ({schedule.origin}): its arguments do not fit task {schedule.task!r}"
            errors.append(Error(f"{message}: {why}.", id=ARGUMENTS_DO_NOT_FIT))
    return errors
