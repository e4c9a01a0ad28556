"""The handler running on this thread, for code that must know where it runs: a wait refuses to
wait for a job that only its own blocked worker could run (``awaiting.waiting``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Serving:
    """What the worker that owns this thread serves: its database alias, its queues, and how many
    jobs it runs at once."""

    alias: str
    queues: frozenset[str]
    concurrency: int


@dataclass(frozen=True)
class Running:
    """The job whose handler runs on this thread, and the worker it runs on (None: run inline, as
    eager mode and ``run_job`` do)."""

    job_id: int
    serving: Serving | None


_local = threading.local()


def serve(alias: str, queues: Sequence[str], concurrency: int) -> None:
    """Declare this thread an executor of a worker serving ``queues`` of ``alias`` on ``concurrency`` threads."""
    _local.serving = Serving(alias, frozenset(queues), concurrency)


@contextmanager
def running(job_id: int) -> Iterator[None]:
    """Mark ``job_id``'s handler as running on this thread for the block (handlers may nest: eager mode)."""
    outer = getattr(_local, "running", None)
    _local.running = Running(job_id, getattr(_local, "serving", None))
    try:
        yield
    finally:
        _local.running = outer


def current() -> Running | None:
    """The handler running on this thread, or None outside one."""
    running_now: Running | None = getattr(_local, "running", None)
    return running_now
