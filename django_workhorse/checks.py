"""System checks: PostgreSQL only, settings within their bounds, valid schedules, prepared
statements only where the connection keeps them, no stored value sealed under a key that is no
longer configured, and (``check --deploy``) no test-only setting.

Settings are read through ``conf.app_settings``, so a check sees the same value, default included,
as the code that uses it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, ProgrammingError, connections, transaction

from django_workhorse import conf, sql
from django_workhorse.admission import rate_limits
from django_workhorse.admission.fair import QUEUE_OPTIONS
from django_workhorse.conf import app_settings
from django_workhorse.encryption.keys import configured_key_ids
from django_workhorse.encryption.validation import setting_problems as encryption_problems
from django_workhorse.enqueueing.validation import check_queue
from django_workhorse.exceptions import InvalidArgumentError

# Set while the commands that evaluate or show the schedules run the checks (see
# schedule_problems_reported_elsewhere).
_schedules_reported_elsewhere: ContextVar[bool] = ContextVar("workhorse_schedules_reported_elsewhere", default=False)
# Set while the worker's and the scheduler's start runs the checks (see stored_keys_left_out).
_stored_keys_left_out: ContextVar[bool] = ContextVar("workhorse_stored_keys_left_out", default=False)

logger = logging.getLogger(__name__)


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
                    hint="Use the django.db.backends.postgresql engine (PostgreSQL 14+, 15+ with Django 6.1; psycopg 3).",
                    id="workhorse.E001",
                )
            )
    return errors


def _configured(name: str) -> object:
    """Return ``app_settings.<name>`` as configured: typed for the code that uses it, untrusted here."""
    value: object = getattr(app_settings, name)
    return value


# app_settings attribute -> check id; the setting is WORKHORSE_<attribute>. A channel is a
# PostgreSQL identifier: at most 63 bytes.
CHANNEL_SETTINGS = {"NOTIFY_CHANNEL": "workhorse.E003", "RESULT_CHANNEL": "workhorse.E012"}
DURATION_SETTINGS = {
    "JOB_RETENTION": "workhorse.E004",
    "MAINTENANCE_INTERVAL": "workhorse.E005",
    "WORKER_STALE_AFTER": "workhorse.E006",
    "RESULT_RETENTION": "workhorse.E011",
}


def _result_listen_database() -> list[CheckMessage]:
    value = _configured("RESULT_LISTEN_DATABASE")
    if value is None or value == conf.NO_RESULT_LISTENER or (isinstance(value, str) and value in settings.DATABASES):
        return []
    message = f"WORKHORSE_RESULT_LISTEN_DATABASE must be None, 'none' or an alias of DATABASES, got {value!r}."
    return [Error(message, id="workhorse.E013")]


def _positive_durations() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for name, check_id in DURATION_SETTINGS.items():
        value = _configured(name)
        if not isinstance(value, timedelta) or value <= timedelta(0):
            errors.append(Error(f"WORKHORSE_{name} must be a timedelta > 0, got {value!r}.", id=check_id))
    return errors


@register
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """WORKHORSE_* settings must have the right type and stay within bounds (workhorse.E002-E022, E201-E202,
    E209, E301, E401, E402, E410-E411, E501)."""
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
    for name, check_id in CHANNEL_SETTINGS.items():
        channel = _configured(name)
        if not isinstance(channel, str) or not 1 <= len(channel.encode()) <= 63:
            errors.append(Error(f"WORKHORSE_{name} must be a string of 1..63 bytes, got {channel!r}.", id=check_id))
    errors.extend(_positive_durations())
    errors.extend(_result_listen_database())
    errors.extend(_concurrency_limits())
    prepared = _configured("PREPARED_STATEMENTS")
    if not isinstance(prepared, bool):
        errors.append(
            Error(f"WORKHORSE_PREPARED_STATEMENTS must be True or False, got {prepared!r}.", id="workhorse.E010")
        )
    errors.extend(_schedule_settings())
    errors.extend(_metrics_token())
    errors.extend(_max_snoozes())
    errors.extend(_queue_options())
    errors.extend(_rate_limits())
    errors.extend(_workflow_max_steps())
    errors.extend(_encryption())
    return errors


def _encryption() -> list[CheckMessage]:
    """WORKHORSE_ENCRYPTION (workhorse.E014-E022): well-formed keys, and cryptography importable; never a key shown."""
    return [Error(p.message, hint=p.hint, id=p.check_id) for p in encryption_problems(_configured("ENCRYPTION"))]


def _workflow_max_steps() -> list[CheckMessage]:
    """WORKHORSE_WORKFLOW_MAX_STEPS (workhorse.E501): an integer within the schema's bound."""
    low, high = conf.MIN_WORKFLOW_MAX_STEPS, conf.MAX_WORKFLOW_MAX_STEPS
    value = _configured("WORKFLOW_MAX_STEPS")
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return []
    message = f"WORKHORSE_WORKFLOW_MAX_STEPS must be an integer in {low}..{high}, got {value!r}."
    return [Error(message, id="workhorse.E501")]


