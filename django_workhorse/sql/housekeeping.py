"""Housekeeping: purge queued jobs, prune free bindings and finished jobs, the worker registry.

The maintenance lease that lets one run at a time is in ``sql.leases``."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from django_workhorse.sql.connection import execute, run
from django_workhorse.sql.keys import FREE, TERMINAL

# purge_queued: delete queued jobs of a queue (or by id), in one statement. Their bindings are
# released at once, and their events, checkpoints (a job waiting for a retry may have some) and
# lineage records go too: every child row of a job references it ON DELETE CASCADE (models.JOB_CHILD).
# Running and finished jobs are left alone, and so are workflow steps (their edges would go with them,
# their children waiting for ever). Jobs are locked in id order, skipping those locked by
# anyone else.
PURGE_QUEUED = """
WITH doomed AS MATERIALIZED (
    SELECT id FROM workhorse_job
    WHERE status = 'queued' AND workflow_id IS NULL
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(job_ids)s::bigint[] IS NULL OR id = ANY(%(job_ids)s::bigint[]))
    ORDER BY id
    FOR UPDATE SKIP LOCKED
)
DELETE FROM workhorse_job WHERE id IN (SELECT id FROM doomed)
"""


# prune_expired_bindings: delete up to %(limit)s bindings whose time is up and that own nothing
# (a debounce key also waits for its job to finish); uses workhorse_binding_expires_idx. Unique
# keys have no time: they go with their finished job (prune_finished_jobs).
PRUNE_EXPIRED_BINDINGS = f"""
DELETE FROM workhorse_binding
WHERE id IN (
    SELECT binding.id FROM workhorse_binding AS binding
    JOIN workhorse_job AS job ON job.id = binding.job_id
    WHERE binding.expires_at <= statement_timestamp()
      AND {FREE.format(now="statement_timestamp()")}
    LIMIT %(limit)s
    FOR UPDATE OF binding SKIP LOCKED
)
"""


# register_worker: record this worker process (a restart under the same name replaces it): a
# worker, a supervisor of child processes, or one of its children (naming its supervisor), and the
# job types it claims (job_types NULL: not said, a worker from before capabilities, which claims any
# type).
REGISTER_WORKER = """
INSERT INTO workhorse_worker (
    name, host, pid, queues, concurrency, started_at, heartbeat_at, kind, supervisor, state, job_types
)
VALUES (%(name)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, clock_timestamp(), clock_timestamp(),
        %(kind)s, %(supervisor)s, 'running', %(job_types)s::jsonb)
