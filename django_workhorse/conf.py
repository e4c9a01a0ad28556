"""The one settings object, and the bounds every input is checked against.

Settings are read from ``django.conf.settings`` at access time (``WORKHORSE_<NAME>``), never copied
at import, so ``override_settings`` works in tests.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from django.conf import settings as django_settings

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
DEFAULT_JOB_RETENTION = timedelta(days=14)
DEFAULT_MAINTENANCE_INTERVAL = timedelta(minutes=1)
DEFAULT_WORKER_STALE_AFTER = timedelta(minutes=5)


class WorkhorseSettings:
    """Typed access to the ``WORKHORSE_*`` settings, with their defaults."""

    @property
    def MAX_PAYLOAD_BYTES(self) -> int:  # noqa: N802 (mirrors the setting name)
        """Largest serialized payload accepted, in bytes (1 MiB; at most 16 MiB)."""
        return getattr(django_settings, "WORKHORSE_MAX_PAYLOAD_BYTES", DEFAULT_MAX_PAYLOAD_BYTES)

    @property
    def MAX_RESULT_BYTES(self) -> int:  # noqa: N802
        """Largest serialized handler result stored, in bytes (1 MiB; 1 KiB..16 MiB); a larger one fails its attempt."""
        return getattr(django_settings, "WORKHORSE_MAX_RESULT_BYTES", DEFAULT_MAX_RESULT_BYTES)

    @property
    def NOTIFY_CHANNEL(self) -> str:  # noqa: N802
        """The LISTEN/NOTIFY channel that announces accepted ready work."""
        return getattr(django_settings, "WORKHORSE_NOTIFY_CHANNEL", DEFAULT_NOTIFY_CHANNEL)

    @property
    def PREPARED_STATEMENTS(self) -> bool:  # noqa: N802
        """Run the enqueue statements as server-side prepared statements (turn off for PgBouncer < 1.21)."""
        return getattr(django_settings, "WORKHORSE_PREPARED_STATEMENTS", True)

    @property
    def JOB_RETENTION(self) -> timedelta:  # noqa: N802
        """How long finished jobs (and their history) are kept before maintenance prunes them."""
        return getattr(django_settings, "WORKHORSE_JOB_RETENTION", DEFAULT_JOB_RETENTION)

    @property
    def MAINTENANCE_INTERVAL(self) -> timedelta:  # noqa: N802
        """How often a worker tries to run maintenance (one worker at a time runs it)."""
        return getattr(django_settings, "WORKHORSE_MAINTENANCE_INTERVAL", DEFAULT_MAINTENANCE_INTERVAL)

    @property
    def WORKER_STALE_AFTER(self) -> timedelta:  # noqa: N802
        """A worker whose heartbeat is older than this is gone; maintenance removes its record."""
        return getattr(django_settings, "WORKHORSE_WORKER_STALE_AFTER", DEFAULT_WORKER_STALE_AFTER)

    @property
    def CONCURRENCY_LIMITS(self) -> dict[str, int]:  # noqa: N802
        """Per concurrency key, how many of its jobs may run at once (exact key match)."""
        limits: dict[str, int] = getattr(django_settings, "WORKHORSE_CONCURRENCY_LIMITS", {})
        return limits

    @property
    def DEFAULT_CONCURRENCY_LIMIT(self) -> int:  # noqa: N802
        """The limit of a concurrency key that neither the request nor CONCURRENCY_LIMITS names (1)."""
        return getattr(django_settings, "WORKHORSE_DEFAULT_CONCURRENCY_LIMIT", DEFAULT_CONCURRENCY_LIMIT)

    @property
    def EAGER(self) -> bool:  # noqa: N802
        """Run accepted, due jobs synchronously right after enqueue (for tests); dedup stays on."""
        return bool(getattr(django_settings, "WORKHORSE_EAGER", False))

    @property
    def EAGER_PROPAGATES(self) -> bool:  # noqa: N802
        """In eager mode, re-raise a handler's exception after recording it on the job."""
        return bool(getattr(django_settings, "WORKHORSE_EAGER_PROPAGATES", True))


app_settings = WorkhorseSettings()
