"""Capability (decision 0021, "Capability"): hold the jobs no live worker can run out of the claims' way,
and give them back when a worker that can run them registers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from django_workhorse.sql.claims import CAPABLE, capability_parameters
from django_workhorse.sql.connection import execute, run

# A live worker serving the job's queue claims its type: one whose row says nothing of its types (a
# worker from before capabilities claims any), lists the type, or lists a 'module.*' prefix of it.
_SOME_LIVE_WORKER_RUNS = """EXISTS (
    SELECT 1 FROM workhorse_worker AS live
    WHERE live.heartbeat_at >= clock_timestamp() - %(stale_after)s AND live.queues ? ahead.queue
      AND (live.job_types IS NULL OR live.job_types ? ahead.job_type
           OR EXISTS (SELECT 1 FROM jsonb_array_elements_text(live.job_types) AS entry(name)
                      WHERE right(entry.name, 2) = '.*' AND starts_with(ahead.job_type, left(entry.name, -1)))))"""

# hold_without_handler: among the first %(limit)s due jobs of each queue in claim order (read through
# workhorse_job_ready_idx, as the claim reads them), hold those no live worker serving the queue can run:
# run_at = now + %(hold)s, held_since set, a 'held' event with reason 'no handler'; their attempt is
# untouched. Held, they leave the due range: a claim no longer reads past them to reach the jobs of its
# own types behind them (of their priority or lower). Locks the jobs in id order, skipping locked ones.
HOLD_WITHOUT_HANDLER = f"""
WITH ahead AS (
    SELECT job.id, job.queue, job.job_type
    FROM unnest(%(queues)s::text[]) AS wanted(queue), LATERAL (
        SELECT id, queue, job_type FROM workhorse_job
        WHERE status = 'queued' AND queue = wanted.queue AND run_at <= clock_timestamp()
        ORDER BY priority DESC, run_at, id
        LIMIT %(limit)s
    ) AS job
),
orphans AS MATERIALIZED (
    SELECT job.id FROM workhorse_job AS job JOIN ahead ON ahead.id = job.id
    WHERE job.status = 'queued' AND NOT {_SOME_LIVE_WORKER_RUNS}
    ORDER BY job.id
    FOR NO KEY UPDATE OF job SKIP LOCKED
),
held AS (
    UPDATE workhorse_job AS job
    SET run_at = clock_timestamp() + %(hold)s, held_since = coalesce(job.held_since, clock_timestamp())
    FROM orphans WHERE job.id = orphans.id
    RETURNING job.id, job.attempt, job.run_at
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'held', attempt, clock_timestamp(), jsonb_build_object('reason', 'no handler', 'until', run_at)
    FROM held
)
SELECT count(*) FROM held
"""

# return_runnable: when a worker registers, the jobs held for want of a handler that it can run
# (%(job_types)s, %(job_type_patterns)s as in the claim) come back at once: run_at = now, held_since
# NULL. Held jobs without a breaker key or rate limit are held only for this (breakers and rate limits
# hold theirs); reads the worker's queues through workhorse_job_ready_idx, locks in id order.
RETURN_RUNNABLE = f"""
WITH runnable AS MATERIALIZED (
    SELECT id FROM workhorse_job
    WHERE status = 'queued' AND queue = ANY(%(queues)s::text[]) AND held_since IS NOT NULL
      AND breaker_key IS NULL AND rate_limit IS NULL AND run_at > clock_timestamp() AND {CAPABLE}
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE workhorse_job AS job SET run_at = clock_timestamp(), held_since = NULL
FROM runnable WHERE job.id = runnable.id
"""

# How many due jobs of each queue hold_without_handler looks at, in claim order, at most.
HOLD_SCAN_LIMIT = 1000


def hold_without_handler(
    alias: str, *, queues: Sequence[str], hold: timedelta, stale_after: timedelta, limit: int = HOLD_SCAN_LIMIT
) -> int:
    """Run HOLD_WITHOUT_HANDLER; return how many jobs it held."""
    params = {"queues": list(queues), "hold": hold, "stale_after": stale_after, "limit": limit}
    return int(execute(alias, HOLD_WITHOUT_HANDLER, params)[0][0])


def return_runnable(alias: str, *, queues: Sequence[str], job_types: Sequence[str] | None) -> int:
    """Run RETURN_RUNNABLE for a worker that claims ``job_types`` (``tasks.registry.capabilities()``; None,
    any type: nothing is held for such a worker's queues' sake); return how many jobs came back."""
    if job_types is None:
        return 0
    exact, patterns = capability_parameters(job_types)
    return run(alias, RETURN_RUNNABLE, {"queues": list(queues), "job_types": exact, "job_type_patterns": patterns})
