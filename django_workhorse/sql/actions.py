"""Operator actions on jobs, keys and schedules: redrive, cancel, run now, release, pause and resume."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django_workhorse.enqueueing.fingerprints import DIGEST_HEX_CHARS
from django_workhorse.models import JOB_ID_SEQUENCE
from django_workhorse.sql.awaiting import channel_param, results_notified_cte
from django_workhorse.sql.connection import execute

# redrive: copy a dead job into a new queued job (clearing its deadline, not copying checkpoints;
# keeping its breaker, rate limit and partition and fair share key, so that it is admitted as its
# source was) and record the lineage, once per (source job, request id): ON CONFLICT DO NOTHING on
# workhorse_redrive_source_request_uniq. Returns the new job, or the redrive already recorded.
# A workflow step (decision 0022 §2) is redriven only from its current job, the latest of its
# lineage (workhorse_job_workflow_idx), which the caller has locked: the copy joins the step
# (workflow_id, step_name; root_id keeps it out of the step's unique index), gets the source's
# incoming edges (its parents, all finished: pending_parents 0), and takes over the outgoing edges
# without allow_failure, which its death left uncounted, so that its success releases those
# children once. Edges that allow failure stay: they were counted at the death.
REDRIVE = f"""
WITH source AS (
    SELECT * FROM workhorse_job AS job
    WHERE job.id = %(source_id)s AND job.status = 'dead'
      AND (job.workflow_id IS NULL OR NOT EXISTS (
          SELECT 1 FROM workhorse_job AS later
          WHERE later.workflow_id = job.workflow_id AND later.step_name = job.step_name AND later.id > job.id))
),
drawn AS (SELECT nextval('{JOB_ID_SEQUENCE}') AS job_id, statement_timestamp() AS now),
lineage AS (
    INSERT INTO workhorse_redrive (source_id, request_id, new_job_id, requested_by, reason, created_at)
    SELECT source.id, %(request_id)s, drawn.job_id, %(requested_by)s, %(reason)s, drawn.now FROM source, drawn
    ON CONFLICT (source_id, request_id) DO NOTHING
    RETURNING new_job_id
),
jobs AS (
    INSERT INTO workhorse_job (
        id, job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
        retry_policy, deadline, timeout, concurrency_key, concurrency_limit, tags, created_at, last_error, root_id,
        scheduled_for, trace_context, breaker_key, rate_limit, rate_partition, partition_key,
        workflow_id, step_name, cipher_salt)
    SELECT lineage.new_job_id, source.job_type, source.queue, source.payload, 'queued', source.priority,
           drawn.now, 0, source.max_attempts, source.retry_policy, NULL, source.timeout,
           source.concurrency_key, source.concurrency_limit, source.tags, drawn.now, '',
           coalesce(source.root_id, source.id), source.scheduled_for, source.trace_context,
           source.breaker_key, source.rate_limit, source.rate_partition, source.partition_key,
           source.workflow_id, source.step_name, source.cipher_salt
    FROM lineage, source, drawn
    RETURNING id, queue, created_at, workflow_id
),
parents AS (
    INSERT INTO workhorse_job_dependency (child_id, parent_id, allow_failure)
    SELECT jobs.id, edge.parent_id, edge.allow_failure
    FROM jobs JOIN workhorse_job_dependency AS edge ON edge.child_id = %(source_id)s
    WHERE jobs.workflow_id IS NOT NULL
),
children AS (
    UPDATE workhorse_job_dependency AS edge SET parent_id = jobs.id
    FROM jobs
    WHERE jobs.workflow_id IS NOT NULL AND edge.parent_id = %(source_id)s AND NOT edge.allow_failure
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT source.id, 'redriven', source.attempt, jobs.created_at,
           jsonb_build_object('new_job', jobs.id, 'requested_by', %(requested_by)s::text)
    FROM jobs, source
),
notified AS (SELECT pg_notify(%(channel)s, queue) FROM jobs)
SELECT true, jobs.id, NULL::text, NULL::text, jobs.queue FROM jobs CROSS JOIN (SELECT count(*) FROM notified) AS n
UNION ALL
SELECT false, redrive.new_job_id, redrive.requested_by, redrive.reason, NULL::text
FROM workhorse_redrive AS redrive
WHERE redrive.source_id = %(source_id)s AND redrive.request_id = %(request_id)s
  AND NOT EXISTS (SELECT 1 FROM lineage)
