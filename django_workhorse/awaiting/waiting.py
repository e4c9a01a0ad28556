"""Wait for a job's result: ``wait_for`` and ``await_for`` (decision 0022 §5).

A wait registers with this process's listener (``awaiting.listener``), flags the job (so the
statement that ends it announces it), then reads it; it reads again when woken by the announcement,
when the listener (re)connects, and at each poll: every ``POLL_SECONDS`` while the listener is up,
every ``DOWN_POLL_SECONDS`` while it is not. A read that fails on a lost connection closes it and
tries again at the next poll, until the timeout. The same loop serves a workflow's wait
(``workflows.waiting``), through a different ``Target``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connections, router

from django_workhorse import sql
from django_workhorse.awaiting import listener as listeners
from django_workhorse.enqueueing.key_lifetimes import TERMINAL_JOB_STATUSES
from django_workhorse.enqueueing.storable import check_id
from django_workhorse.exceptions import (
    InvalidArgumentError,
    JobCancelledError,
    JobDoesNotExist,
    JobFailedError,
    WaitNotAllowedError,
    WaitTimeoutError,
)
from django_workhorse.models import Job
from django_workhorse.sql.awaiting import JobResult
from django_workhorse.worker import current

# How often a wait reads its job again without being woken: while the listener is up, and while
# it is down (a restart, a pooler that drops LISTEN).
POLL_SECONDS = 1.0
DOWN_POLL_SECONDS = 0.2
MAX_WAIT = timedelta(days=365)
TERMINAL = frozenset(TERMINAL_JOB_STATUSES)


class Pending:
    """What a look returns while the job (or workflow) has not finished."""


PENDING = Pending()


class Target(Protocol):
    """What a wait waits for: the jobs whose announcements wake it, and how to look at it."""

    def job_ids(self) -> Sequence[int]:
        """The ids of the jobs whose announcements wake the wait."""
        ...

    def look(self) -> Any:
        """Read once: the result, ``PENDING``, or raise for a failure (flagging first, once)."""
        ...

    def timed_out(self, seconds: float) -> WaitTimeoutError:
        """The error for a wait that ran out of time."""
        ...


def wait_for(job_id: int, *, timeout: float | timedelta, using: str | None = None) -> Any:
    """Wait until job ``job_id`` has finished and return its result.

    Raise ``JobFailedError`` if it is dead (its ``error`` is the job's last error),
    ``JobCancelledError`` if it was cancelled, ``WaitTimeoutError`` if it has not finished within
    ``timeout`` (seconds, or a ``timedelta``; 0 reads once), ``JobDoesNotExist`` if there is no such
    job, ``WaitNotAllowedError`` inside ``atomic()`` on ``using`` (unless the job has finished) and
    inside a handler whose worker runs one job at a time and serves the job's queue, and
    ``InvalidArgumentError`` for a bad argument. Returning or raising for a finished job reads its
    result: it is no longer kept for waits.
    """
    check_id(job_id, "job_id")
    seconds = check_timeout(timeout)
    alias = using or router.db_for_write(Job)
    target = JobTarget(job_id, alias)
    ready = target.guard()
    if ready is not PENDING:
        return ready
    return wait(target, alias, seconds)


async def await_for(job_id: int, *, timeout: float | timedelta, using: str | None = None) -> Any:
    """Wait until job ``job_id`` has finished and return its result: :func:`wait_for`, awaitable.

    The reads run through ``sync_to_async``; the wait itself blocks no thread.
    """
    check_id(job_id, "job_id")
    seconds = check_timeout(timeout)
    alias = using or router.db_for_write(Job)
    target = JobTarget(job_id, alias)
    ready = await sync_to_async(target.guard, thread_sensitive=True)()
    if ready is not PENDING:
        return ready
    return await await_target(target, alias, seconds)


def check_timeout(timeout: Any) -> float:
    """Return ``timeout`` in seconds; raise ``InvalidArgumentError`` unless it is a number of seconds
    (or a ``timedelta``) in 0..365 days."""
    bound = f"a number of seconds (or a timedelta) in 0..{int(MAX_WAIT.total_seconds())}"
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or math.isnan(seconds):
        raise InvalidArgumentError(field="timeout", bound=bound, value=timeout)
    if not 0 <= seconds <= MAX_WAIT.total_seconds():
        raise InvalidArgumentError(field="timeout", bound=bound, value=timeout)
    return float(seconds)


def not_allowed_in_transaction(alias: str, what: str) -> WaitNotAllowedError:
    """The error for a wait inside ``atomic()``."""
    return WaitNotAllowedError(
        f"cannot wait for {what} inside atomic() on database {alias!r}: the transaction would hide what it "
        "enqueued from the workers and hold the result back; wait after the block commits"
    )


def not_allowed_in_handler(what: str, queue: str) -> WaitNotAllowedError:
    """The error for a wait, inside a handler, on a queue its worker serves one job at a time."""
    return WaitNotAllowedError(
        f"cannot wait for {what} inside a handler: it has a job in queue {queue!r}, which this worker serves one "
        "job at a time, so that job could only run once this handler ends"
    )


class JobTarget:
    """A wait for one job."""

    def __init__(self, job_id: int, alias: str) -> None:
        self.job_id = job_id
        self.alias = alias
        self._flagged = False

    def job_ids(self) -> Sequence[int]:
        return [self.job_id]

    def guard(self) -> Any:
        """Refuse a wait that could not end (``WaitNotAllowedError``); return a finished result
        where only a read is allowed, else ``PENDING``."""
        in_transaction = connections[self.alias].in_atomic_block
        serving = serving_one_at_a_time(self.alias)
        if not in_transaction and serving is None:
            return PENDING
        found = self._read()
        if serving is not None and found.queue in serving:
            raise not_allowed_in_handler(f"job {self.job_id}", found.queue)
        if found.status in TERMINAL:
            return self._finish(found)
        if in_transaction:
            raise not_allowed_in_transaction(self.alias, f"job {self.job_id}")
        return PENDING

    def look(self) -> Any:
        if not self._flagged:
            sql.awaiting.flag_job(self.alias, self.job_id)
            self._flagged = True
        found = self._read()
        return self._finish(found) if found.status in TERMINAL else PENDING

    def timed_out(self, seconds: float) -> WaitTimeoutError:
        return WaitTimeoutError(job_id=self.job_id, timeout=seconds)

    def _read(self) -> JobResult:
        found = sql.awaiting.read_job(self.alias, self.job_id)
        if found is None:
            raise JobDoesNotExist(f"no job has id {self.job_id}")
        return found

    def _finish(self, found: JobResult) -> Any:
        if found.awaited:
            sql.awaiting.clear_job(self.alias, self.job_id)
        return outcome(found)


def outcome(found: JobResult) -> Any:
    """A finished job's result, or the error that stands for it."""
    if found.status == "dead":
        raise JobFailedError(job_id=found.id, step=found.step_name, error=found.last_error)
    if found.status == "cancelled":
        where = f"job {found.id}" if found.step_name is None else f"workflow step {found.step_name!r} (job {found.id})"
        raise JobCancelledError(f"{where} was cancelled", job_id=found.id)
    return found.result


def wait(target: Target, alias: str, seconds: float) -> Any:
    """Wait for ``target`` on this thread, for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    woken = threading.Event()
    waiter = listeners.thread_waiter(woken)
    listener = listeners.listener_for(alias)
    listener.register(target.job_ids(), waiter)
    try:
        while True:
            woken.clear()  # before the read: a wake-up during it makes the next wait return at once
            found = _look(target, alias)
            if found is not PENDING:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise target.timed_out(seconds)
            woken.wait(min(remaining, _poll_seconds(listener)))
    finally:
        listener.unregister(target.job_ids(), waiter)


async def await_target(target: Target, alias: str, seconds: float) -> Any:
    """Wait for ``target`` on the running event loop, for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    woken = asyncio.Event()
    waiter = listeners.future_waiter(asyncio.get_running_loop(), woken)
    listener = listeners.listener_for(alias)
    listener.register(target.job_ids(), waiter)
    look = sync_to_async(_look, thread_sensitive=True)
    try:
        while True:
            woken.clear()
            found = await look(target, alias)
            if found is not PENDING:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise target.timed_out(seconds)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(woken.wait(), min(remaining, _poll_seconds(listener)))
    finally:
        listener.unregister(target.job_ids(), waiter)


def _look(target: Target, alias: str) -> Any:
    try:
        return target.look()
    except (OperationalError, InterfaceError):
        # The connection is gone (a restart, a failover): drop it, and read again at the next poll.
        connections[alias].close()
        return PENDING


def _poll_seconds(listener: listeners.Listener | listeners.Polling) -> float:
    return POLL_SECONDS if listener.up.is_set() else DOWN_POLL_SECONDS


def serving_one_at_a_time(alias: str) -> frozenset[str] | None:
    """The queues of the worker running this thread's handler, if it runs one job at a time on ``alias``."""
    running = current.current()
    serving = None if running is None else running.serving
    if serving is None or serving.concurrency != 1 or serving.alias != alias:
        return None
    return serving.queues
