"""System checks: PostgreSQL only, and settings within their bounds."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.db import connections

from django_workhorse import conf


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


DURATION_SETTINGS = {
    "WORKHORSE_JOB_RETENTION": ("JOB_RETENTION", "workhorse.E004"),
    "WORKHORSE_MAINTENANCE_INTERVAL": ("MAINTENANCE_INTERVAL", "workhorse.E005"),
    "WORKHORSE_WORKER_STALE_AFTER": ("WORKER_STALE_AFTER", "workhorse.E006"),
}


def _positive_durations() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for setting, (default_name, check_id) in DURATION_SETTINGS.items():
        value = getattr(settings, setting, getattr(conf, f"DEFAULT_{default_name}"))
        if not isinstance(value, timedelta) or value <= timedelta(0):
            errors.append(Error(f"{setting} must be a timedelta > 0, got {value!r}.", id=check_id))
    return errors


@register
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """WORKHORSE_* settings must have the right type and stay within bounds (workhorse.E002-E009)."""
    errors: list[CheckMessage] = []
    size = getattr(settings, "WORKHORSE_MAX_PAYLOAD_BYTES", conf.DEFAULT_MAX_PAYLOAD_BYTES)
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= conf.MAX_PAYLOAD_BYTES_LIMIT:
        errors.append(
            Error(
                f"WORKHORSE_MAX_PAYLOAD_BYTES must be an integer in 1..{conf.MAX_PAYLOAD_BYTES_LIMIT}, got {size!r}.",
                id="workhorse.E002",
            )
        )
    result = getattr(settings, "WORKHORSE_MAX_RESULT_BYTES", conf.DEFAULT_MAX_RESULT_BYTES)
    low, high = conf.MIN_RESULT_BYTES_LIMIT, conf.MAX_RESULT_BYTES_LIMIT
    if not isinstance(result, int) or isinstance(result, bool) or not low <= result <= high:
        errors.append(
            Error(
                f"WORKHORSE_MAX_RESULT_BYTES must be an integer in {low}..{high}, got {result!r}.", id="workhorse.E009"
            )
        )
    channel = getattr(settings, "WORKHORSE_NOTIFY_CHANNEL", conf.DEFAULT_NOTIFY_CHANNEL)
    if not isinstance(channel, str) or not 1 <= len(channel.encode()) <= 63:
        errors.append(
            Error(f"WORKHORSE_NOTIFY_CHANNEL must be a string of 1..63 bytes, got {channel!r}.", id="workhorse.E003")
        )
    errors.extend(_positive_durations())
    errors.extend(_concurrency_limits())
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
    default = getattr(settings, "WORKHORSE_DEFAULT_CONCURRENCY_LIMIT", conf.DEFAULT_CONCURRENCY_LIMIT)
    if not _is_limit(default):
        errors.append(
            Error(
                f"WORKHORSE_DEFAULT_CONCURRENCY_LIMIT must be an integer in {bounds}, got {default!r}.",
                id="workhorse.E007",
            )
        )
    limits = getattr(settings, "WORKHORSE_CONCURRENCY_LIMITS", {})
    if not isinstance(limits, dict) or not all(isinstance(k, str) and _is_limit(v) for k, v in limits.items()):
        errors.append(
            Error(
                f"WORKHORSE_CONCURRENCY_LIMITS must map concurrency keys to integers in {bounds}.", id="workhorse.E008"
            )
        )
    return errors