"""

# lock_redrive_source: lock a job about to be redriven, in the caller's transaction (FOR NO KEY
# UPDATE: a recorder or a prune waits), so that redrives of one job take turns and REDRIVE, the
# statement after, sees in its own snapshot the copy the one before it made. Returns its id.
LOCK_REDRIVE_SOURCE = "SELECT id FROM workhorse_job WHERE id = %(source_id)s FOR NO KEY UPDATE"


# find_redrive: a recorded redrive by (source, request id), via workhorse_redrive_source_request_uniq.
FIND_REDRIVE = """
SELECT false, new_job_id, requested_by, reason, NULL::text FROM workhorse_redrive
WHERE source_id = %(source_id)s AND request_id = %(request_id)s
"""


# cancel: stop a job. A queued or waiting job is cancelled at once; a running one is asked to stop
# (its handler sees ctx.cancelled at the next heartbeat). Returns the job's status before, and its
# workflow (a cancelled step's waiting descendants are cancelled next, in the same transaction), if
# the job exists; announces a cancelled job a wait flagged on the result channel (sql.awaiting).
# One row, locked first (FOR UPDATE): no lock order to keep.
CANCEL = f"""
WITH target AS (
    SELECT id, status, workflow_id FROM workhorse_job WHERE id = %(job_id)s FOR UPDATE
),
cancelled AS (
    UPDATE workhorse_job AS job
    SET status = CASE WHEN target.status IN ('queued', 'waiting') THEN 'cancelled' ELSE job.status END,
        finished_at = CASE WHEN target.status IN ('queued', 'waiting') THEN clock_timestamp() ELSE job.finished_at END,
        cancel_requested = target.status = 'running'
    FROM target
    WHERE job.id = target.id AND target.status IN ('queued', 'waiting', 'running')
    RETURNING job.id, job.attempt, target.status AS was, job.status, job.awaited
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, CASE WHEN was = 'running' THEN 'cancel_requested' ELSE 'cancelled' END, attempt,
           clock_timestamp(), jsonb_build_object('requested_by', %(requested_by)s::text)
    FROM cancelled
),
{results_notified_cte("cancelled")}
SELECT status, workflow_id FROM target, (SELECT count(*) FROM results_notified) AS results
"""


def redrive(
    alias: str, *, source_id: int, request_id: str, requested_by: str, reason: str, channel: str
) -> tuple[bool, int, str, str, str | None] | None:
    """Run REDRIVE; return (created, new job id, stored requested_by, stored reason, the new job's
    queue if created), or None."""
    params = {
        "source_id": source_id, "request_id": request_id, "requested_by": requested_by, "reason": reason,
        "channel": channel,
    }  # fmt: skip
    rows = execute(alias, REDRIVE, params)
    return tuple(rows[0]) if rows else None


def lock_redrive_source(alias: str, source_id: int) -> None:
    """Run LOCK_REDRIVE_SOURCE (in the caller's transaction)."""
    execute(alias, LOCK_REDRIVE_SOURCE, {"source_id": source_id})


def find_redrive(alias: str, *, source_id: int, request_id: str) -> tuple[bool, int, str, str, str | None] | None:
    """Read a recorded redrive in a fresh snapshot (one committed after REDRIVE's snapshot)."""
    rows = execute(alias, FIND_REDRIVE, {"source_id": source_id, "request_id": request_id})
    return tuple(rows[0]) if rows else None


def cancel(alias: str, job_id: int, requested_by: str) -> tuple[str, int | None] | None:
    """Run CANCEL; return the job's status before it and its workflow, or None if there is no such job."""
    rows = execute(alias, CANCEL, {"job_id": job_id, "requested_by": requested_by, **channel_param()})
    return (rows[0][0], rows[0][1]) if rows else None


# run_now: make scheduled queued jobs due now (an operator's "run now"), locking them in id
# order, record who asked, and wake the workers of their queues at commit.
RUN_NOW = """
WITH due AS MATERIALIZED (
    SELECT id FROM workhorse_job
    WHERE id = ANY(%(job_ids)s::bigint[]) AND status = 'queued' AND run_at > clock_timestamp()
    ORDER BY id
    FOR NO KEY UPDATE
),
moved AS (
    UPDATE workhorse_job AS job SET run_at = clock_timestamp()
    FROM due
    WHERE job.id = due.id
    RETURNING job.id, job.attempt, job.queue
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'run_now', attempt, clock_timestamp(), jsonb_build_object('requested_by', %(requested_by)s::text)
    FROM moved
),
notified AS (SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM moved) AS queues)
SELECT id FROM moved CROSS JOIN (SELECT count(*) FROM notified) AS n
"""


# release_binding: free a key at once (an operator's "release"), recording who did it on the job
# the key named. Returns the job ids whose keys were released. It updates no job: the event rows
# only take the key-share locks of their foreign key, which no job UPDATE here conflicts with.
RELEASE_BINDINGS = f"""
WITH released AS (
    DELETE FROM workhorse_binding WHERE id = ANY(%(binding_ids)s::bigint[])
    RETURNING job_id, mode, scope, encode(substring(key_hash from 1 for {DIGEST_HEX_CHARS // 2}), 'hex') AS key_digest
)
INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
SELECT released.job_id, 'key_released', job.attempt, clock_timestamp(), jsonb_build_object(
    'requested_by', %(requested_by)s::text, 'mode', released.mode, 'scope', released.scope,
    'key_digest', released.key_digest)
FROM released JOIN workhorse_job AS job ON job.id = released.job_id
RETURNING job_id
"""


def run_now(alias: str, job_ids: Sequence[int], requested_by: str, channel: str) -> list[int]:
    """Run RUN_NOW; return the ids of the jobs moved."""
    params = {"job_ids": list(job_ids), "requested_by": requested_by, "channel": channel}
    return [row[0] for row in execute(alias, RUN_NOW, params)]


def release_bindings(alias: str, binding_ids: Sequence[int], requested_by: str) -> list[int]:
    """Run RELEASE_BINDINGS; return the ids of the jobs whose keys were released."""
    params = {"binding_ids": list(binding_ids), "requested_by": requested_by}
    return [row[0] for row in execute(alias, RELEASE_BINDINGS, params)]


# set_paused: pause (or resume) the named schedules not already so, locking their rows in name order
# (the evaluators' order, so no deadlock) and re-checking under the lock, so of two racing requests
# one changes the row; record who asked. A resume moves the window start to now (never back): the
# ticks of the paused time are not caught up. Rows are found by workhorse_schedule_name_uniq.
SET_PAUSED = """
WITH target AS MATERIALIZED (
    SELECT id FROM workhorse_schedule
    WHERE name = ANY(%(names)s::text[]) AND paused <> %(paused)s
    ORDER BY name
    FOR NO KEY UPDATE
),
clock AS (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now),
changed AS (
    UPDATE workhorse_schedule AS schedule
    SET paused = %(paused)s, updated_at = clock.now,
        evaluated_until = CASE WHEN %(paused)s THEN schedule.evaluated_until
                               ELSE greatest(schedule.evaluated_until, clock.now) END
    FROM target, clock
    WHERE schedule.id = target.id
    RETURNING schedule.id, schedule.name, clock.now
),
events AS (
    INSERT INTO workhorse_schedule_event (schedule_id, kind, at, requested_by, request_id, job_id)
    SELECT id, %(kind)s, now, %(requested_by)s, '', NULL FROM changed
)
SELECT name FROM changed ORDER BY name
"""

# lock_schedule: lock one schedule's row (by workhorse_schedule_name_uniq) for a run-now, so the
# run-nows of one schedule take turns; with the database's clock, the instant of the request.
LOCK_SCHEDULE = """
SELECT id, active, clock_timestamp() FROM workhorse_schedule WHERE name = %(name)s FOR NO KEY UPDATE
"""


def set_paused(alias: str, names: Sequence[str], *, paused: bool, requested_by: str, now: datetime | None) -> list[str]:
    """Run SET_PAUSED; return the names of the schedules changed, in name order."""
    params = {
        "names": list(names), "paused": paused, "kind": "paused" if paused else "resumed",
        "requested_by": requested_by, "now": now,
    }  # fmt: skip
    return [row[0] for row in execute(alias, SET_PAUSED, params)]


def lock_schedule(alias: str, name: str) -> tuple[int, bool, datetime] | None:
    """Run LOCK_SCHEDULE (in the caller's transaction); return (id, active, clock), or None without a row."""
    rows = execute(alias, LOCK_SCHEDULE, {"name": name})
    return (rows[0][0], rows[0][1], rows[0][2]) if rows else None


# clock: the database's clock, which schedule actions (like evaluations) use as now.
CLOCK = "SELECT clock_timestamp()"


def clock(alias: str) -> datetime:
    """Run CLOCK."""
    value: datetime = execute(alias, CLOCK, {})[0][0]
    return value