ON CONFLICT (name) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at, state = 'running', job_types = EXCLUDED.job_types
"""


# set_worker_state: what the process is doing now (running, draining, recycling, replacing, ...).
SET_WORKER_STATE = "UPDATE workhorse_worker SET state = %(state)s WHERE name = %(name)s"


# touch_worker: this worker is alive (workhorse_worker_name_uniq).
TOUCH_WORKER = "UPDATE workhorse_worker SET heartbeat_at = clock_timestamp() WHERE name = %(name)s"


# deregister_worker: a clean exit.
DEREGISTER_WORKER = "DELETE FROM workhorse_worker WHERE name = %(name)s"


# prune_stale_workers: forget workers that stopped heartbeating (killed, host lost).
PRUNE_STALE_WORKERS = "DELETE FROM workhorse_worker WHERE heartbeat_at < clock_timestamp() - %(stale_after)s"


# prune_finished_jobs: delete the next chunk of jobs that finished before %(before)s and whose
# bindings own nothing any more (a live key always finds its job); those bindings, their events,
# checkpoints and redrive records (as source or as new job) go with them (ON DELETE CASCADE).
# The chunk is the next %(limit)s candidates of workhorse_job_finished_idx in (finished_at, id)
# order after the cursor (%(after_at)s, %(after_id)s) the previous chunk returned: each chunk
# starts where the last one stopped instead of walking again over the index entries and heap rows
# of the jobs it deleted (dead until vacuum), and a kept job (its key still live, or locked by
# someone else) is passed over once, not read again by every later chunk. Those not locked by
# anyone else are locked in id order (SKIP LOCKED): a prune never waits for a worker. Workflow
# steps are not candidates (a workflow is pruned whole: PRUNE_FINISHED_WORKFLOWS), and a flagged
# result nobody has read yet (awaited) is kept until %(results_before)s (WORKHORSE_RESULT_RETENTION).
PRUNE_FINISHED_JOBS = f"""
WITH candidates AS MATERIALIZED (
    SELECT id, finished_at FROM workhorse_job
    WHERE status IN {TERMINAL} AND finished_at < %(before)s AND workflow_id IS NULL
      AND finished_at >= %(after_at)s AND (finished_at > %(after_at)s OR id > %(after_id)s)
    ORDER BY finished_at, id
    LIMIT %(limit)s
),
doomed AS MATERIALIZED (
    SELECT id FROM workhorse_job AS job
    WHERE id IN (SELECT id FROM candidates) AND status IN {TERMINAL}
      AND NOT (job.awaited AND job.finished_at >= %(results_before)s)
      AND NOT EXISTS (
          SELECT 1 FROM workhorse_binding AS binding
          WHERE binding.job_id = job.id AND NOT ({FREE.format(now="statement_timestamp()")})
      )
    ORDER BY id
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM workhorse_job WHERE id IN (SELECT id FROM doomed) RETURNING id
)
SELECT (SELECT count(*) FROM deleted), last.finished_at, last.id, (SELECT count(*) FROM candidates)
FROM (SELECT finished_at, id FROM candidates ORDER BY finished_at DESC, id DESC LIMIT 1) AS last
"""

# A workflow may go when every job of it (each step's lineage: the original and its redrives) is
# terminal and finished before %(before)s, none holds a flagged result unread since
# %(results_before)s, and no binding of it (its anchor's key) is still live. Over ``flow``.
_WORKFLOW_DONE = f"""NOT EXISTS (
        SELECT 1 FROM workhorse_job AS step
        WHERE step.workflow_id = flow.id
          AND NOT (step.status IN {TERMINAL} AND step.finished_at < %(before)s
                   AND NOT (step.awaited AND step.finished_at >= %(results_before)s))
    )
    AND NOT EXISTS (
        SELECT 1 FROM workhorse_job AS job JOIN workhorse_binding AS binding ON binding.job_id = job.id
        WHERE job.workflow_id = flow.id AND NOT ({FREE.format(now="statement_timestamp()")})
    )"""

# lock_finished_workflows: the first half of pruning workflows, whole (their jobs, edges, events and
# bindings go by ON DELETE CASCADE). The chunk is the next %(limit)s workflow steps of
# workhorse_job_finished_idx after the cursor, as PRUNE_FINISHED_JOBS walks it; their workflows that
# may go (_WORKFLOW_DONE, through workhorse_job_workflow_idx) are locked with every one of their jobs
# (SKIP LOCKED, id order), and only those whose jobs were all locked are returned: a prune never
# waits, and a workflow is deleted whole or not at all. Returns them and the cursor.
LOCK_FINISHED_WORKFLOWS = f"""
WITH candidates AS MATERIALIZED (
    SELECT id, finished_at, workflow_id FROM workhorse_job
    WHERE status IN {TERMINAL} AND finished_at < %(before)s AND workflow_id IS NOT NULL
      AND finished_at >= %(after_at)s AND (finished_at > %(after_at)s OR id > %(after_id)s)
    ORDER BY finished_at, id
    LIMIT %(limit)s
),
done AS MATERIALIZED (
    SELECT flow.id FROM workhorse_workflow AS flow
    WHERE flow.id IN (SELECT workflow_id FROM candidates) AND {_WORKFLOW_DONE}
    ORDER BY flow.id
    FOR UPDATE OF flow SKIP LOCKED
),
locked AS MATERIALIZED (
    SELECT job.id, job.workflow_id FROM workhorse_job AS job
    WHERE job.workflow_id IN (SELECT id FROM done)
    ORDER BY job.id
    FOR UPDATE OF job SKIP LOCKED
),
whole AS (
    SELECT done.id FROM done
    WHERE (SELECT count(*) FROM locked WHERE locked.workflow_id = done.id)
          = (SELECT count(*) FROM workhorse_job AS job WHERE job.workflow_id = done.id)
)
SELECT (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM whole), last.finished_at, last.id,
       (SELECT count(*) FROM candidates)
