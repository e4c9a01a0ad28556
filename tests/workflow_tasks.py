"""Handlers for the workflow process tests (``tests/test_workflow_processes.py``).

Imported by worker subprocesses (``tests/worker_main.py``). Each run of a step inserts a row into
``RUNS_TABLE``, which the test creates: the job, the step, the worker's pid, and whether every
parent of the step had succeeded when the handler started (read from the database, committed at
once: a run by a worker killed mid-step is recorded too). A step whose payload says ``gate``
holds until the test inserts a row into ``GATE_TABLE``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from django.db import connection

from django_workhorse.tasks.registry import register
from django_workhorse.worker import HandlerContext

RUNS_TABLE = "workflow_test_runs"
GATE_TABLE = "workflow_test_gate"
STEP = "tests.wf.step"
# How long a gate step holds at most, and how often it looks.
GATE_SECONDS = 300.0
GATE_POLL = 0.02

CREATE_TABLES = f"""
CREATE TABLE {RUNS_TABLE} (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, step_name text NOT NULL, attempt int NOT NULL,
    pid int NOT NULL, parents_ok boolean NOT NULL
);
CREATE TABLE {GATE_TABLE} (opened boolean NOT NULL);
"""
DROP_TABLES = f"DROP TABLE IF EXISTS {RUNS_TABLE}, {GATE_TABLE}"

_RECORD_RUN = f"""
INSERT INTO {RUNS_TABLE} (job_id, step_name, attempt, pid, parents_ok)
SELECT job.id, job.step_name, %(attempt)s, %(pid)s, NOT EXISTS (
    SELECT FROM workhorse_job_dependency AS edge JOIN workhorse_job AS parent ON parent.id = edge.parent_id
    WHERE edge.child_id = job.id AND parent.status <> 'succeeded'
)
FROM workhorse_job AS job WHERE job.id = %(job_id)s
"""


@register(STEP)
def step(ctx: HandlerContext, payload: dict[str, Any]) -> dict[str, int]:
    """Record this run, then work for ``payload["seconds"]`` (or hold at the gate)."""
    with connection.cursor() as cursor:
        cursor.execute(_RECORD_RUN, {"attempt": ctx.attempt, "pid": os.getpid(), "job_id": ctx.job_id})
    if payload.get("gate"):
        _hold_at_gate()
    else:
        time.sleep(payload.get("seconds", 0.0))  # the step's work
    return {"pid": os.getpid()}


def _hold_at_gate() -> None:
    deadline = time.monotonic() + GATE_SECONDS
    tick = threading.Event()
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT EXISTS (SELECT FROM {GATE_TABLE})")
            if cursor.fetchone()[0]:
                return
        tick.wait(GATE_POLL)
    raise RuntimeError("the gate was never opened")
