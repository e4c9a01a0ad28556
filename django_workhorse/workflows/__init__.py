"""Workflows: graphs of ordinary jobs, released by their parents' outcomes (decision 0022)."""

from __future__ import annotations

from django_workhorse.workflows.canvas import chain, chord, group
from django_workhorse.workflows.definition import Plan, PlannedStep, Step, Workflow
from django_workhorse.workflows.result import WorkflowResult

__all__ = ["Plan", "PlannedStep", "Step", "Workflow", "WorkflowResult", "chain", "chord", "group"]
