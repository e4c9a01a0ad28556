"""The statements that end a worker's hold on a job: record how attempts ended, give jobs back at a
clean stop, and reclaim expired leases. Each one that ends a workflow step also releases the
children it satisfies (sql.releases). They lock as the rule above sql.claims' extend_leases says."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django_workhorse.conf import app_settings
from django_workhorse.sql.awaiting import channel_param, notify_result, results_notified_cte
from django_workhorse.sql.connection import execute, execute_first
from django_workhorse.sql.releases import death_release_ctes, release_ctes

if TYPE_CHECKING:
    from django_workhorse.sql.claims import ClaimedJob

# record_outcomes: write how attempts ended, many in one statement, each fenced by its lease
# token: a worker whose lease expired (the job may be another worker's now) changes nothing.
# status is 'succeeded', 'queued' (a retry or a snooze at run_at; 'cancelled' instead when
# cancellation was requested meanwhile), 'cancelled' or 'dead'; each outcome brings its events. A
# snooze consumes no attempt: it gives back the one its claim counted, counts a snooze and keeps
# the last error of an earlier attempt (its events keep the claim's attempt number). A job given
# back (its handler missing after all: decision 0021, "Capability") does the same but counts no snooze. Locks the
# jobs in id order; announces on the result channel each flagged job it finished (sql.awaiting).
# Built from fragments, which its releasing form below shares.
OUTCOME_ROWS = """outcome AS (
    SELECT (o->>'id')::bigint AS id, (o->>'token')::uuid AS token, o->>'status' AS status,
           o->'result' AS result, o->>'error' AS error, (o->>'run_at')::timestamptz AS run_at,
           o->'events' AS events,
           CASE WHEN (o->>'snoozed')::boolean OR (o->>'given_back')::boolean THEN 1 ELSE 0 END AS snoozed,
           CASE WHEN (o->>'snoozed')::boolean THEN 1 ELSE 0 END AS snooze
    FROM jsonb_array_elements(%(outcomes)s::jsonb) AS o
)"""
_HELD_OUTCOMES = """held AS MATERIALIZED (
    SELECT job.id FROM workhorse_job AS job JOIN outcome ON outcome.id = job.id
    WHERE job.lease_token = outcome.token AND job.status = 'running'
    ORDER BY job.id
    FOR NO KEY UPDATE OF job
)"""
_FINISHED = """finished AS (
    UPDATE workhorse_job AS job
    SET status = CASE WHEN job.cancel_requested AND outcome.status = 'queued' THEN 'cancelled'
                      ELSE outcome.status END,
        result = outcome.result,
        last_error = CASE WHEN outcome.snoozed = 1 THEN job.last_error ELSE outcome.error END,
        run_at = coalesce(outcome.run_at, job.run_at), lease_token = NULL, lease_expires_at = NULL,
        finished_at = CASE WHEN outcome.status = 'queued' AND NOT job.cancel_requested
                           THEN NULL ELSE clock_timestamp() END,
        attempt = job.attempt - outcome.snoozed, snoozes = job.snoozes + outcome.snooze
    FROM held JOIN outcome ON outcome.id = held.id
    WHERE job.id = held.id{only_parents}
    RETURNING job.id, job.attempt + outcome.snoozed AS attempt, outcome.events, job.status, job.workflow_id,
              job.awaited
)"""
_EVENTS = """events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT finished.id, event->>0, finished.attempt, clock_timestamp(), event->1
    FROM finished, jsonb_array_elements(finished.events) AS event
)"""
RECORD_OUTCOMES = f"""
WITH {OUTCOME_ROWS},
{_HELD_OUTCOMES},
{_FINISHED.format(only_parents="")},
{_EVENTS}
SELECT id, {notify_result("finished")} FROM finished
"""

# record_outcomes_releasing: RECORD_OUTCOMES for a batch that holds a workflow step (a batch
# without one runs the statement above, free of CTEs it would never use). ``targets`` are the
# batch's jobs (with their lease tokens) and their children (through workhorse_dep_parent_idx: an
# index-only probe; no token); ``held`` locks, in one id-ordered pass, the batch's jobs whose lease
# still matches and their children still waiting, so the lock order holds for parents and children
# alike (a child that stopped waiting meanwhile, cancelled say, is re-checked once locked and left
# out). It finds them by primary key: its CASE keeps the planner off the partial indexes of
# running and waiting jobs, which a plain ``status = 'waiting'`` let it scan whole, every waiting
# step of every workflow read for each recording. Returns each recorded job and whether it
# is a workflow step that ended cancelled: its waiting descendants are cancelled next, in the same
# transaction.
RECORD_OUTCOMES_RELEASING = f"""
WITH {OUTCOME_ROWS},
targets AS MATERIALIZED (
    SELECT id, token FROM outcome
    UNION ALL
    SELECT DISTINCT edge.child_id, NULL::uuid
    FROM outcome JOIN workhorse_job_dependency AS edge ON edge.parent_id = outcome.id
),
held AS MATERIALIZED (
    SELECT job.id, targets.token IS NULL AS child
    FROM targets JOIN workhorse_job AS job ON job.id = targets.id
    WHERE CASE WHEN targets.token IS NULL THEN job.status = 'waiting'
               ELSE job.status = 'running' AND job.lease_token = targets.token END
    ORDER BY job.id
    FOR NO KEY UPDATE OF job
),
{_FINISHED.format(only_parents=" AND NOT held.child")},
{release_ctes("finished", "(SELECT id FROM held WHERE child)")},
{_EVENTS}
SELECT finished.id, finished.status = 'cancelled' AND finished.workflow_id IS NOT NULL,
       {notify_result("finished")}
