"""Waits on results (decision 0022 §5): a wait flags the job it waits on (``awaited``), and each
statement that ends a job announces on the result channel the flagged jobs it ended, so jobs nobody
waits on cost one boolean test and send nothing.

The flag is set by an ``UPDATE`` that takes the job's row lock, so it serializes with the outcome's
``UPDATE``: if the outcome commits first, the flag updates nothing (the job is finished) and the
wait reads the result; if the flag commits first, the outcome re-reads the row and sees it flagged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_workhorse.conf import app_settings
from django_workhorse.encryption.jobs import LAST_ERROR, RESULT, opened_json, opened_text
from django_workhorse.enqueueing.key_lifetimes import TERMINAL_JOB_STATUSES
from django_workhorse.sql.connection import decode_json, execute, run
from django_workhorse.sql.keys import TERMINAL

# The CASE an ending statement adds per ended row (``{row}`` has id, status and awaited, as the
# statement wrote them): a notification for a flagged job that ended, nothing otherwise.
_NOTIFY_RESULT = (
    f"CASE WHEN {{row}}.awaited AND {{row}}.status IN {TERMINAL} "
    "THEN pg_notify(%(result_channel)s, {row}.id::text) END"
)
# The same as a CTE, for a statement whose final SELECT aggregates: it must read ``results_notified``
# (a SELECT CTE that nothing reads is not run).
_RESULTS_NOTIFIED = f"""results_notified AS (
    SELECT pg_notify(%(result_channel)s, id::text) FROM {{ended}} WHERE awaited AND status IN {TERMINAL}
)"""


def notify_result(row: str) -> str:
    """The select-list expression that announces ``row``'s end if a wait flagged it."""
    return _NOTIFY_RESULT.format(row=row)


def results_notified_cte(ended: str) -> str:
    """The CTE ``results_notified`` that announces the flagged jobs of CTE ``ended`` that ended."""
    return _RESULTS_NOTIFIED.format(ended=ended)


def channel_param() -> dict[str, str]:
    """The parameter the notifications above take."""
    return {"result_channel": app_settings.RESULT_CHANNEL}


# flag_job: mark a job as waited on, unless it is finished or flagged already (a HOT update: no
# indexed column changes). Returns the job's queue when it flagged it.
FLAG_JOB = f"""
UPDATE workhorse_job SET awaited = true
WHERE id = %(job_id)s AND status NOT IN {TERMINAL} AND NOT awaited
RETURNING queue
"""

# read_job: what a wait needs of a job, by primary key.
READ_JOB = """
SELECT status, queue, result, last_error, step_name, awaited, cipher_salt FROM workhorse_job WHERE id = %(job_id)s
"""

# clear_job: a finished job's result was read; stop keeping it for its waiters.
CLEAR_JOB = f"""
UPDATE workhorse_job SET awaited = false WHERE id = %(job_id)s AND awaited AND status IN {TERMINAL}
"""

# workflow_jobs: every job of a workflow (its steps and their redrives) and its queue, through
# workhorse_job_workflow_idx; the ids a workflow's wait listens for.
WORKFLOW_JOBS = """
SELECT id, queue FROM workhorse_job WHERE workflow_id = %(workflow_id)s
"""

# flag_workflow: mark every unfinished job of a workflow as waited on, locked in id order (the rule
# above sql.claims' extend_leases), through workhorse_job_workflow_idx.
FLAG_WORKFLOW = f"""
WITH target AS MATERIALIZED (
    SELECT id FROM workhorse_job
    WHERE workflow_id = %(workflow_id)s AND status NOT IN {TERMINAL} AND NOT awaited
    ORDER BY id
    FOR NO KEY UPDATE
)
UPDATE workhorse_job AS job SET awaited = true FROM target WHERE job.id = target.id
"""

# clear_workflow: a workflow's wait read its result; unflag its finished jobs, locked in id order.
# Unfinished ones keep their flag: another wait on the workflow may still need their notification.
CLEAR_WORKFLOW = f"""
WITH target AS MATERIALIZED (
    SELECT id FROM workhorse_job
    WHERE workflow_id = %(workflow_id)s AND awaited AND status IN {TERMINAL}
    ORDER BY id
    FOR NO KEY UPDATE
)
UPDATE workhorse_job AS job SET awaited = false FROM target WHERE job.id = target.id
"""

# workflow_steps: the current job of each step (the latest of its lineage) with its result, through
# workhorse_job_workflow_idx (workflow_id, step_name, id).
WORKFLOW_STEPS = """
SELECT DISTINCT ON (step_name) step_name, id, status, result, last_error, cipher_salt
FROM workhorse_job
WHERE workflow_id = %(workflow_id)s
ORDER BY step_name, id DESC
"""


@dataclass(frozen=True)
class JobResult:
    """What a wait reads of a job."""

    id: int
    status: str
    queue: str
    result: Any
    last_error: str
    step_name: str | None
    awaited: bool


def flag_job(alias: str, job_id: int) -> str | None:
    """Run FLAG_JOB; return the job's queue if it flagged it (None: finished, flagged, or missing)."""
    rows = execute(alias, FLAG_JOB, {"job_id": job_id})
    return rows[0][0] if rows else None


def read_job(alias: str, job_id: int) -> JobResult | None:
    """Run READ_JOB; None if there is no such job."""
    rows = execute(alias, READ_JOB, {"job_id": job_id})
    if not rows:
        return None
    status, queue, result, last_error, step_name, awaited, salt = rows[0]
    return _job_result(job_id, status, queue, result, last_error, step_name, awaited, salt)


def clear_job(alias: str, job_id: int) -> None:
    """Run CLEAR_JOB."""
    run(alias, CLEAR_JOB, {"job_id": job_id})


def workflow_jobs(alias: str, workflow_id: int) -> list[tuple[int, str]]:
    """Run WORKFLOW_JOBS: (id, queue) of each job."""
    return [(row[0], row[1]) for row in execute(alias, WORKFLOW_JOBS, {"workflow_id": workflow_id})]


def flag_workflow(alias: str, workflow_id: int) -> None:
    """Run FLAG_WORKFLOW."""
    run(alias, FLAG_WORKFLOW, {"workflow_id": workflow_id})


def clear_workflow(alias: str, workflow_id: int) -> None:
    """Run CLEAR_WORKFLOW."""
    run(alias, CLEAR_WORKFLOW, {"workflow_id": workflow_id})


def workflow_steps(alias: str, workflow_id: int) -> Sequence[JobResult]:
    """Run WORKFLOW_STEPS: each step's current job (its queue is not read: empty)."""
    rows = execute(alias, WORKFLOW_STEPS, {"workflow_id": workflow_id})
    return [_job_result(job_id, status, "", result, error, step, False, salt)
            for step, job_id, status, result, error, salt in rows]  # fmt: skip


def _job_result(
    job_id: int, status: str, queue: str, result: Any, error: str, step: str | None, awaited: bool, salt: Any
) -> JobResult:
    """A job as a wait reads it: an encrypted job's result and error opened (``DecryptionError`` if
    they do not open), only once it has finished."""
    result = decode_json(result)
    if salt is not None and status in TERMINAL_JOB_STATUSES:
        salt = bytes(salt)
        result = opened_json(result, field=RESULT, salt=salt, job_id=job_id)
        error = opened_text(error, field=LAST_ERROR, salt=salt, job_id=job_id)
    return JobResult(job_id, status, queue, result, error, step, awaited)
