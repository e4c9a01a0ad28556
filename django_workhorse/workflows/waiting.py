"""Wait for a workflow's result (``WorkflowResult.wait``, decision 0022 §5).

The wait flags every unfinished job of the workflow, so the end of any step wakes it, and derives
the workflow's state at each wake-up: it returns once the workflow succeeded, and raises as soon
as a dead step blocks it or fails it, or a step is cancelled, whichever branch it is on.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import connections, router

from django_workhorse import sql
from django_workhorse.awaiting.waiting import (
    PENDING,
    check_timeout,
    not_allowed_in_handler,
    not_allowed_in_transaction,
    outcome,
    serving_one_at_a_time,
    wait,
)
from django_workhorse.enqueueing.storable import check_id
from django_workhorse.exceptions import WaitTimeoutError, WorkflowDoesNotExist
from django_workhorse.models import Workflow as WorkflowRow
from django_workhorse.sql.awaiting import JobResult
from django_workhorse.workflows.operations import WorkflowStatus, workflow_status


def wait_for_workflow(workflow_id: int, *, timeout: float | timedelta, using: str | None = None) -> dict[str, Any]:
    """Wait until workflow ``workflow_id`` has finished; return ``{step: result}`` of its succeeded steps.

    Raise ``JobFailedError`` naming a dead step as soon as one blocks or fails the workflow,
    ``JobCancelledError`` naming a cancelled step, ``WaitTimeoutError``, ``WorkflowDoesNotExist``,
    ``WaitNotAllowedError`` inside ``atomic()`` on ``using`` (unless it has finished) and inside a
    handler whose worker runs one job at a time and serves a queue of the workflow's, and
    ``InvalidArgumentError`` for a bad argument.
    """
    check_id(workflow_id, "workflow_id")
    seconds = check_timeout(timeout)
    alias = using or router.db_for_write(WorkflowRow)
    target = WorkflowTarget(workflow_id, alias)
    serving = serving_one_at_a_time(alias)
    if serving is not None:
        target.remember_jobs()
        if served := sorted(target.queues & serving):
            raise not_allowed_in_handler(f"workflow {workflow_id}", served[0])
    found = target.read()
    if found is not PENDING:
        return target.finish(found)
    if connections[alias].in_atomic_block:
        raise not_allowed_in_transaction(alias, f"workflow {workflow_id}")
    target.remember_jobs()
    result: dict[str, Any] = wait(target, alias, seconds)
    return result


class WorkflowTarget:
    """A wait for a workflow: woken by any of its jobs, done when its derived state is final."""

    def __init__(self, workflow_id: int, alias: str) -> None:
        self.workflow_id = workflow_id
        self.alias = alias
        self._job_ids: list[int] = []
        self.queues: frozenset[str] = frozenset()
        self._flagged = False

    def remember_jobs(self) -> None:
        """Read the ids and queues of the workflow's jobs (a redrive's later copy is found by polling)."""
        jobs = sql.awaiting.workflow_jobs(self.alias, self.workflow_id)
        self._job_ids = [job_id for job_id, _ in jobs]
        self.queues = frozenset(queue for _, queue in jobs)

    def job_ids(self) -> Sequence[int]:
        return self._job_ids

    def look(self) -> Any:
        if not self._flagged:
            sql.awaiting.flag_workflow(self.alias, self.workflow_id)
            self._flagged = True
        found = self.read()
        return PENDING if found is PENDING else self.finish(found)

    def timed_out(self, seconds: float) -> WaitTimeoutError:
        return WaitTimeoutError(workflow_id=self.workflow_id, timeout=seconds)

    def read(self) -> Any:
        """The workflow's status and steps once final, else ``PENDING``."""
        counts = sql.workflow_control.workflow_states(self.alias, [self.workflow_id]).get(self.workflow_id)
        if counts is None:
            raise WorkflowDoesNotExist(f"no workflow has id {self.workflow_id}")
        status = workflow_status(counts)
        if status is WorkflowStatus.RUNNING:
            return PENDING
        return status, sql.awaiting.workflow_steps(self.alias, self.workflow_id)

    def finish(self, found: tuple[WorkflowStatus, Sequence[JobResult]]) -> dict[str, Any]:
        """The result of a finished workflow, or raise for the step that stopped it."""
        status, steps = found
        sql.awaiting.clear_workflow(self.alias, self.workflow_id)
        if status is WorkflowStatus.SUCCEEDED:
            return {step.step_name: step.result for step in steps if step.status == "succeeded"}  # type: ignore[misc]
        culprit = "cancelled" if status is WorkflowStatus.CANCELLED else "dead"
        outcome(min((step for step in steps if step.status == culprit), key=lambda step: step.id))
        raise AssertionError(f"workflow {self.workflow_id} is {status} without a {culprit} step")  # pragma: no cover
