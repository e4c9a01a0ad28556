"""What the queue reports as it works, one call per event, to the metrics extra when installed.

Enqueue and the worker call these at the points where an outcome is known. Without
prometheus-client (``django-workhorse[metrics]``) each is a function that does nothing, so the
extra costs nothing when absent. Labels stay bounded: queue, keyed mode, outcome, status, check id.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_workhorse.enqueueing.prepared import PreparedJob
    from django_workhorse.sql.claims import ClaimedJob
    from django_workhorse.types import EnqueueResult


def _collectors() -> ModuleType | None:
    try:
        from django_workhorse.observability.metrics import collectors
    except ImportError:  # prometheus-client is not installed: nothing is recorded
        return None
    return collectors


_metrics = _collectors()


def recording() -> bool:
    """Whether the metrics extra is installed, so that the calls below record."""
    return _metrics is not None


def clock() -> float:
    """The instant an operation starts, for the ``seconds`` the calls below take."""
    return time.perf_counter()


def enqueue_settled(requests: Sequence[PreparedJob], results: Sequence[EnqueueResult], started: float) -> None:
    """Count each request of one enqueue call by queue, mode and outcome; time the call."""
    if _metrics is not None:
        _metrics.enqueue_settled(requests, results, time.perf_counter() - started)


def workflow_settled(steps: Sequence[PreparedJob], scope: str | None, outcome: str, started: float) -> None:
    """Count a workflow's enqueue: each step as a request of mode ``workflow`` with the workflow's
    outcome, its key once under ``scope``; time the call."""
    if _metrics is not None:
        _metrics.workflow_settled(steps, scope, outcome, time.perf_counter() - started)


def workflow_conflicted(scope: str) -> None:
    """Count a keyed workflow's enqueue refused as a ``conflict`` (once, not per step)."""
    if _metrics is not None:
        _metrics.workflow_conflicted(scope)


def enqueue_refused(outcome: str, request: PreparedJob | None) -> None:
    """Count an enqueue call refused as ``conflict`` or ``invalid`` (``request``: the one at fault,
    if it was prepared; else queue and mode are counted as empty)."""
    if _metrics is not None:
        _metrics.enqueue_refused(outcome, request)


def claimed(seconds: float) -> None:
    """Time one claim statement (its round trip included)."""
    if _metrics is not None:
        _metrics.claimed(seconds)


def attempt_started(job: ClaimedJob) -> None:
    """Time how long ``job`` waited from its ``run_at`` to the start of this attempt."""
    if _metrics is not None:
        _metrics.attempt_started(job, job.waited + (time.perf_counter() - job.claimed_at))


def attempt_finished(job: ClaimedJob, status: str, duration: float | None, outcome: str = "") -> None:
    """Count a finished attempt by queue, written status and outcome (``execution.OUTCOMES``); time its handler."""
    if _metrics is not None:
        _metrics.attempt_finished(job, status, duration, outcome)


def breaker_transitioned(to_state: str) -> None:
    """Count a circuit breaker's change of state by the state it went to (closed, open, half_open)."""
    if _metrics is not None:
        _metrics.breaker_transitioned(to_state)


def reclaimed(count: int) -> None:
    """Count jobs whose expired leases a worker reclaimed."""
    if _metrics is not None and count:
        _metrics.reclaimed(count)


def redriven(queue: str) -> None:
    """Count a dead job of ``queue`` run again as a new job."""
    if _metrics is not None:
        _metrics.redriven(queue)


def schedule_ticked(schedule: str, outcome: str) -> None:
    """Count a tick of ``schedule``: ``accepted``, ``replayed`` (another worker enqueued it) or ``skipped``."""
    if _metrics is not None:
        _metrics.schedule_ticked(schedule, outcome)


def schedules_left_out(counts: Mapping[str, int]) -> None:
    """Set how many declared schedules this process's evaluation leaves out, by check id (every id, 0 included)."""
    if _metrics is not None:
        _metrics.schedules_left_out(counts)


def keyed_counts() -> dict[tuple[str, str], float] | None:
    """The keyed requests counted so far by (scope, outcome), or None without the metrics extra."""
    return None if _metrics is None else _metrics.keyed_counts()