def _rate_limits() -> list[CheckMessage]:
    """WORKHORSE_RATE_LIMITS (workhorse.E402): a dict of names to RateLimit values."""
    return [
        Error(f"WORKHORSE_RATE_LIMITS {problem}.", id="workhorse.E402")
        for problem in rate_limits.settings_errors(_configured("RATE_LIMITS"))
    ]


def _max_snoozes() -> list[CheckMessage]:
    """WORKHORSE_MAX_SNOOZES (workhorse.E401): an integer within its bounds."""
    low, high = conf.MIN_MAX_SNOOZES, conf.MAX_MAX_SNOOZES
    value = _configured("MAX_SNOOZES")
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return []
    return [Error(f"WORKHORSE_MAX_SNOOZES must be an integer in {low}..{high}, got {value!r}.", id="workhorse.E401")]


def _queue_options() -> list[CheckMessage]:
    """WORKHORSE_QUEUES: a dict of queue names (workhorse.E411) to dicts of known options (workhorse.E410)."""
    queues = _configured("QUEUES")
    if not isinstance(queues, dict):
        return [
            Error(f"WORKHORSE_QUEUES must be a dict of queue names to options, got {queues!r}.", id="workhorse.E410")
        ]
    errors: list[CheckMessage] = []
    for queue, options in queues.items():
        try:
            check_queue(queue, "WORKHORSE_QUEUES key", error=InvalidArgumentError)
        except InvalidArgumentError as exc:
            errors.append(Error(str(exc), id="workhorse.E411"))
            continue
        errors.extend(_queue_option_problems(queue, options))
    return errors


