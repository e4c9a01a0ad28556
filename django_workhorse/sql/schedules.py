"""Periodic schedules: read and sync their state, advance it past the ticks an evaluation handled.

Statements that update several schedule rows lock them first in name order (``SELECT … ORDER BY
name FOR NO KEY UPDATE``), so racing evaluators meet their common rows in one order and cannot
deadlock. Rows are found by ``workhorse_schedule_name_uniq``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django_workhorse.sql.connection import execute, run

# read_states: every schedule's state, and the database's clock (every evaluator uses the same clock,
# so hosts whose clocks disagree compute the same windows) once, in a row of its own whose name is
# NULL (names are NOT NULL): a clock column would be decoded again on every row.
READ_STATES = """
SELECT name, digest, active, paused, evaluated_until, last_job_id
FROM workhorse_schedule
UNION ALL
SELECT NULL, NULL, NULL, NULL, clock_timestamp(), NULL
"""

# insert_states: schedules seen for the first time; their window starts now (no tick is due at a
# first evaluation). A racing evaluator's row wins (ON CONFLICT on workhorse_schedule_name_uniq).
INSERT_STATES = """
INSERT INTO workhorse_schedule (
    name, task, definition, digest, active, paused, evaluated_until, last_skip_reason, created_at, updated_at)
SELECT s.name, s.task, s.definition, s.digest, true, false, %(now)s, '', %(now)s, %(now)s
FROM jsonb_to_recordset(%(rows)s::jsonb) AS s(name text, task text, definition jsonb, digest text)
ORDER BY s.name
ON CONFLICT (name) DO NOTHING
"""

# sync_states: definitions that changed in code, and schedules back in code: active again, with
# their window where it was (a rolling deploy flips old and new code back and forth: no tick is lost).
SYNC_STATES = """
WITH s AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS s(name text, task text, definition jsonb, digest text)
),
locked AS (
    SELECT schedule.id, s.task, s.definition, s.digest
    FROM workhorse_schedule AS schedule JOIN s USING (name)
    ORDER BY schedule.name
    FOR NO KEY UPDATE OF schedule
)
UPDATE workhorse_schedule AS schedule
SET task = locked.task, definition = locked.definition, digest = locked.digest, active = true,
    updated_at = %(now)s
FROM locked
WHERE schedule.id = locked.id
"""

# deactivate: schedules no longer in code are kept, with their history, as inactive.
DEACTIVATE = """
WITH locked AS (
    SELECT id FROM workhorse_schedule WHERE name = ANY(%(names)s::text[]) AND active
    ORDER BY name
    FOR NO KEY UPDATE
)
UPDATE workhorse_schedule SET active = false, updated_at = %(now)s
WHERE id IN (SELECT id FROM locked)
"""

# advance: move each evaluated schedule's window start to the evaluation's instant (never back) and
# record its newest enqueued tick with its job, or its newest skipped tick with why.
ADVANCE = """
WITH s AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
        AS s(name text, tick timestamptz, job_id bigint, skip_at timestamptz, skip_reason text)
),
locked AS (
    SELECT schedule.id, s.tick, s.job_id, s.skip_at, s.skip_reason
    FROM workhorse_schedule AS schedule JOIN s USING (name)
    ORDER BY schedule.name
    FOR NO KEY UPDATE OF schedule
)
UPDATE workhorse_schedule AS schedule
SET evaluated_until = greatest(schedule.evaluated_until, %(now)s),
    last_tick_at = CASE WHEN locked.tick >= coalesce(schedule.last_tick_at, '-infinity')
                        THEN locked.tick ELSE schedule.last_tick_at END,
    last_job_id = CASE WHEN locked.tick >= coalesce(schedule.last_tick_at, '-infinity')
                       THEN locked.job_id ELSE schedule.last_job_id END,
    last_skip_at = CASE WHEN locked.skip_at >= coalesce(schedule.last_skip_at, '-infinity')
                        THEN locked.skip_at ELSE schedule.last_skip_at END,
    last_skip_reason = CASE WHEN locked.skip_at >= coalesce(schedule.last_skip_at, '-infinity')
                            THEN locked.skip_reason ELSE schedule.last_skip_reason END,
    updated_at = %(now)s