FROM (SELECT finished_at, id FROM candidates ORDER BY finished_at DESC, id DESC LIMIT 1) AS last
"""

# delete_finished_workflows: the second half, in the same transaction and a fresh snapshot: delete
# the workflows LOCK_FINISHED_WORKFLOWS locked that still may go. A redrive committed between the
# two statements is seen here (its new job is not finished) and keeps its workflow; a later one
# waits for the locks, then finds no job to redrive.
DELETE_FINISHED_WORKFLOWS = f"""
DELETE FROM workhorse_workflow AS flow
WHERE flow.id = ANY(%(workflow_ids)s::bigint[]) AND {_WORKFLOW_DONE}
"""


def register_worker(
    alias: str,
    *,
    name: str,
    queues: Sequence[str],
    concurrency: int,
    kind: str = "worker",
    supervisor: str = "",
    job_types: Sequence[str] | None = None,
) -> None:
    """Run REGISTER_WORKER for this process, on this host (``job_types``: what the worker claims,
    ``tasks.registry.capabilities()``)."""
    params = {
        "name": name, "host": socket.gethostname(), "pid": os.getpid(), "queues": json.dumps(list(queues)), "concurrency": concurrency,
        "kind": kind, "supervisor": supervisor, "job_types": None if job_types is None else json.dumps(list(job_types)),
    }  # fmt: skip
    run(alias, REGISTER_WORKER, params)


def set_worker_state(alias: str, name: str, state: str) -> None:
    """Run SET_WORKER_STATE."""
    run(alias, SET_WORKER_STATE, {"name": name, "state": state})


def touch_worker(alias: str, name: str) -> bool:
    """Run TOUCH_WORKER; return whether the worker's record was there to touch."""
    return run(alias, TOUCH_WORKER, {"name": name}) > 0


def deregister_worker(alias: str, name: str) -> None:
    """Run DEREGISTER_WORKER."""
    run(alias, DEREGISTER_WORKER, {"name": name})


def prune_stale_workers(alias: str, stale_after: timedelta) -> int:
    """Run PRUNE_STALE_WORKERS; return how many records were deleted."""
    return run(alias, PRUNE_STALE_WORKERS, {"stale_after": stale_after})


@dataclass(frozen=True)
class PruneCursor:
    """Where the next chunk of prune_finished_jobs starts: after this (finished_at, id)."""

    finished_at: datetime = datetime(1, 1, 1, tzinfo=timezone.utc)
    id: int = 0


def _chunk_params(before: datetime, results_before: datetime, limit: int, after: PruneCursor) -> dict[str, Any]:
    """The parameters of one chunk of a walk of workhorse_job_finished_idx from ``after``."""
    return {
        "before": before,
        "results_before": results_before,
        "limit": limit,
        "after_at": after.finished_at,
        "after_id": after.id,
    }


def prune_finished_jobs(
    alias: str,
    *,
    before: datetime,
    results_before: datetime,
    limit: int,
    after: PruneCursor = PruneCursor(),
) -> tuple[int, PruneCursor | None]:
    """Run PRUNE_FINISHED_JOBS once; return how many jobs were deleted and the cursor of the next
    chunk (None when this chunk was the last: it had fewer than ``limit`` candidates)."""
    rows = execute(alias, PRUNE_FINISHED_JOBS, _chunk_params(before, results_before, limit, after))
    if not rows:
        return 0, None
    deleted, finished_at, last_id, candidates = rows[0]
    return int(deleted), (PruneCursor(finished_at, last_id) if candidates == limit else None)


def lock_finished_workflows(
    alias: str,
    *,
    before: datetime,
    results_before: datetime,
    limit: int,
    after: PruneCursor = PruneCursor(),
) -> tuple[list[int], PruneCursor | None]:
    """Run LOCK_FINISHED_WORKFLOWS (in the caller's transaction); return the workflows locked whole
    and the cursor of the next chunk (None when this chunk was the last)."""
    rows = execute(alias, LOCK_FINISHED_WORKFLOWS, _chunk_params(before, results_before, limit, after))
    if not rows:
        return [], None
    workflow_ids, finished_at, last_id, candidates = rows[0]
    return list(workflow_ids), (PruneCursor(finished_at, last_id) if candidates == limit else None)


def delete_finished_workflows(
    alias: str, *, workflow_ids: Sequence[int], before: datetime, results_before: datetime
) -> int:
    """Run DELETE_FINISHED_WORKFLOWS (after LOCK_FINISHED_WORKFLOWS, in its transaction); return how
    many workflows were deleted."""
    params = {"workflow_ids": list(workflow_ids), "before": before, "results_before": results_before}
    return run(alias, DELETE_FINISHED_WORKFLOWS, params)


def purge_queued(alias: str, *, queue: str | None, job_ids: Sequence[int] | None) -> int:
    """Run PURGE_QUEUED; return how many jobs were deleted."""
    return run(alias, PURGE_QUEUED, {"queue": queue, "job_ids": list(job_ids) if job_ids is not None else None})


def prune_expired_bindings(alias: str, *, limit: int) -> int:
    """Run PRUNE_EXPIRED_BINDINGS once; return how many bindings were deleted."""
    return run(alias, PRUNE_EXPIRED_BINDINGS, {"limit": limit})
