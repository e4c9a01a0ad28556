"""What a workflow step's handler reads about its workflow (decision 0022 §6, ``ctx``): its step
name and key, the result of a step, its parents' results. Reads only.

A step's *current* job is the highest id of its lineage (its original job, then its redrives),
found through workhorse_job_workflow_idx (workflow_id, step_name, id).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django_workhorse.encryption.jobs import RESULT, opened_json
from django_workhorse.sql.connection import execute

# step_identity: a job's step name and its workflow's key hash (NULL when unkeyed), by primary keys.
STEP_IDENTITY = """
SELECT job.step_name, workflow.key_hash
FROM workhorse_job AS job JOIN workhorse_workflow AS workflow ON workflow.id = job.workflow_id
WHERE job.id = %(job_id)s
"""

# step_result: the current job of one step of a workflow, its status and result
# (workhorse_job_workflow_idx, read backwards). No row: the workflow has no such step.
STEP_RESULT = """
SELECT id, status, result::text, cipher_salt FROM workhorse_job
WHERE workflow_id = %(workflow_id)s AND step_name = %(step_name)s
ORDER BY id DESC
LIMIT 1
"""

# parent_results: a job's parents, by its edges (workhorse_dependency_child_parent_uniq): each
# parent's step, whether its step's current job succeeded (and that job's result), and whether it
# is a death the edge allows. An edge names the parent's current job unless it allows failure
# (REDRIVE re-points only the other edges), so a parent is read through its step's current job: a
# dead parent on such an edge that a redrive since brought back gives its result.
PARENT_RESULTS = """
SELECT parent.step_name, current.status = 'succeeded', edge.allow_failure AND parent.status = 'dead',
       current.result::text, current.id, current.cipher_salt
FROM workhorse_job_dependency AS edge
JOIN workhorse_job AS parent ON parent.id = edge.parent_id
CROSS JOIN LATERAL (
    SELECT latest.id, latest.status, latest.result, latest.cipher_salt FROM workhorse_job AS latest
    WHERE latest.workflow_id = parent.workflow_id AND latest.step_name = parent.step_name
    ORDER BY latest.id DESC
    LIMIT 1
) AS current
WHERE edge.child_id = %(job_id)s
ORDER BY parent.step_name
"""


@dataclass(frozen=True)
class StepIdentity:
    """A job's step of a workflow, and the hash of that workflow's key (None: unkeyed)."""

    step_name: str
    key_hash: bytes | None


@dataclass(frozen=True)
class StepResult:
    """A step's current job: its id, status and result."""

    job_id: int
    status: str
    result: Any

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


@dataclass(frozen=True)
class ParentResult:
    """One parent of a step: its name, whether its current job succeeded (with its result), and
    whether it died on an edge that allows failure."""

    step_name: str
    succeeded: bool
    tolerated_death: bool
    result: Any


def step_identity(alias: str, job_id: int) -> StepIdentity | None:
    """Run STEP_IDENTITY; None when the job is no workflow step (or is gone)."""
    rows = execute(alias, STEP_IDENTITY, {"job_id": job_id})
    if not rows:
        return None
    step_name, hashed = rows[0]
    return StepIdentity(step_name, None if hashed is None else bytes(hashed))


def step_result(alias: str, workflow_id: int, step_name: str) -> StepResult | None:
    """Run STEP_RESULT; None when workflow ``workflow_id`` has no step ``step_name``."""
    rows = execute(alias, STEP_RESULT, {"workflow_id": workflow_id, "step_name": step_name})
    if not rows:
        return None
    job_id, status, result, salt = rows[0]
    return StepResult(job_id, status, _decoded(result, salt, job_id))


def parent_results(alias: str, job_id: int) -> list[ParentResult]:
    """Run PARENT_RESULTS for the step job ``job_id``, parents by name (an encrypted parent's result
    opened: ``DecryptionError`` if it does not open)."""
    rows = execute(alias, PARENT_RESULTS, {"job_id": job_id})
    return [
        ParentResult(name, succeeded, tolerated, _decoded(result, salt, parent_id))
        for name, succeeded, tolerated, result, parent_id, salt in rows
    ]


def _decoded(text: str | None, salt: Any, job_id: int) -> Any:
    # Results are read as text (whatever jsonb loader the connection has); SQL NULL is no result.
    value = None if text is None else json.loads(text)
    return opened_json(value, field=RESULT, salt=None if salt is None else bytes(salt), job_id=job_id)