FROM locked
WHERE schedule.id = locked.id
"""

# lock_states: lock the rows of the schedules an evaluation may enqueue for, in name order, and read
# them as the last evaluator left them, with the status of each one's previous job (overlap="skip").
LOCK_STATES = """
SELECT schedule.name, schedule.active, schedule.paused, schedule.evaluated_until, schedule.last_job_id, job.status
FROM workhorse_schedule AS schedule
LEFT JOIN workhorse_job AS job ON job.id = schedule.last_job_id
WHERE schedule.name = ANY(%(names)s::text[])
ORDER BY schedule.name
FOR NO KEY UPDATE OF schedule
"""


class ScheduleRow(NamedTuple):
    """One schedule's state as an evaluation reads it (a tuple: every evaluation makes one per schedule)."""

    name: str
    digest: str
    active: bool
    paused: bool
    evaluated_until: datetime
    last_job_id: int | None


@dataclass(frozen=True)
class LockedState:
    """One schedule's state under its row lock, with its previous job's status (None if gone)."""

    name: str
    active: bool
    paused: bool
    evaluated_until: datetime
    last_job_id: int | None
    previous_job_status: str | None


@dataclass(frozen=True)
class Advance:
    """What one evaluation did for one schedule: its newest enqueued tick and job, or skipped tick."""

    name: str
    tick: datetime | None = None
    job_id: int | None = None
    skip_at: datetime | None = None
    skip_reason: str | None = None


def read_states(alias: str) -> tuple[dict[str, ScheduleRow], datetime]:
    """Run READ_STATES; return the rows by name and the database's clock."""
    states: dict[str, ScheduleRow] = {}
    clock: datetime | None = None
    for row in execute(alias, READ_STATES, {}):
        if row[0] is None:
            clock = row[4]
        else:
            states[row[0]] = ScheduleRow(*row)
    assert clock is not None
    return states, clock


def _definitions(rows: Sequence[tuple[str, str, dict[str, Any], str]]) -> str:
    return json.dumps(
        [{"name": n, "task": t, "definition": d, "digest": g} for n, t, d, g in rows], default=str, ensure_ascii=False
    )


def insert_states(alias: str, rows: Sequence[tuple[str, str, dict[str, Any], str]], now: datetime) -> None:
    """Run INSERT_STATES for ``(name, task, definition, digest)`` rows."""
    run(alias, INSERT_STATES, {"rows": _definitions(rows), "now": now})


def sync_states(alias: str, rows: Sequence[tuple[str, str, dict[str, Any], str]], now: datetime) -> None:
    """Run SYNC_STATES for ``(name, task, definition, digest)`` rows."""
    run(alias, SYNC_STATES, {"rows": _definitions(rows), "now": now})


def deactivate(alias: str, names: Sequence[str], now: datetime) -> None:
    """Run DEACTIVATE."""
    run(alias, DEACTIVATE, {"names": list(names), "now": now})


def advance(alias: str, advances: Sequence[Advance], now: datetime) -> None:
    """Run ADVANCE."""
    rows = [
        {
            "name": a.name,
            "tick": a.tick and a.tick.isoformat(),
            "job_id": a.job_id,
            "skip_at": a.skip_at and a.skip_at.isoformat(),
            "skip_reason": a.skip_reason,
        }
        for a in advances
    ]
    run(alias, ADVANCE, {"rows": json.dumps(rows, ensure_ascii=False), "now": now})


def lock_states(alias: str, names: Sequence[str]) -> dict[str, LockedState]:
    """Run LOCK_STATES (in the caller's transaction); return the locked rows by name."""
    return {row[0]: LockedState(*row) for row in execute(alias, LOCK_STATES, {"names": list(names)})}