FROM finished CROSS JOIN (SELECT count(*) FROM released_notified) AS notified
"""

# release: give held jobs back to the queue at once (a clean stop); an attempt that never started
# its handler is not counted, and one interrupted on its last attempt is dead, as a reclaimed one
# would be (releasing the children whose edges allow its failure, and announcing it if a wait
# flagged it). Fenced by the lease token; locks the jobs in id order.
_GIVE_BACK = """given_back AS (
    UPDATE workhorse_job AS job
    SET status = CASE WHEN held.started AND job.attempt >= job.max_attempts THEN 'dead' ELSE 'queued' END,
        last_error = CASE WHEN held.started AND job.attempt >= job.max_attempts
                          THEN '{last_words}' ELSE job.last_error END,
        finished_at = CASE WHEN held.started AND job.attempt >= job.max_attempts THEN clock_timestamp() END,
        lease_token = NULL, lease_expires_at = NULL, run_at = clock_timestamp(),
        attempt = job.attempt - CASE WHEN held.started THEN 0 ELSE 1 END
    FROM held
    WHERE job.id = held.id
    RETURNING job.id, job.attempt, job.status, job.awaited
)"""
_GIVEN_BACK = f"""{death_release_ctes("given_back")},
{results_notified_cte("given_back")},
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'released', attempt, clock_timestamp(), %(details)s::jsonb FROM given_back
    UNION ALL
    SELECT id, 'dead', attempt, clock_timestamp(), '{{}}'::jsonb FROM given_back WHERE status = 'dead'
)
SELECT count(*) FROM given_back, (SELECT count(*) FROM released_notified) AS notified,
    (SELECT count(*) FROM results_notified) AS results
"""
RELEASE = f"""
WITH held AS MATERIALIZED (
    SELECT job.id, mine.started FROM workhorse_job AS job
    JOIN unnest(%(job_ids)s::bigint[], %(tokens)s::uuid[], %(started)s::boolean[]) AS mine(id, token, started)
      ON mine.id = job.id
    WHERE job.lease_token = mine.token AND job.status = 'running'
    ORDER BY job.id
    FOR NO KEY UPDATE OF job
),
{_GIVE_BACK.format(last_words="interrupted by a worker shutdown on the last attempt")},
{_GIVEN_BACK}"""

# release_abandoned: a supervisor gives back at once the jobs of a child process that is gone (it
# died, or was killed on a forceful stop or past a hard time limit), rather than let their leases
# lapse. Fenced by the claim: only running jobs whose last claim was that child's (a job reclaimed
# and claimed by another worker since names that worker) are touched; the child's name is unique to
# that process, and the supervisor calls this only once the process has exited. An attempt whose
# handler had started counts (a job that kills its worker every time ends dead, as a reclaimed one
# would); one still waiting in the child's batch does not. Locks the jobs in id order.
RELEASE_ABANDONED = f"""
WITH held AS MATERIALIZED (
    SELECT job.id, job.id = ANY(%(started)s::bigint[]) AS started FROM workhorse_job AS job
    WHERE job.status = 'running' AND job.claimed_by = %(worker)s
    ORDER BY job.id
    FOR NO KEY UPDATE OF job
),
{_GIVE_BACK.format(last_words="its worker process was gone on the last attempt")},
{_GIVEN_BACK}"""

# reclaim_expired: requeue running jobs whose lease expired (their worker died or stalled), or
# bury them when that was their last attempt (releasing the children whose edges allow it, and
# announcing the flagged ones on the result channel). Up to
# %(limit)s candidates come from workhorse_job_lease_idx; those not locked by anyone else are
# locked in id order (SKIP LOCKED), their children after them. A deadlock with a recorder needs a
# stale worker recording a job at the instant it is reclaimed: PostgreSQL aborts one, the reclaim
# runs again at its next interval, and the recorder's fallback writes one by one.
RECLAIM_EXPIRED = f"""
WITH due AS MATERIALIZED (
    SELECT id FROM workhorse_job
    WHERE id IN (
        SELECT id FROM workhorse_job
        WHERE status = 'running' AND lease_expires_at < clock_timestamp()
        LIMIT %(limit)s
    ) AND status = 'running' AND lease_expires_at < clock_timestamp()
    ORDER BY id
    FOR UPDATE SKIP LOCKED
),
expired AS (
    UPDATE workhorse_job AS job
    SET status = CASE WHEN job.attempt >= job.max_attempts THEN 'dead' ELSE 'queued' END,
        lease_token = NULL, lease_expires_at = NULL,
        finished_at = CASE WHEN job.attempt >= job.max_attempts THEN clock_timestamp() END,
        last_error = CASE WHEN job.attempt >= job.max_attempts
                          THEN 'lease expired on the last attempt' ELSE job.last_error END
    FROM due
    WHERE job.id = due.id
    RETURNING job.id, job.attempt, job.status, job.awaited
),
{death_release_ctes("expired")},
{results_notified_cte("expired")},
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'lease_expired', attempt, clock_timestamp(), '{{}}'::jsonb FROM expired
    UNION ALL
    SELECT id, 'dead', attempt, clock_timestamp(), '{{}}'::jsonb FROM expired WHERE status = 'dead'
)
SELECT count(*) FROM expired, (SELECT count(*) FROM released_notified) AS notified,
    (SELECT count(*) FROM results_notified) AS results