def _queue_option_problems(queue: str, options: object) -> list[CheckMessage]:
    where = f"WORKHORSE_QUEUES[{queue!r}]"
    if not isinstance(options, dict):
        return [Error(f"{where} must be a dict of options ({', '.join(sorted(QUEUE_OPTIONS))}), got {options!r}.",
                      id="workhorse.E410")]  # fmt: skip
    unknown = sorted(map(repr, set(options) - QUEUE_OPTIONS))
    errors: list[CheckMessage] = []
    if unknown:
        known = ", ".join(sorted(QUEUE_OPTIONS))
        errors.append(Error(f"{where} has unknown options {', '.join(unknown)} (known: {known}).", id="workhorse.E410"))
    if "fair" in options and not isinstance(options["fair"], bool):
        errors.append(Error(f"{where}['fair'] must be True or False, got {options['fair']!r}.", id="workhorse.E410"))
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
    duplicate name, E207 another value out of bounds, E208 arguments that do not fit the task: the
    schedules an evaluation leaves out. Nothing within ``schedule_problems_reported_elsewhere()``.
    """
    if _schedules_reported_elsewhere.get():
        return []
    from django_workhorse.schedules.evaluation import left_out_schedules

    return [Error(f"Schedule {p.name!r} ({p.origin}): {p.message}.", id=p.check_id) for p in left_out_schedules()]


@register
def check_capabilities(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """A schedule whose task no worker running this code claims (workhorse.W004): a django.tasks task found
    by import outside the installed apps and ``WORKHORSE_TASK_MODULES``. Its jobs would wait for a
    handler (decision 0021, "Capability")."""
    from django_workhorse.schedules.sources import declared_schedules
    from django_workhorse.tasks.registry import can_run, capabilities

    found, _ = declared_schedules()
    claimed = capabilities()
    return [
        Warning(
            f"Schedule {schedule.name!r} ({schedule.origin}) enqueues job type {schedule.task!r}, which no worker "
            "running this code claims: no handler is registered for it and its module is in no installed app "
            "and not in WORKHORSE_TASK_MODULES. Its jobs would wait, reported as without a handler.",
            hint="Register a handler for it, or add its module (or a package holding it) to WORKHORSE_TASK_MODULES.",
            id="workhorse.W004",
        )
        for schedule in found
        if not can_run(claimed, schedule.task)
    ]


@contextmanager
def schedule_problems_reported_elsewhere() -> Iterator[None]:
    """Leave the schedules' errors out of the checks run within the block.

    For ``workhorse_worker``, ``workhorse_scheduler`` and ``workhorse_status``: one bad schedule
    must not stop every queue. They leave it out and report it instead (logged at ERROR, the
    ``workhorse_schedules_left_out`` gauge, ``workhorse_status``); ``manage.py check`` and every
    other command still fail on it.
    """
    token = _schedules_reported_elsewhere.set(True)
    try:
        yield
    finally:
        _schedules_reported_elsewhere.reset(token)


@register(Tags.database)
def check_prepared_statements(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """With WORKHORSE_PREPARED_STATEMENTS on, warn of each alias reached through a connection pooler
    that forwards prepared statements as they are (workhorse.W001): PgBouncer before 1.21, or 1.21+
    without ``max_prepared_statements``. Runs where Django runs database checks
    (``check --database``, ``migrate``, ``workhorse_worker``, ``workhorse_scheduler``).

    It asks the connection itself, as the statements would meet it: a pooler answers the client's
    startup with a cancel key of its own, so the process id it reports is not the server's
    ``pg_backend_pid()`` (PostgreSQL, and a TCP proxy, report the real one); and PgBouncer 1.21+,
    when it keeps prepared statements, renames them on the server (``PGBOUNCER_<n>``), where one
    forwarded as it is keeps the client's name. Its limits: PgBouncer in session mode keeps
    prepared statements yet looks like a forwarding pooler (silence workhorse.W001 there); a pooler
    that keeps them without renaming them is warned of too; an alias it cannot reach is not checked.
    """
    if app_settings.PREPARED_STATEMENTS is not True:
        return []
    warnings: list[CheckMessage] = []
    for alias in databases or []:
        if connections[alias].vendor == "postgresql" and sql.poolers.forwards_prepared_statements(alias):
            warnings.append(
                Warning(
                    f"Database {alias!r} is reached through a connection pooler that does not keep prepared "
                    "statements, and WORKHORSE_PREPARED_STATEMENTS is on: statements will fail with "
                    "'prepared statement \"_pg3_0\" already exists' or '... does not exist'.",
                    hint="Set WORKHORSE_PREPARED_STATEMENTS = False, or run PgBouncer 1.21+ with "
                    "max_prepared_statements > 0 in transaction mode. Behind PgBouncer in session mode, "
                    "silence workhorse.W001.",
                    id="workhorse.W001",
                )
            )
    return warnings


# At most this many values under unconfigured key ids are counted per table (workhorse.W005).
UNKNOWN_KEY_COUNT_CAP = 100


@register(Tags.database)
def check_encryption_keys_needed(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Warn while stored values are sealed under a key id that WORKHORSE_ENCRYPTION no longer
    configures (workhorse.W005): they cannot be opened. Runs where Django runs database checks.

    One statement per table, counting up to ``UNKNOWN_KEY_COUNT_CAP`` such values (it stops there;
    with none it reads every encrypted job, their events and checkpoints, found through the partial
    index of encrypted jobs, and the ledger once). Not within ``stored_keys_left_out()``. Names the key ids and the count, never a key. A database whose
    tables are not migrated yet is not checked.
    """
    setting = _configured("ENCRYPTION")
    if _stored_keys_left_out.get() or encryption_problems(setting):
        return []  # left out at a worker's start; E014..E022 say what is wrong
    configured = sorted(configured_key_ids())  # the setting is well formed here (or unset: none)
    warnings: list[CheckMessage] = []
    for alias in databases or []:
        found = _unknown_key_ids(alias, configured) if connections[alias].vendor == "postgresql" else {}
        if found:
            warnings.append(_unknown_keys_warning(alias, found))
    return warnings


