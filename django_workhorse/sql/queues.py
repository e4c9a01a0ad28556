"""Queue control: pause and resume a queue (a ``workhorse_queue`` row that every claim reads), and
what a drain waits for."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django_workhorse.sql.connection import execute

QUEUE_COLUMNS = "queue, paused, changed_at, changed_by"

# set_paused: pause (or resume) one queue, an upsert on the primary key workhorse_queue_pkey that
# changes nothing when the queue already is so (the first pause's time and author stay). A resume
# that changed the row wakes the workers listening on the channel (sent on commit). Returns the
# row and whether this statement wrote it; no row when a racing transaction wrote it first and our
# snapshot cannot see it (read it again with QUEUE_STATE).
SET_PAUSED = f"""
WITH written AS (
    INSERT INTO workhorse_queue AS row ({QUEUE_COLUMNS})
    VALUES (%(queue)s, %(paused)s, clock_timestamp(), %(changed_by)s)
    ON CONFLICT (queue) DO UPDATE
    SET paused = excluded.paused, changed_at = excluded.changed_at, changed_by = excluded.changed_by
    WHERE row.paused <> excluded.paused
    RETURNING {QUEUE_COLUMNS}
),
notified AS (SELECT pg_notify(%(channel)s, queue) FROM written WHERE NOT paused)
SELECT true, {QUEUE_COLUMNS} FROM written CROSS JOIN (SELECT count(*) FROM notified) AS sent
UNION ALL
SELECT false, {QUEUE_COLUMNS} FROM workhorse_queue
WHERE queue = %(queue)s AND NOT EXISTS (SELECT 1 FROM written)
"""

# queue_state: one queue's row, by its primary key.
QUEUE_STATE = f"SELECT false, {QUEUE_COLUMNS} FROM workhorse_queue WHERE queue = %(queue)s"

# drain_check: the ids of the queue's running jobs (workhorse_job_lease_idx covers running jobs),
# and how many transactions of other client sessions began before %(since)s and are still open: a
# claim among them may have read the queue before the pause committed, and not committed yet.
DRAIN_CHECK = """
SELECT coalesce((SELECT array_agg(id ORDER BY id) FROM workhorse_job
                 WHERE status = 'running' AND queue = %(queue)s), '{}'::bigint[]),
       (SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()
          AND xact_start < %(since)s)::int
"""


def set_paused(alias: str, queue: str, *, paused: bool, changed_by: str, channel: str) -> tuple[Any, ...]:
    """Run SET_PAUSED; return (written, queue, paused, changed_at, changed_by)."""
    params = {"queue": queue, "paused": paused, "changed_by": changed_by, "channel": channel}
    rows = execute(alias, SET_PAUSED, params) or execute(alias, QUEUE_STATE, {"queue": queue})
    return rows[0]


def drain_check(alias: str, queue: str, since: datetime) -> tuple[list[int], int]:
    """Run DRAIN_CHECK; return the ids of the queue's running jobs and the older transactions still open."""
    [(running, older)] = execute(alias, DRAIN_CHECK, {"queue": queue, "since": since})
    return list(running), older