"""


def record_outcomes(alias: str, outcomes: Sequence[Any]) -> set[int]:
    """Run RECORD_OUTCOMES for ``execution.Outcome`` values; return the ids whose lease was still held."""
    params = {"outcomes": _json_outcomes(outcomes), **channel_param()}
    return {row[0] for row in execute(alias, RECORD_OUTCOMES, params)}


def record_outcomes_releasing(alias: str, outcomes: Sequence[Any]) -> tuple[set[int], list[int]]:
    """Run RECORD_OUTCOMES_RELEASING (a batch with a workflow step); return the ids whose lease was
    still held, and those of the workflow steps among them that ended cancelled. The first
    statement of an ``atomic()`` block, it travels with the block's BEGIN."""
    params = {"outcomes": _json_outcomes(outcomes), "channel": app_settings.NOTIFY_CHANNEL, **channel_param()}
    rows = execute_first(alias, RECORD_OUTCOMES_RELEASING, params)
    return {row[0] for row in rows}, [row[0] for row in rows if row[1]]


def _json_outcomes(outcomes: Sequence[Any]) -> str:
    return "[" + ",".join(_json_outcome(outcome) for outcome in outcomes) + "]"


def _json_outcome(outcome: Any) -> str:
    fields = {
        "id": outcome.job.id,
        "token": str(outcome.job.lease_token),
        "status": outcome.status,
        "error": outcome.error,
        "run_at": outcome.run_at.isoformat() if outcome.run_at else None,
        "snoozed": outcome.kind == "snoozed",
        "given_back": outcome.kind == "given_back",
        "events": [[kind, details] for kind, details in outcome.events],
    }
    text = json.dumps(fields, default=str)
    # The result is canonical JSON already: splice it in rather than parse and re-encode it.
    return text if outcome.result_json is None else text[:-1] + f',"result":{outcome.result_json}}}'


def release(alias: str, held: Sequence[tuple[ClaimedJob, bool]]) -> None:
    """Run RELEASE for ``(job, handler_started)`` pairs."""
    params = {
        "job_ids": [job.id for job, _ in held],
        "tokens": [job.lease_token for job, _ in held],
        "started": [started for _, started in held],
        "details": "{}",
        "channel": app_settings.NOTIFY_CHANNEL,
        **channel_param(),
    }
    execute(alias, RELEASE, params)


def release_abandoned(alias: str, worker: str, started: Sequence[int], reason: str) -> int:
    """Run RELEASE_ABANDONED for the jobs ``worker`` (a child process now gone) held; ``started`` are
    those whose handler it had started. Return how many went back (or ended dead)."""
    params = {
        "worker": worker,
        "started": list(started),
        "details": json.dumps({"worker": worker, "reason": reason}),
        "channel": app_settings.NOTIFY_CHANNEL,
        **channel_param(),
    }
    return int(execute(alias, RELEASE_ABANDONED, params)[0][0])


def reclaim_expired(alias: str, *, limit: int = 1000) -> int:
    """Run RECLAIM_EXPIRED once; return how many jobs it took back."""
    params = {"limit": limit, "channel": app_settings.NOTIFY_CHANNEL, **channel_param()}
    return int(execute(alias, RECLAIM_EXPIRED, params)[0][0])
