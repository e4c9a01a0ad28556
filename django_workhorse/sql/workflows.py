"""Workflows (decision 0022): write a workflow, its steps and their edges in one statement, and
find the workflow a key is bound to."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django_workhorse.enqueueing.prepared import PreparedJob
from django_workhorse.sql.connection import execute
from django_workhorse.sql.enqueue import DRAWN, FROM_JSON, JOB_COLUMNS, UNKEYED_REQUEST_COLUMNS, job_values
from django_workhorse.sql.enqueue_rows import json_unkeyed_row
from django_workhorse.sql.keys import FREE

# A step travels as an unkeyed batch row (sql.enqueue_rows) with its name and parent count appended.
_STEP_COLUMNS = (*UNKEYED_REQUEST_COLUMNS, ("step_name", "text"), ("pending_parents", "int"))
_STEPS_CTE = "requests AS (SELECT {}, {} FROM jsonb_array_elements(%(rows)s::jsonb) AS r)".format(
    ", ".join(f"{FROM_JSON[kind].format(r='r', i=i)} AS {name}" for i, (name, kind) in enumerate(_STEP_COLUMNS)),
    DRAWN,
)
# The binding names the anchor, the first step in topological order (ordinal 0). ON CONFLICT DO
# NOTHING on workhorse_binding_scope_key_hash_uniq waits for an in-flight owner to commit or roll
# back, as ENQUEUE does; a key taken leaves `bound` empty, and nothing past it is written.
_BIND = """
bound AS (
    INSERT INTO workhorse_binding (
        scope, key_hash, key_preview, mode, request_digest, field_digests, job_id, created_at, expires_at)
    SELECT %(scope)s::text, %(key_hash)s::bytea, %(key_preview)s::text, 'idempotency', %(fingerprint)s::bytea,
           %(field_digests)s::jsonb, job_id, now, now + %(lifetime)s::interval
    FROM requests
    WHERE ordinal = 0
    ON CONFLICT (scope, key_hash) DO NOTHING
    RETURNING job_id
),"""
# A free binding (it owns nothing any more, see FREE) is rebound to the new anchor, compare-and-swap
# on the job it was seen bound to, as sql.enqueue.TAKE_OVER does for a job: the row lock serializes
# racing takers, and one that lost gets no row back and looks again. The old workflow stays as history.
_TAKE_OVER = f"""
bound AS (
    UPDATE workhorse_binding AS binding
    SET key_preview = %(key_preview)s::text, mode = 'idempotency', request_digest = %(fingerprint)s::bytea,
        field_digests = %(field_digests)s::jsonb, previous_request_digest = NULL, job_id = requests.job_id,
        created_at = requests.now, expires_at = requests.now + %(lifetime)s::interval
    FROM requests, workhorse_job AS job
    WHERE requests.ordinal = 0 AND binding.scope = %(scope)s::text AND binding.key_hash = %(key_hash)s::bytea
      AND binding.job_id = %(seen_job_id)s AND job.id = binding.job_id
      AND {FREE.format(now="requests.now")}
    RETURNING binding.job_id
),"""
# Steps without parents are ready (queued), the others wait for their parents' release. Edges join
# the drawn ids by ordinal. NOTIFY once per queue with a ready root (delivered at commit, dropped on
# rollback). Foreign keys are checked at the end of the statement, so they see its own rows.
_WRITE = """
flow AS (
    INSERT INTO workhorse_workflow (name, fingerprint, scope, key_hash, key_preview, step_count, created_at)
    SELECT %(name)s, %(fingerprint)s::bytea, %(scope)s::text, %(key_hash)s::bytea, %(key_preview)s::text,
           %(step_count)s, statement_timestamp()
    {only_if_bound}
    RETURNING id
),
jobs AS (
    INSERT INTO workhorse_job ({job_columns}, workflow_id, step_name, pending_parents)
    SELECT {job_values}, flow.id, step_name, pending_parents
    FROM requests CROSS JOIN flow
    RETURNING id, queue, status, run_at, created_at
),
edges AS (
    INSERT INTO workhorse_job_dependency (child_id, parent_id, allow_failure)
    SELECT child.job_id, parent.job_id, edge.allow_failure
    FROM unnest(%(edge_child)s::int[], %(edge_parent)s::int[], %(edge_allow)s::boolean[])
        AS edge(child, parent, allow_failure)
    JOIN requests AS child ON child.ordinal = edge.child
    JOIN requests AS parent ON parent.ordinal = edge.parent
    WHERE EXISTS (SELECT FROM flow)
),
notified AS (
    SELECT pg_notify(%(channel)s, queue)
    FROM (SELECT DISTINCT queue FROM jobs WHERE status = 'queued' AND run_at <= created_at) AS ready
)
SELECT flow.id, array_agg(requests.job_id ORDER BY requests.ordinal), (SELECT count(*) FROM notified)
FROM flow CROSS JOIN requests
GROUP BY flow.id
""".replace("{job_columns}", JOB_COLUMNS).replace(
    "{job_values}",
    job_values(str, "job_id", "now", "CASE WHEN pending_parents = 0 THEN 'queued' ELSE 'waiting' END"),
)


def _write(only_if_bound: str) -> str:
    """The writing CTEs, the workflow row written only ``only_if_bound`` (a FROM clause, or nothing)."""
    return _WRITE.replace("{only_if_bound}", only_if_bound)


# enqueue_workflow: one statement in the caller's transaction. Unkeyed: always a new workflow.
# Keyed: the workflow and its jobs only if this statement bound (or took over) the key.
ENQUEUE_WORKFLOW_UNKEYED = f"WITH {_STEPS_CTE},{_write('')}"
ENQUEUE_WORKFLOW = f"WITH {_STEPS_CTE},{_BIND}{_write('FROM bound')}"
TAKE_OVER_WORKFLOW = f"WITH {_STEPS_CTE},{_TAKE_OVER}{_write('FROM bound')}"

# find_workflow: the binding of a key, in a fresh snapshot, and what it names: the anchor's
# workflow (NULL when a plain job owns the key) and that workflow's original job of each step,
# through workhorse_job_workflow_step_uniq (stable after redrives, which set root_id). Reads only.
FIND_WORKFLOW = f"""
SELECT binding.job_id, binding.mode, binding.request_digest, binding.field_digests,
       {FREE.format(now="statement_timestamp()")}, job.workflow_id,
       (SELECT jsonb_object_agg(step.step_name, step.id) FROM workhorse_job AS step
        WHERE step.workflow_id = job.workflow_id AND step.root_id IS NULL)
