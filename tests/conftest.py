"""Shared fixtures: a second real connection, racing threads, a LISTEN connection."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.core.servers import basehttp
from django.db import connection, connections, transaction
from hypothesis import HealthCheck, settings
from psycopg import sql

from django_workhorse.conf import app_settings

# Property tests: a short profile by default (CI), a long one to run by hand:
#   WORKHORSE_HYPOTHESIS_PROFILE=long make test ARGS="tests/test_properties.py"
# Examples share the test's database transaction (each rolls its own writes back), so the
# function-scoped-fixture health check does not apply; no deadline, since PostgreSQL does the work.
_PROPERTY_DEFAULTS: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    "derandomize": False,
}
settings.register_profile("ci", max_examples=60, **_PROPERTY_DEFAULTS)
settings.register_profile("long", max_examples=3000, **_PROPERTY_DEFAULTS)
settings.load_profile(os.environ.get("WORKHORSE_HYPOTHESIS_PROFILE", "ci"))

# The live server's listen backlog: Django's runserver keeps 10, and tests send up to 32 requests at
# once; on a loaded machine the connections past the backlog are retried by TCP after 1, 2, 4... s,
# and a test waiting for all of them to arrive timed out.
basehttp.WSGIServer.request_queue_size = 128

WORKHORSE_TABLES = ("workhorse_job", "workhorse_binding", "workhorse_job_event")


def connect_directly(alias: str = "default", *, autocommit: bool = True) -> psycopg.Connection[Any]:
    """Open a new session to the (test) database that Django uses, outside Django."""
    params = connections[alias].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return psycopg.connect(**params, autocommit=autocommit)


@contextlib.contextmanager
def maintenance_held_elsewhere(alias: str = "default") -> Iterator[None]:
    """Hold the maintenance lease from another session (committed) for the block, then delete it."""
    from django_workhorse.operations.maintenance import MAINTENANCE_LEASE, MAINTENANCE_LEASE_NAME
    from django_workhorse.sql.leases import TAKE_LEASE

    with connect_directly(alias) as other:
        params = {"name": MAINTENANCE_LEASE_NAME, "holder": uuid.uuid4(), "ttl": MAINTENANCE_LEASE}
        assert other.execute(TAKE_LEASE, params).fetchall(), "the maintenance lease was held already"
        try:
            yield
        finally:
            other.execute("DELETE FROM workhorse_lease WHERE holder = %(holder)s", params)


@pytest.fixture
def other_connection() -> Iterator[psycopg.Connection[Any]]:
    """A second session: sees only what the test's connection has committed."""
    with connect_directly() as conn:
        yield conn


def count_rows(conn: Any = None) -> dict[str, int]:
    """Return the row count of every workhorse table, read through ``conn`` or Django's connection."""
    counts = {}
    for table in WORKHORSE_TABLES:
        if conn is None:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT count(*) FROM {table}")
                counts[table] = cursor.fetchone()[0]
        else:
            counts[table] = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    return counts


@pytest.fixture
def listener() -> Iterator[Callable[[float], list[str]]]:
    """LISTEN on the workhorse channel; returns ``drain(timeout, count=None) -> [payload, ...]``.

    ``drain`` returns as soon as ``count`` notifications arrived, or when ``timeout`` passes.
    """
    with connect_directly() as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(app_settings.NOTIFY_CHANNEL)))

        def drain(timeout: float, count: int | None = None) -> list[str]:
            return [n.payload for n in conn.notifies(timeout=timeout, stop_after=count)]

        yield drain


def race(count: int, work: Callable[[int], Any], *, timeout: float = 60) -> list[Any]:
    """Run ``work(i)`` in ``count`` threads released together by a barrier; return results or exceptions.

    Each thread uses its own Django connection (they are per thread) and closes it afterwards.
    """
    barrier = threading.Barrier(count, timeout=timeout)
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as exc:  # reported to the test, which asserts on it
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a racing thread did not finish in time"
    return results


class _RollbackError(Exception):
    pass


@contextlib.contextmanager
def example_savepoint() -> Iterator[None]:
    """Run one (property test) example in a savepoint and roll it back, whatever it wrote."""
    with contextlib.suppress(_RollbackError), transaction.atomic():
        yield
        raise _RollbackError


@pytest.fixture
def task_schedules() -> Iterator[None]:
    """Schedules declared with ``@task(schedule=...)`` inside a test are forgotten after it."""
    from django_workhorse.tasks import registry

    saved = dict(registry.task_schedules)
    yield
    registry.task_schedules.clear()
    registry.task_schedules.update(saved)
    registry.generation += 1


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup: None) -> Iterator[Any]:
    """A real PgBouncer (transaction pooling) in front of the test database, behind the "pooled"
    and "pooled_single" aliases; skipped without the pgbouncer binary, failed under CI's
    WORKHORSE_REQUIRE_PGBOUNCER=1."""
    from tests import pgbouncer as pooler

    executable = pooler.binary()
    if executable is None:
        message = "PgBouncer is not installed (Debian: apt-get install pgbouncer)"
        if os.environ.get(pooler.REQUIRE_ENV) == "1":
            pytest.fail(f"{message}, and {pooler.REQUIRE_ENV}=1 requires it")
        pytest.skip(message)
    direct = connections["default"].settings_dict
    running = pooler.PgBouncer.start(executable, database=direct)
    saved = {}
    for alias, name in ((pooler.POOLED, direct["NAME"]), (pooler.POOLED_SINGLE, direct["NAME"] + pooler.SINGLE_SUFFIX)):
        # Django's connections share these dicts, so every thread's next connection uses them.
        entry = connections[alias].settings_dict
        saved[alias] = {key: entry[key] for key in ("HOST", "PORT", "NAME")}
        entry.update(HOST=running.host, PORT=str(running.port), NAME=name)
        connections[alias].close()
    try:
        yield running
    finally:
        for alias, values in saved.items():
            connections[alias].close()
            connections[alias].settings_dict.update(values)
        running.stop()
