"""The worker: claim, run and record jobs."""

from __future__ import annotations

from django_workhorse.worker.context import HandlerContext
from django_workhorse.worker.loop import Worker, WorkerStats

__all__ = ["HandlerContext", "Worker", "WorkerStats"]
