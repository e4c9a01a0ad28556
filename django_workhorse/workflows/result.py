"""What enqueueing a workflow returns (a value: no database work here)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from django_workhorse.types import EnqueueOutcome


@dataclass(frozen=True)
class WorkflowResult:
    """What enqueueing a workflow did: its id, ``ACCEPTED`` or ``REPLAYED``, and each step's job id
    (the step's original job: a redrive's copy is not listed)."""

    workflow_id: int
    outcome: EnqueueOutcome
    jobs: Mapping[str, int]