FROM workhorse_binding AS binding
JOIN workhorse_job AS job ON job.id = binding.job_id
WHERE binding.scope = %(scope)s AND binding.key_hash = %(key_hash)s
"""


@dataclass(frozen=True)
class WorkflowKey:
    """A keyed workflow's binding, as the statements write it (never the raw key)."""

    scope: str
    key_hash: bytes
    key_preview: str
    lifetime: timedelta


@dataclass(frozen=True)
class WrittenWorkflow:
    """What ENQUEUE_WORKFLOW wrote: the workflow's id and its job ids, in step order."""

    workflow_id: int
    job_ids: list[int]


@dataclass(frozen=True)
class FoundBinding:
    """A key's binding and the workflow its job belongs to (None: a plain job owns the key)."""

    job_id: int
    mode: str
    request_digest: bytes
    field_digests: dict[str, str]
    free: bool
    workflow_id: int | None
    jobs: dict[str, int]


def enqueue_workflow(
    alias: str,
    *,
    name: str,
    steps: Sequence[tuple[str, PreparedJob, int]],
    edges: Sequence[tuple[int, int, bool]],
    fingerprint: bytes,
    field_digests: dict[str, str],
    key: WorkflowKey | None,
    channel: str,
    seen_job_id: int | None = None,
) -> WrittenWorkflow | None:
    """Run ENQUEUE_WORKFLOW (or its unkeyed or take-over form) for ``steps`` ``(name, request,
    number of parents)`` in topological order and ``edges`` ``(child, parent, allow_failure)`` by
    ordinal; return what it wrote, or None when the key was bound (or not free) meanwhile."""
    rows = ",".join(
        f"{json_unkeyed_row(ordinal, request)[:-1]},{json.dumps(step_name)},{parents}]"
        for ordinal, (step_name, request, parents) in enumerate(steps)
    )
    params: dict[str, Any] = {
        "rows": f"[{rows}]",
        "name": name,
        "fingerprint": fingerprint,
        "field_digests": json.dumps(field_digests),
        "step_count": len(steps),
        "edge_child": [child for child, _, _ in edges],
        "edge_parent": [parent for _, parent, _ in edges],
        "edge_allow": [allow for _, _, allow in edges],
        "channel": channel,
        "scope": key and key.scope,
        "key_hash": key and key.key_hash,
        "key_preview": key and key.key_preview,
        "lifetime": key and key.lifetime,
    }
    if key is None:
        statement = ENQUEUE_WORKFLOW_UNKEYED
    elif seen_job_id is None:
        statement = ENQUEUE_WORKFLOW
    else:
        statement, params["seen_job_id"] = TAKE_OVER_WORKFLOW, seen_job_id
    found = execute(alias, statement, params)
    return WrittenWorkflow(found[0][0], list(found[0][1])) if found else None


def find_workflow(alias: str, scope: str, key_hash: bytes) -> FoundBinding | None:
    """Run FIND_WORKFLOW; None when no binding holds the key."""
    found = execute(alias, FIND_WORKFLOW, {"scope": scope, "key_hash": key_hash})
    if not found:
        return None
    job_id, mode, digest, field_digests, free, workflow_id, jobs = found[0]
    return FoundBinding(
        job_id=job_id,
        mode=mode,
        request_digest=bytes(digest),
        field_digests=_decoded(field_digests),
        free=bool(free),
        workflow_id=workflow_id,
        jobs=_decoded(jobs) or {},
    )


def _decoded(value: Any) -> Any:
    # jsonb arrives decoded through Django's connection, as text through a raw prepared cursor.
    return json.loads(value) if isinstance(value, str) else value
