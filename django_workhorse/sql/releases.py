"""Workflow release (decision 0022 §2): the statements that end a job also release the workflow
children whose last dependency it was, in the same statement, so a step becomes claimable in the
transaction that records its last parent's success, and never twice.

A child's ``pending_parents`` counts its dependencies not yet satisfied. An edge is satisfied when
its parent succeeds, or dies and the edge allows failure. Each release decrements the locked child
row by the edges it satisfies; a concurrent release of the same child waits for that row lock and
decrements the committed value (READ COMMITTED re-reads the row it updates), so exactly one of them
brings the counter to zero and makes the child ``queued``. Only jobs whose end the statement wrote
count: a stale lease, a second recording of one attempt, or a retry (``queued``) releases nothing.
"""

from __future__ import annotations

# An edge is satisfied by a parent that succeeded, or by one that died when the edge allows failure.
SATISFIES = "(ended.status = 'succeeded' OR (ended.status = 'dead' AND edge.allow_failure))"

# The release, from ``{ended}`` (a CTE of the jobs the statement ended: id, status) and ``{locked}``
# (the waiting children the statement holds locked: id; locked while waiting, so still waiting).
# ``satisfied`` counts per child the edges the ended jobs satisfy (edges through
# workhorse_dep_parent_idx); ``releases`` keeps those of locked children, materialized, so that
# ``released`` updates them by primary key, whatever the planner believes of the table (a
# nested loop over the waiting index with the join as a filter was quadratic in the children: 0.6 s
# for one parent of 999); ``released`` decrements them, a child whose count reaches zero becoming
# queued (its run_at, counted from its enqueue, is a floor);
# ``ready_events`` names the parent that released it; ``released_notified`` wakes the workers of its
# queue at commit, once per queue. The statement's final SELECT must read ``released_notified``: a
# SELECT CTE that nothing reads is not run.
_RELEASE_CTES = """satisfied AS (
    SELECT edge.child_id, count(*) AS n, min(ended.id) AS parent
    FROM {ended} AS ended JOIN workhorse_job_dependency AS edge ON edge.parent_id = ended.id
    WHERE {satisfies}
    GROUP BY edge.child_id
),
releases AS MATERIALIZED (
    SELECT satisfied.child_id AS id, satisfied.n, satisfied.parent
    FROM satisfied JOIN {locked} AS locked ON locked.id = satisfied.child_id
),
released AS (
    UPDATE workhorse_job AS job
    SET pending_parents = job.pending_parents - releases.n,
        status = CASE WHEN job.pending_parents = releases.n THEN 'queued' ELSE 'waiting' END,
        run_at = CASE WHEN job.pending_parents = releases.n THEN greatest(job.run_at, clock_timestamp())
                      ELSE job.run_at END
    FROM releases
    WHERE job.id = releases.id
    RETURNING job.id, job.queue, job.status, job.attempt, releases.parent
),
ready_events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'ready', attempt, clock_timestamp(), jsonb_build_object('released_by', parent)
    FROM released WHERE status = 'queued'
),
released_notified AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM released WHERE status = 'queued') AS ready
)"""

# The waiting children of the jobs ``{ended}`` made dead by an edge that allows failure (the only
# edges a death satisfies), locked in id order, after their parents. Found by primary key: the
# CASE keeps the planner from reading every waiting step through workhorse_job_waiting_idx.
_DEATH_CHILD_LOCKS = """child_locks AS MATERIALIZED (
    SELECT job.id
    FROM (SELECT DISTINCT edge.child_id FROM {ended} AS ended
          JOIN workhorse_job_dependency AS edge ON edge.parent_id = ended.id
          WHERE ended.status = 'dead' AND edge.allow_failure) AS child
    JOIN workhorse_job AS job ON job.id = child.child_id
    WHERE CASE WHEN true THEN job.status = 'waiting' END
    ORDER BY job.id
    FOR NO KEY UPDATE OF job
)"""


def release_ctes(ended: str, locked: str) -> str:
    """The release CTEs, the ended jobs read from CTE ``ended``, the locked children from ``locked``."""
    return _RELEASE_CTES.format(ended=ended, locked=locked, satisfies=SATISFIES)


def death_release_ctes(ended: str) -> str:
    """The release CTEs for a statement that only buries jobs (``ended``), with their children's locks."""
    return f"{_DEATH_CHILD_LOCKS.format(ended=ended)},\n{release_ctes(ended, 'child_locks')}"
