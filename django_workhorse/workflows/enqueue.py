"""Enqueue a workflow: plan it, fingerprint it, write it in one statement; a keyed one is looked up
first and replays or conflicts as a keyed job does (decision 0022 §3, §4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import router

from django_workhorse.conf import app_settings
from django_workhorse.enqueueing.after_write import after_workflow_write
from django_workhorse.enqueueing.api import MAX_ROUNDS
from django_workhorse.enqueueing.fingerprints import (
    WORKFLOW_FIELD,
    differing_fields,
    key_digest,
    key_hash,
    key_preview,
)
from django_workhorse.exceptions import InvalidArgumentError, KeyNotSettledError, WorkflowConflictError
from django_workhorse.models import Job
from django_workhorse.observability import instruments
from django_workhorse.sql.workflows import FoundBinding, WorkflowKey, enqueue_workflow, find_workflow
from django_workhorse.types import EnqueueOutcome, KeyMode
from django_workhorse.workflows.fingerprint import differing_steps, field_digests, graph_digest
from django_workhorse.workflows.result import WorkflowResult

if TYPE_CHECKING:  # definition imports this module when a workflow is enqueued
    from django_workhorse.workflows.definition import Plan, Workflow


def enqueue(workflow: Workflow, *, using: str | None = None) -> WorkflowResult:
    """Enqueue ``workflow`` in the caller's transaction; see :meth:`Workflow.enqueue`."""
    started = instruments.clock()
    try:
        plan = workflow.plan()
    except InvalidArgumentError:
        instruments.enqueue_refused("invalid", None)
        raise
    scope = None if plan.idempotency is None else plan.idempotency.scope
    try:
        result = _enqueue(plan, using)
    except WorkflowConflictError as exc:
        instruments.workflow_conflicted(exc.scope)
        raise
    instruments.workflow_settled([step.prepared for step in plan.steps], scope, result.outcome.value, started)
    return result


def _enqueue(plan: Plan, using: str | None) -> WorkflowResult:
    alias = using or router.db_for_write(Job)
    digests = field_digests(plan)
    fingerprint = graph_digest(digests)
    mode = plan.idempotency
    if mode is None:
        written = _write(alias, plan, fingerprint, digests, None)
        assert written is not None  # an unkeyed write always writes
        return written
    key = WorkflowKey(mode.scope, key_hash(mode.scope, mode.key), key_preview(mode.key), mode.ttl)
    # Look first (decision 0014): a replay reads one row and writes or locks nothing. A key taken
    # or freed between our statements is looked at again.
    for _ in range(MAX_ROUNDS):
        found = find_workflow(alias, key.scope, key.key_hash)
        if found is not None and not found.free:
            return _replay_or_conflict(plan, key, found, fingerprint, digests)
        seen = None if found is None else found.job_id
        written = _write(alias, plan, fingerprint, digests, key, seen)
        if written is not None:
            return written
    raise KeyNotSettledError(f"workflow enqueue did not settle after {MAX_ROUNDS} rounds; the key keeps changing hands")


def _write(
    alias: str,
    plan: Plan,
    fingerprint: bytes,
    digests: dict[str, str],
    key: WorkflowKey | None,
    seen_job_id: int | None = None,
) -> WorkflowResult | None:
    written = enqueue_workflow(
        alias,
        name=plan.name,
        steps=[(step.name, step.prepared, len(step.parents)) for step in plan.steps],
        edges=plan.edges(),
        fingerprint=fingerprint,
        field_digests=digests,
        key=key,
        channel=app_settings.NOTIFY_CHANNEL,
        seen_job_id=seen_job_id,
    )
    if written is None:
        return None
    jobs = {step.name: job_id for step, job_id in zip(plan.steps, written.job_ids, strict=True)}
    after_workflow_write(alias, written.workflow_id)
    return WorkflowResult(written.workflow_id, EnqueueOutcome.ACCEPTED, jobs)


def _replay_or_conflict(
    plan: Plan, key: WorkflowKey, found: FoundBinding, fingerprint: bytes, digests: dict[str, str]
) -> WorkflowResult:
    """The same graph under a live key replays with the original ids; anything else conflicts."""
    if found.workflow_id is not None and found.mode == KeyMode.IDEMPOTENCY and found.request_digest == fingerprint:
        jobs = {step.name: found.jobs[step.name] for step in plan.steps}  # in step order, as when written
        return WorkflowResult(found.workflow_id, EnqueueOutcome.REPLAYED, jobs)
    if found.workflow_id is None:
        fields = [WORKFLOW_FIELD]
    elif found.mode != KeyMode.IDEMPOTENCY:
        fields = ["mode"]
    else:
        fields = differing_fields(found.field_digests, digests)
    raise WorkflowConflictError(
        steps=differing_steps(fields),
        workflow_id=found.workflow_id,
        job_id=found.job_id,
        mode=found.mode,
        scope=key.scope,
        conflicting_fields=fields,
        key_preview=key.key_preview,
        key_digest=key_digest(key.key_hash),
        stored_request_digest=found.request_digest.hex(),
        rejected_request_digest=fingerprint.hex(),
    )
