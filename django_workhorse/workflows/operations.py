"""A workflow's state and its cancellation (decision 0022 §2).

Nothing stores a workflow's state: it is derived, in one query, from the current job of each step
(the latest of its lineage, so a redrive moves a blocked workflow back to running by itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from django.db import router, transaction

from django_workhorse import sql
from django_workhorse.enqueueing.storable import check_id, check_ids
from django_workhorse.exceptions import WorkflowDoesNotExist
from django_workhorse.models import Job, JobDependency
from django_workhorse.models import Workflow as WorkflowRow
from django_workhorse.operations.actions import check_requested_by
from django_workhorse.sql.workflow_control import StepCounts


class WorkflowStatus(str, Enum):
    """A workflow's state, derived from its steps; the first that holds, in this order."""

    CANCELLED = "cancelled"  # a step is cancelled
    BLOCKED = "blocked"  # a dead step holds back a child (redrive it to resume)
    RUNNING = "running"  # a step is waiting, queued or running
    FAILED = "failed"  # a dead step no edge tolerates (a leaf, say)
    SUCCEEDED = "succeeded"  # every step succeeded, or died where its children allow it

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class WorkflowState:
    """A workflow's status and its steps (their current jobs) counted by job status."""

    workflow_id: int
    status: WorkflowStatus
    steps: StepCounts


def workflow_status(steps: StepCounts) -> WorkflowStatus:
    """The rule of decision 0022 §2: cancelled, then blocked, running, failed, succeeded."""
    if steps.cancelled:
        return WorkflowStatus.CANCELLED
    if steps.blocked:
        return WorkflowStatus.BLOCKED
    if steps.waiting or steps.queued or steps.running:
        return WorkflowStatus.RUNNING
    if steps.failed:
        return WorkflowStatus.FAILED
    return WorkflowStatus.SUCCEEDED


def workflow_states(workflow_ids: Sequence[int], *, using: str | None = None) -> dict[int, WorkflowState]:
    """The state of each of the given workflows that exists, in one query (for a page of them)."""
    ids = check_ids(workflow_ids, "workflow_ids")
    found = sql.workflow_control.workflow_states(_alias(using), ids)
    return {wid: WorkflowState(wid, workflow_status(steps), steps) for wid, steps in found.items()}


def workflow_state(workflow_id: int, *, using: str | None = None) -> WorkflowState:
    """The state of workflow ``workflow_id``; raise ``WorkflowDoesNotExist`` if there is none."""
    check_id(workflow_id, "workflow_id")
    state = workflow_states([workflow_id], using=using).get(workflow_id)
    if state is None:
        raise WorkflowDoesNotExist(f"no workflow has id {workflow_id}")
    return state


def cancel_workflow(workflow_id: int, *, requested_by: str = "", using: str | None = None) -> int:
    """Cancel every step of workflow ``workflow_id`` not finished; return how many steps it changed.

    Waiting and queued steps become ``cancelled`` at once; running ones are asked to stop (their
    handlers see ``ctx.cancelled`` within a heartbeat), and end ``cancelled`` unless they finish
    first. A second call changes nothing (and returns 0). Raise ``WorkflowDoesNotExist`` if there is
    no such workflow, ``InvalidArgumentError`` for a bad argument.
    """
    check_id(workflow_id, "workflow_id")
    requested_by = check_requested_by(requested_by)
    alias = _alias(using)
    with transaction.atomic(using=alias):
        changed = sql.workflow_control.cancel_workflow(alias, workflow_id, requested_by)
        if not changed and not WorkflowRow.objects.using(alias).filter(pk=workflow_id).exists():
            raise WorkflowDoesNotExist(f"no workflow has id {workflow_id}")
    return len(changed)


def _alias(using: str | None) -> str:
    return using or router.db_for_write(WorkflowRow)


@dataclass(frozen=True)
class StepNode:
    """A step of a drawn workflow: its name, its current job (the latest of its lineage) and that job's status."""

    name: str
    job_id: int
    status: str


@dataclass(frozen=True)
class WorkflowGraph:
    """A workflow's steps, in the order they were added, and its edges between steps as
    (parent, child, allow_failure); redriven copies' edges are their steps'."""

    steps: tuple[StepNode, ...]
    edges: tuple[tuple[str, str, bool], ...]


def workflow_graph(workflow_id: int, *, using: str | None = None) -> WorkflowGraph:
    """The steps and edges of workflow ``workflow_id``, for drawing it (two queries, through
    workhorse_job_workflow_idx and the edges' child index). Raise ``WorkflowDoesNotExist`` if it
    has no step."""
    check_id(workflow_id, "workflow_id")
    alias = using or router.db_for_read(WorkflowRow)
    jobs = Job.objects.using(alias).filter(workflow_id=workflow_id).order_by("id")
    step_of: dict[int, str] = {}
    current: dict[str, tuple[int, str]] = {}
    for job_id, step, status in jobs.values_list("id", "step_name", "status"):
        step_of[job_id] = step
        current[step] = (job_id, status)  # ids ascend: the last one is the step's current job
    if not current:
        raise WorkflowDoesNotExist(f"no workflow has id {workflow_id}")
    rows = JobDependency.objects.using(alias).filter(child__workflow_id=workflow_id)
    edges: dict[tuple[str, str], bool] = {}
    for parent_id, child_id, allow in rows.values_list("parent_id", "child_id", "allow_failure"):
        pair = (step_of[parent_id], step_of[child_id])
        edges[pair] = edges.get(pair, False) or allow
    return WorkflowGraph(
        tuple(StepNode(step, job_id, status) for step, (job_id, status) in current.items()),
        tuple((parent, child, allow) for (parent, child), allow in sorted(edges.items())),
    )
