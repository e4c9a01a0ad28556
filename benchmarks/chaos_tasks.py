"""Handlers of the chaos run (``benchmarks/chaos.py``): one good job type, one per poison class.

Listed in ``INSTALLED_APPS`` by ``benchmarks.chaos_settings``, so every process on those settings
(the worker subprocesses and the chaos script itself) registers the handlers when Django starts.

The good handler records each execution as a row ``(job_id, attempt, pid, at)`` in
``chaos_execution``, on the executor thread's own Django connection in autocommit, outside any job
transaction: the row is committed before the handler returns, so it survives a SIGKILL of the
worker or a PostgreSQL restart that loses the job's outcome, and executions can be counted after
the run. The poison handlers each produce one kind of outcome PostgreSQL cannot store as-is.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection

from django_workhorse.tasks.registry import register

if TYPE_CHECKING:
    from django_workhorse.worker import HandlerContext

GOOD = "chaos.good"
POISON_PREFIX = "chaos.poison."
EXECUTIONS_DDL = """
DROP TABLE IF EXISTS chaos_execution;
CREATE TABLE chaos_execution (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,
    at double precision NOT NULL);
CREATE INDEX chaos_execution_job ON chaos_execution (job_id);
"""
TOO_DEEP = 150  # levels of nesting; stored JSON allows 100


@register(GOOD)
def good(ctx: HandlerContext, payload: dict[str, Any]) -> dict[str, int]:
    """Record this execution (committed at once), optionally work a little, return the job's index."""
    if connection.in_atomic_block:
        raise RuntimeError("chaos.good must run outside a transaction to record its execution")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO chaos_execution (job_id, attempt, pid, at) VALUES (%s, %s, %s, %s)",
            [ctx.job_id, ctx.attempt, os.getpid(), time.time()],
        )
    if payload.get("work_ms"):
        threading.Event().wait(payload["work_ms"] / 1000)
    return {"i": payload["i"]}


class UnprintableError(Exception):
    """An exception whose ``__str__`` itself raises."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ of UnprintableError raised")


def _surrogate_result(payload: Any) -> Any:
    return {"a": "bad\udc80"}


def _nul_result(payload: Any) -> Any:
    return "a\x00b"


def _unprintable_exception(payload: Any) -> Any:
    raise UnprintableError()


def _nasty_message_exception(payload: Any) -> Any:
    raise ValueError("nul \x00 and lone surrogate \udc80 in the message")


def _oversized_result(payload: Any) -> Any:
    return "x" * (settings.WORKHORSE_MAX_RESULT_BYTES * 2)


def _unserializable_result(payload: Any) -> Any:
    return {"a": object()}


def _too_deep_result(payload: Any) -> Any:
    value: Any = "bottom"
    for _ in range(TOO_DEEP):
        value = [value]
    return value


# Poison class -> handler; the job type is POISON_PREFIX + class.
POISON: dict[str, Callable[[Any], Any]] = {
    "surrogate_result": _surrogate_result,
    "nul_result": _nul_result,
    "unprintable_exception": _unprintable_exception,
    "nasty_message_exception": _nasty_message_exception,
    "oversized_result": _oversized_result,
    "unserializable_result": _unserializable_result,
    "too_deep_result": _too_deep_result,
}

for _name, _handler in POISON.items():
    register(POISON_PREFIX + _name, _handler)
