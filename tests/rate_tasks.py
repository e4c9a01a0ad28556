"""Handlers under rate limits, for the rate limit tests and worker subprocesses (``tests/worker_main.py``).

``record_start`` writes each start to ``tests_rate_start`` (created by ``create_start_table``):
the instant its claim started the attempt (``started_at``, the instant the budget counted) and the
handler's own ``clock_timestamp()``, both on PostgreSQL's clock.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection

from django_workhorse.tasks.decorator import task
from django_workhorse.tasks.retry import RetryPolicy
from django_workhorse.worker import HandlerContext

START_TABLE = "tests_rate_start"
RECORD = "tests.rate.record_start"


def create_start_table() -> None:
    """Create (or empty) the table the handlers record their starts in."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {START_TABLE} (job_id bigint, attempt integer, "
            "started_at timestamptz, recorded_at timestamptz)"
        )
        cursor.execute(f"TRUNCATE {START_TABLE}")


def starts() -> list[tuple[int, int, Any, Any]]:
    """Every recorded start: (job id, attempt, started_at, recorded_at), in started_at order."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT job_id, attempt, started_at, recorded_at FROM {START_TABLE} ORDER BY started_at")
        return list(cursor.fetchall())


@task(name="tests.rate.record_start")
def record_start(ctx: HandlerContext, **payload: Any) -> None:
    """Record this start (its claim's started_at, and the handler's clock)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {START_TABLE} SELECT id, attempt, started_at, clock_timestamp() FROM workhorse_job "
            "WHERE id = %s",
            [ctx.job_id],
        )


@task(name="tests.rate.record_start.noop")
def noop(**payload: Any) -> None:
    """Do nothing."""


@task(name="tests.rate.fail_once", retry_policy=RetryPolicy.fixed(timedelta(milliseconds=1)))
def fail_once(ctx: HandlerContext, **payload: Any) -> None:
    """Fail the first attempt; succeed the next."""
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")


@task(name="tests.rate.stripe_default", rate_limit="tests.default")
def stripe_default(**payload: Any) -> None:
    """A task whose jobs start under the rate limit ``tests.default`` unless a call names another."""
