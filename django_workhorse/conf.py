"""The one settings object, and the bounds every input is checked against.

Settings are read from ``django.conf.settings`` (``WORKHORSE_<NAME>``) at their first access and
kept until Django says they changed (the ``setting_changed`` signal, which ``override_settings``
and pytest-django's ``settings`` fixture send), never copied at import: ``override_settings`` works
in tests, and an enqueue does not pay Django's lookup of an unset setting four times per call.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, Generic, TypeVar, overload

from django.conf import settings as django_settings
from django.core.signals import setting_changed

T = TypeVar("T")
MiB = 1024 * 1024

MAX_KEY_BYTES = 512
MAX_SCOPE_BYTES = 256
MIN_KEY_TTL = timedelta(milliseconds=1)
MAX_KEY_TTL = timedelta(days=365)
MIN_TIMEOUT = timedelta(milliseconds=1)
MAX_TIMEOUT = timedelta(days=365)
MAX_DELAY = timedelta(days=365)
MIN_PRIORITY, MAX_PRIORITY = 0, 100
MIN_ATTEMPTS, MAX_ATTEMPTS = 1, 100
DEFAULT_MAX_ATTEMPTS = 25
# A worker's lease on the jobs it claims, and how long a stopping worker waits for running handlers.
DEFAULT_LEASE = timedelta(seconds=30)
DEFAULT_DRAIN_TIMEOUT = timedelta(seconds=25)
MAX_TAGS = 20
MAX_TAG_CHARS = 100
MAX_QUEUE_CHARS = 100
MAX_JOB_TYPE_CHARS = 255
MAX_CONCURRENCY_KEY_BYTES = 256
MIN_CONCURRENCY_LIMIT, MAX_CONCURRENCY_LIMIT = 1, 1000
# Circuit breakers: a breaker key names a destination ("smtp:mail.example.com") or a job type.
MAX_BREAKER_KEY_BYTES = 256
# A Breaker's bounds: failures kept in its window (a jsonb list on its row), canaries per half-open
# period (a smallint), and its durations; a cooldown that grows stops at max_cooldown.
MIN_BREAKER_FAILURES, MAX_BREAKER_FAILURES = 1, 1000
MIN_BREAKER_PROBES, MAX_BREAKER_PROBES = 1, 100
MIN_BREAKER_DURATION, MAX_BREAKER_DURATION = timedelta(milliseconds=1), timedelta(days=365)
DEFAULT_MAX_BREAKER_COOLDOWN = timedelta(minutes=10)
# The latest state changes a breaker row keeps.
MAX_BREAKER_TRANSITIONS = 20
# Rate limits (WORKHORSE_RATE_LIMITS names them) and their partitions; fair share's partition keys.
MAX_RATE_LIMIT_NAME_CHARS = 100
MAX_RATE_PARTITION_BYTES = 256
# A RateLimit's bounds: starts per period, the period, and the extra starts a burst may take.
MIN_RATE_LIMIT, MAX_RATE_LIMIT = 1, 1_000_000
MIN_RATE_PER, MAX_RATE_PER = timedelta(milliseconds=1), timedelta(days=1)
MIN_RATE_BURST, MAX_RATE_BURST = 0, 1_000_000
MAX_PARTITION_KEY_BYTES = 256
# Snoozes a job may take (WORKHORSE_MAX_SNOOZES) before it is dead.
DEFAULT_MAX_SNOOZES = 100
MIN_MAX_SNOOZES, MAX_MAX_SNOOZES = 1, 100_000
DEFAULT_CONCURRENCY_LIMIT = 1
MAX_BATCH_SIZE = 1000
DEFAULT_MAX_PAYLOAD_BYTES = 1 * MiB
MAX_PAYLOAD_BYTES_LIMIT = 16 * MiB
DEFAULT_MAX_RESULT_BYTES = 1 * MiB
MIN_RESULT_BYTES_LIMIT, MAX_RESULT_BYTES_LIMIT = 1024, 16 * MiB
# Operator actions: who asked (recorded in events and redrives) and a redrive's request id.
MAX_REQUESTED_BY_CHARS = 200
MAX_REQUEST_ID_CHARS = 200
MAX_REASON_CHARS = 10_000
# Stored JSON (payloads, results, checkpoints, effect results) nests at most this deep.
MAX_JSON_DEPTH = 100
# Ids are PostgreSQL bigints.
MAX_ID = 2**63 - 1
# Stored instants: what Python can read back (PostgreSQL stores more); also CHECKs on the columns.
MIN_STORED_DATETIME = datetime(1, 1, 1, tzinfo=timezone.utc)
MAX_STORED_DATETIME = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc)
DEFAULT_NOTIFY_CHANNEL = "workhorse"
DEFAULT_RESULT_CHANNEL = "workhorse_result"
DEFAULT_JOB_RETENTION = timedelta(days=14)
# How long a flagged (awaited), unread result outlives its job's retention at least (decision 0022 §5).
DEFAULT_RESULT_RETENTION = timedelta(hours=24)
NO_RESULT_LISTENER = "none"  # WORKHORSE_RESULT_LISTEN_DATABASE: nothing LISTENs for results, waits poll
DEFAULT_MAINTENANCE_INTERVAL = timedelta(minutes=1)
DEFAULT_WORKER_STALE_AFTER = timedelta(minutes=5)
# Periodic schedules: how many missed ticks catch_up="all" enqueues, and how often workers evaluate.
DEFAULT_SCHEDULE_MAX_CATCH_UP = 100
MIN_SCHEDULE_MAX_CATCH_UP, MAX_SCHEDULE_MAX_CATCH_UP = 1, 10_000
DEFAULT_SCHEDULE_INTERVAL = timedelta(seconds=1)
MIN_SCHEDULE_INTERVAL, MAX_SCHEDULE_INTERVAL = timedelta(milliseconds=1), timedelta(days=1)
MIN_SCHEDULE_EVERY, MAX_SCHEDULE_EVERY = timedelta(seconds=1), timedelta(days=365)
# A tick key is the name, "@" and a 32-character UTC instant: within MAX_KEY_BYTES.
MAX_SCHEDULE_NAME_CHARS = 200
MAX_SCHEDULE_NAME_BYTES = 400
# Workflows (decision 0022): a workflow's name and its step names; the schema's hard bound on a
# workflow's steps (WORKHORSE_WORKFLOW_MAX_STEPS lies within it), and so on a step's parents.
MAX_WORKFLOW_NAME_CHARS = 200
MAX_STEP_NAME_CHARS = 200
MAX_WORKFLOW_STEPS = 10_000
# @idempotent views: who a record belongs to, and the largest response body stored for a replay.
MAX_IDEMPOTENT_OWNER_CHARS = 256
DEFAULT_IDEMPOTENT_RESPONSE_MAX_BYTES = 1 * MiB
MIN_IDEMPOTENT_RESPONSE_MAX_BYTES, MAX_IDEMPOTENT_RESPONSE_MAX_BYTES = 1024, 16 * MiB
DEFAULT_IDEMPOTENT_TTL = timedelta(hours=24)
# WORKHORSE_WORKFLOW_MAX_STEPS: its default, and its bounds (at most the schema's MAX_WORKFLOW_STEPS).
DEFAULT_WORKFLOW_MAX_STEPS = 1000
MIN_WORKFLOW_MAX_STEPS, MAX_WORKFLOW_MAX_STEPS = 1, MAX_WORKFLOW_STEPS
# The metrics endpoint's bearer token: long enough not to be guessed, short enough for a header.
MIN_METRICS_TOKEN_CHARS, MAX_METRICS_TOKEN_CHARS = 16, 512
# What ``check --deploy`` (workhorse.W103) expects of it: about 190 bits or more when random
# (``secrets.token_urlsafe(32)`` gives 43 characters), not one of a few characters repeated.
DEPLOY_MIN_METRICS_TOKEN_CHARS = 32
DEPLOY_MIN_METRICS_TOKEN_DISTINCT_CHARS = 10
# Payload encryption (decision 0024): AES-256 keys and the fingerprint key are 32 bytes; a key id
# stands in envelopes and LIKE patterns, so it is 1..64 ASCII letters, digits, '-', '_' or '.'.
ENCRYPTION_KEY_BYTES = 32
MAX_ENCRYPTION_KEY_ID_CHARS = 64


class Setting(Generic[T]):
    """One ``WORKHORSE_<NAME>`` setting, read from ``django.conf.settings`` at each access."""

    def __init__(self, default: T, doc: str, *, convert: Callable[[Any], T] | None = None) -> None:
        self.default = default
        self.convert = convert
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.setting = f"WORKHORSE_{name}"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Setting[T] | T:
        if obj is None:
            return self
        try:
            return _values[self.setting]  # type: ignore[no-any-return]
        except KeyError:
            pass
        value = getattr(django_settings, self.setting, self.default)
        value = value if self.convert is None else self.convert(value)
        _values[self.setting] = value
        return value


# Each setting's value as last read, by setting name; forgotten when Django says it changed.
_values: dict[str, Any] = {}


def _forget_changed_setting(*, setting: str, **kwargs: Any) -> None:
    _values.pop(setting, None)


setting_changed.connect(_forget_changed_setting, dispatch_uid="django_workhorse.conf")


class WorkhorseSettings:
    """Typed access to the ``WORKHORSE_*`` settings, with their defaults (checked by ``checks.py``)."""

    MAX_PAYLOAD_BYTES = Setting(
        DEFAULT_MAX_PAYLOAD_BYTES, "Largest serialized payload accepted, in bytes (1 MiB; at most 16 MiB)."
    )
    MAX_RESULT_BYTES = Setting(
        DEFAULT_MAX_RESULT_BYTES,
        "Largest serialized handler result stored, in bytes (1 MiB; 1 KiB..16 MiB); a larger one fails its attempt.",
    )
    NOTIFY_CHANNEL = Setting(DEFAULT_NOTIFY_CHANNEL, "The LISTEN/NOTIFY channel that announces accepted ready work.")
    RESULT_CHANNEL = Setting(
        DEFAULT_RESULT_CHANNEL,
        "The LISTEN/NOTIFY channel that announces a job someone waits on has finished (payload: its id).",
    )
    RESULT_LISTEN_DATABASE: Setting[str | None] = Setting(
        None,
        "The database alias whose connection LISTENs for results (None: the alias a wait reads; 'none': waits poll "
        "only). Behind PgBouncer in transaction mode, name an alias that reaches PostgreSQL directly.",
    )
    PREPARED_STATEMENTS = Setting(
        True, "Run the enqueue statements as server-side prepared statements (turn off for PgBouncer < 1.21)."
    )
    JOB_RETENTION = Setting(
        DEFAULT_JOB_RETENTION, "How long finished jobs (and their history) are kept before maintenance prunes them."
    )
    RESULT_RETENTION = Setting(
        DEFAULT_RESULT_RETENTION,
        "How long a result someone waits for, and has not read yet, is kept after its job finished, however short "
        "JOB_RETENTION is (24 h).",
    )
    MAINTENANCE_INTERVAL = Setting(
        DEFAULT_MAINTENANCE_INTERVAL, "How often a worker tries to run maintenance (one worker at a time runs it)."
    )
    WORKER_STALE_AFTER = Setting(
        DEFAULT_WORKER_STALE_AFTER,
        "A worker whose heartbeat is older than this is gone; maintenance removes its record.",
    )
    CONCURRENCY_LIMITS: Setting[dict[str, int]] = Setting(
        {}, "Per concurrency key, how many of its jobs may run at once (exact key match)."
    )
    DEFAULT_CONCURRENCY_LIMIT = Setting(
        DEFAULT_CONCURRENCY_LIMIT,
        "The limit of a concurrency key that neither the request nor CONCURRENCY_LIMITS names (1).",
    )
    MAX_SNOOZES = Setting(
        DEFAULT_MAX_SNOOZES,
        "How many times a job may snooze (a handler raising Snooze); the snooze after that makes it dead "
        "(100; 1..100,000).",
    )
    QUEUES: Setting[dict[str, dict[str, Any]]] = Setting(
        {},
        'Options per queue name: {"reports": {"fair": True}} claims the queue round-robin across its jobs\' '
        "partition keys (see docs/fair-queues.md).",
    )
    RATE_LIMITS: Setting[dict[str, Any]] = Setting(
        {},
        'Named rate limits: {"stripe": RateLimit(100, per=timedelta(seconds=1))}; a job joins one with '
        'rate_limit="stripe" (see docs/rate-limits.md).',
    )
    SCHEDULES: Setting[dict[str, Any]] = Setting(
        {},
        'Periodic schedules by name: {"name": {"task": ..., "cron": ... or "every": ..., ...}} (see docs/schedules.md).',
    )
    SCHEDULE_MAX_CATCH_UP = Setting(
        DEFAULT_SCHEDULE_MAX_CATCH_UP,
        'How many missed ticks a catch_up="all" schedule enqueues at most, the latest ones (100; 1..10,000).',
    )
    SCHEDULE_INTERVAL = Setting(
        DEFAULT_SCHEDULE_INTERVAL, "How often a worker evaluates the schedules, at most (1 s; 1 ms..1 day)."
    )
    WORKFLOW_MAX_STEPS = Setting(
        DEFAULT_WORKFLOW_MAX_STEPS, "How many steps a workflow may have at most (1,000; 1..10,000)."
    )
    IDEMPOTENT_RESPONSE_MAX_BYTES = Setting(
        DEFAULT_IDEMPOTENT_RESPONSE_MAX_BYTES,
        "Largest response body an @idempotent view stores for replay, in bytes (1 MiB; 1 KiB..16 MiB).",
    )
    METRICS_TOKEN: Setting[str | None] = Setting(
        None,
        "A bearer token that lets a scraper read the metrics endpoint (16..512 visible ASCII characters); "
        "staff users may read it either way.",
    )
    METRICS_JOB_TYPE_LABEL = Setting(
        False,
        "Label the per-job metrics (enqueue requests, attempts, handler and wait times) with the job type too; "
        "off by default to keep the number of series bounded.",
        convert=bool,
    )
    EAGER = Setting(
        False, "Run accepted, due jobs synchronously right after enqueue (for tests); dedup stays on.", convert=bool
    )
    EAGER_PROPAGATES = Setting(
        True, "In eager mode, re-raise a handler's exception after recording it on the job.", convert=bool
    )
    ALLOW_FUTURE_NOW = Setting(
        False,
        "Let enqueue_due_schedules() and the schedule actions take a now= further ahead of the database's clock "
        "than FUTURE_NOW_TOLERANCE (for tests that move time forward); off, such a now= is refused.",
        convert=bool,
    )
    ENCRYPTION: Setting[dict[str, Any] | None] = Setting(
        None,
        'Payload encryption at rest: {"keys": {id: base64 of 32 bytes}, "active": id, "fingerprint_key": base64 of '
        '32 bytes, "encrypt_all": False, "encrypted_scopes": []}; None: not configured (see docs/settings.md).',
    )
    TASK_MODULES: Setting[tuple[str, ...]] = Setting(
        (),
        "Modules outside the installed apps (dotted paths, each with its submodules) that a worker may import "
        "to find the django.tasks task a job type names; an installed app's modules always may.",
        convert=lambda value: (value,) if isinstance(value, str) else tuple(value or ()),
    )


app_settings = WorkhorseSettings()
