"""Workflow control (decision 0022 §2): cancel a step's waiting descendants, cancel a whole
workflow, and derive each workflow's state from its steps' current jobs.

A step's *current* job is the highest id of its lineage (its original job, then its redrives), found
through workhorse_job_workflow_idx (workflow_id, step_name, id). Every statement here locks jobs in
id order, the rule above sql.claims' extend_leases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django_workhorse.sql.awaiting import channel_param, notify_result
from django_workhorse.sql.connection import execute

# cascade_cancel: cancel every waiting descendant of the given steps (already cancelled, and locked
# by the caller's transaction), following workhorse_job_dependency child by child (its unique
# (child_id, parent_id) index, and workhorse_dep_parent_idx from each parent). A step that stopped
# waiting meanwhile is left alone. Every edge counts, allow_failure or not: cancel means "not this,
# nor what follows". Each cancelled step's event names the cancelled step whose cascade reached it
# first (the lowest id). The recursion carries (step, cause) pairs, so a diamond is walked once
# per cause, not once per path. Announces each flagged step it cancelled on the result channel
# (sql.awaiting). Returns the ids cancelled.
CASCADE_CANCEL = f"""
WITH RECURSIVE descendants(id, cause) AS (
    SELECT edge.child_id, edge.parent_id
    FROM workhorse_job_dependency AS edge
    WHERE edge.parent_id = ANY(%(job_ids)s::bigint[])
    UNION
    SELECT edge.child_id, descendants.cause
    FROM descendants JOIN workhorse_job_dependency AS edge ON edge.parent_id = descendants.id
),
causes AS MATERIALIZED (
    SELECT DISTINCT ON (id) id, cause FROM descendants ORDER BY id, cause
),
doomed AS MATERIALIZED (
    SELECT job.id FROM workhorse_job AS job JOIN causes ON causes.id = job.id
    WHERE CASE WHEN true THEN job.status = 'waiting' END
    ORDER BY job.id
    FOR NO KEY UPDATE OF job
),
cancelled AS (
    UPDATE workhorse_job AS job SET status = 'cancelled', finished_at = clock_timestamp()
    FROM doomed
    WHERE job.id = doomed.id
    RETURNING job.id, job.attempt, job.status, job.awaited
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT cancelled.id, 'cancelled', cancelled.attempt, clock_timestamp(),
           jsonb_build_object('cause', causes.cause, 'requested_by', %(requested_by)s::text)
    FROM cancelled JOIN causes ON causes.id = cancelled.id
)
SELECT id, {notify_result("cancelled")} FROM cancelled ORDER BY id
"""

# The current job of each step of the workflows %(workflow_ids)s.
_CURRENT = """current AS MATERIALIZED (
    SELECT DISTINCT ON (workflow_id, step_name) id, workflow_id, step_name, status
    FROM workhorse_job
    WHERE workflow_id = ANY(%(workflow_ids)s::bigint[])
    ORDER BY workflow_id, step_name, id DESC
)"""

# cancel_workflow: lock the current job of every step of one workflow in id order; cancel those
# waiting or queued, ask those running to stop (ctx.cancelled at their next heartbeat), with an
# event naming who asked. Steps already finished, or already asked to stop, are left alone, so a
# second call changes nothing. Announces each flagged step it cancelled on the result channel.
# Returns each step changed and its status before.
CANCEL_WORKFLOW = f"""
WITH {_CURRENT},
target AS MATERIALIZED (
    SELECT job.id, job.status FROM workhorse_job AS job JOIN current ON current.id = job.id
    WHERE CASE WHEN true THEN job.status IN ('waiting', 'queued')
                              OR (job.status = 'running' AND NOT job.cancel_requested) END
    ORDER BY job.id
    FOR NO KEY UPDATE OF job
),
changed AS (
    UPDATE workhorse_job AS job
    SET status = CASE WHEN target.status = 'running' THEN job.status ELSE 'cancelled' END,
        finished_at = CASE WHEN target.status = 'running' THEN job.finished_at ELSE clock_timestamp() END,
        cancel_requested = target.status = 'running'
    FROM target
    WHERE job.id = target.id
    RETURNING job.id, job.attempt, target.status AS was, job.status, job.awaited
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, CASE WHEN was = 'running' THEN 'cancel_requested' ELSE 'cancelled' END, attempt,
           clock_timestamp(), jsonb_build_object('requested_by', %(requested_by)s::text, 'workflow', true)
    FROM changed
)
SELECT id, was, {notify_result("changed")} FROM changed ORDER BY id
"""

# workflow_state: per workflow, its steps' current jobs counted by status, and whether a dead
# current step holds a waiting child by an edge without allow_failure (blocked), or is not
# tolerated (failed: a dead step is tolerated when it has children and every edge to them allows
# failure). Only dead steps' edges are read (workhorse_dep_parent_idx). One query for any number of
# workflows; a workflow with no row does not exist.
WORKFLOW_STATE = f"""
WITH {_CURRENT}
SELECT current.workflow_id,
       count(*) FILTER (WHERE current.status = 'waiting'),
       count(*) FILTER (WHERE current.status = 'queued'),
       count(*) FILTER (WHERE current.status = 'running'),
       count(*) FILTER (WHERE current.status = 'succeeded'),
       count(*) FILTER (WHERE current.status = 'dead'),
       count(*) FILTER (WHERE current.status = 'cancelled'),
       coalesce(bool_or(current.status = 'dead' AND EXISTS (
           SELECT 1 FROM workhorse_job_dependency AS edge JOIN workhorse_job AS child ON child.id = edge.child_id
           WHERE edge.parent_id = current.id AND NOT edge.allow_failure AND child.status = 'waiting'
       )), false),
       coalesce(bool_or(current.status = 'dead' AND NOT coalesce((
           SELECT bool_and(edge.allow_failure) FROM workhorse_job_dependency AS edge WHERE edge.parent_id = current.id
       ), false)), false)
FROM current
GROUP BY current.workflow_id
"""


@dataclass(frozen=True)
class StepCounts:
    """A workflow's steps (their current jobs) by status, and what its dead steps hold back."""

    waiting: int
    queued: int
    running: int
    succeeded: int
    dead: int
    cancelled: int
    blocked: bool  # a dead step holds a waiting child by an edge without allow_failure
    failed: bool  # a dead step is not tolerated by its children's edges


def cascade_cancel(alias: str, job_ids: Sequence[int], requested_by: str) -> list[int]:
    """Run CASCADE_CANCEL from the cancelled steps ``job_ids``; return the descendants cancelled."""
    params = {"job_ids": list(job_ids), "requested_by": requested_by, **channel_param()}
    return [row[0] for row in execute(alias, CASCADE_CANCEL, params)]


def cancel_workflow(alias: str, workflow_id: int, requested_by: str) -> list[tuple[int, str]]:
    """Run CANCEL_WORKFLOW; return (job id, status before) of each step changed."""
    params = {"workflow_ids": [workflow_id], "requested_by": requested_by, **channel_param()}
    return [(row[0], row[1]) for row in execute(alias, CANCEL_WORKFLOW, params)]


def workflow_states(alias: str, workflow_ids: Sequence[int]) -> dict[int, StepCounts]:
    """Run WORKFLOW_STATE; return the step counts of each workflow found."""
    rows = execute(alias, WORKFLOW_STATE, {"workflow_ids": list(workflow_ids)})
    return {row[0]: StepCounts(*row[1:]) for row in rows}