def _unknown_key_ids(alias: str, configured: list[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        with transaction.atomic(using=alias):  # a failed read (tables not migrated) rolls back alone
            for table in sql.rekey.TABLES:
                counts = sql.rekey.unknown_key_ids(alias, table, configured=configured, cap=UNKNOWN_KEY_COUNT_CAP)
                for key_id, count in counts.items():
                    found[key_id] = found.get(key_id, 0) + count
    except ProgrammingError:  # undefined table or column: not migrated yet
        return {}
    except DatabaseError:  # unreachable: not checked (the worker waits for it, migrate says so)
        logger.debug("workhorse.W005 not checked: database %r cannot be reached", alias, exc_info=True)
        return {}
    return found


def _unknown_keys_warning(alias: str, found: dict[str, int]) -> CheckMessage:
    ids = ", ".join(repr(key_id) for key_id in sorted(found))
    total = sum(found.values())
    return Warning(
        f'Database {alias!r} holds values sealed under key id(s) {ids} that WORKHORSE_ENCRYPTION["keys"] does not '
        f"configure (at least {total}): they cannot be decrypted.",
        hint='Put the key back among WORKHORSE_ENCRYPTION["keys"] (not as the active one), run '
        "manage.py workhorse_rekey, and remove the key once this warning is gone.",
        id="workhorse.W005",
    )


@register(deploy=True)
def check_deploy(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Settings meant for tests, or too weak for production, run with ``check --deploy``
    (workhorse.W101-W103; see docs/deployment.md)."""
    warnings: list[CheckMessage] = []
    if _configured("EAGER"):
        warnings.append(
            Warning(
                "WORKHORSE_EAGER is on: every enqueue runs its due jobs inline, in the caller's thread and "
                "transaction, not on a worker: the request waits for each handler, the handler's writes roll back "
                "with the request, a retry waits for a worker, and while WORKHORSE_EAGER_PROPAGATES is on (the "
                "default) a handler's exception is raised into the request.",
                hint="Eager mode is for tests and local development: set WORKHORSE_EAGER = False (the default) "
                "in production and run manage.py workhorse_worker.",
                id="workhorse.W101",
            )
        )
    if _configured("ALLOW_FUTURE_NOW"):
        warnings.append(
            Warning(
                "WORKHORSE_ALLOW_FUTURE_NOW is on: enqueue_due_schedules(now=) and the schedule actions accept a "
                "now= ahead of the database's clock, so one call can enqueue ticks that are not due and push "
                "a schedule's window into the future.",
                hint="It is for tests that move time forward: set WORKHORSE_ALLOW_FUTURE_NOW = False (the "
                "default) in production.",
                id="workhorse.W102",
            )
        )
    warnings.extend(_weak_metrics_token())
    return warnings


def _weak_metrics_token() -> list[CheckMessage]:
    """A metrics token E301 accepts but a scraper's token should exceed (workhorse.W103); never echoed."""
    token = _configured("METRICS_TOKEN")
    if not _is_metrics_token(token):  # None, or E301's to report
        return []
    assert isinstance(token, str)
    length, distinct = len(token), len(set(token))
    if length >= conf.DEPLOY_MIN_METRICS_TOKEN_CHARS and distinct >= conf.DEPLOY_MIN_METRICS_TOKEN_DISTINCT_CHARS:
        return []
    message = (
        f"WORKHORSE_METRICS_TOKEN is weak: {length} characters, {distinct} distinct "
        f"(at least {conf.DEPLOY_MIN_METRICS_TOKEN_CHARS} and {conf.DEPLOY_MIN_METRICS_TOKEN_DISTINCT_CHARS} "
        "expected); anyone who guesses it reads the metrics endpoint."
    )
    hint = (
        'Set WORKHORSE_METRICS_TOKEN to python -c "import secrets; print(secrets.token_urlsafe(32))", '
        "read from the environment or a secret store, not the code."
    )
    return [Warning(message, hint=hint, id="workhorse.W103")]


@contextmanager
def stored_keys_left_out() -> Iterator[None]:
    """Leave check workhorse.W005 (values under an unconfigured key id) out of the checks run within the block.

    For ``workhorse_worker`` and ``workhorse_scheduler``: it reads every encrypted value, which at a
    worker's start would delay every rolling deploy by a read of the encrypted history; a job whose
    value does not open fails that attempt, naming the key id. ``migrate`` and ``check --database``
    still run it: the deploy step where a key is removed.
    """
    token = _stored_keys_left_out.set(True)
    try:
        yield
    finally:
        _stored_keys_left_out.reset(token)
