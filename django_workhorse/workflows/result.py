"""What enqueueing a workflow returns: a value, with shortcuts to the workflow's state and its
cancellation (``workflows.operations``), and a wait for its result (``workflows.waiting``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django_workhorse.types import EnqueueOutcome

if TYPE_CHECKING:
    from django_workhorse.workflows.operations import WorkflowState


@dataclass(frozen=True)
class WorkflowResult:
    """What enqueueing a workflow did: its id, ``ACCEPTED`` or ``REPLAYED``, and each step's job id
    (the step's original job: a redrive's copy is not listed)."""

    workflow_id: int
    outcome: EnqueueOutcome
    jobs: Mapping[str, int]

    def state(self, *, using: str | None = None) -> WorkflowState:
        """The workflow's state now: see :func:`~django_workhorse.workflows.operations.workflow_state`."""
        from django_workhorse.workflows.operations import workflow_state  # noqa: PLC0415 (models at call time)

        return workflow_state(self.workflow_id, using=using)

    def cancel(self, *, requested_by: str = "", using: str | None = None) -> int:
        """Cancel the workflow: see :func:`~django_workhorse.workflows.operations.cancel_workflow`."""
        from django_workhorse.workflows.operations import cancel_workflow  # noqa: PLC0415 (models at call time)

        return cancel_workflow(self.workflow_id, requested_by=requested_by, using=using)

    def wait(self, timeout: float | timedelta, *, using: str | None = None) -> dict[str, Any]:
        """Wait until the workflow has finished; return ``{step: result}`` of its succeeded steps.

        See :func:`~django_workhorse.workflows.waiting.wait_for_workflow`: ``JobFailedError`` names
        the dead step as soon as one blocks or fails the workflow, ``JobCancelledError`` a cancelled
        one, and ``WaitTimeoutError`` says time ran out.
        """
        from django_workhorse.workflows.waiting import wait_for_workflow  # noqa: PLC0415 (models at call time)

        return wait_for_workflow(self.workflow_id, timeout=timeout, using=using)
