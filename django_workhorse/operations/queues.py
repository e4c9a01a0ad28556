"""Queue control: pause, resume and drain a queue; list the paused ones.

A pause is a durable row (``QueueState``) that every worker's claim reads (decision 0021): a
worker polling a paused queue claims none of its jobs from its next claim on, and a worker that
LISTENs is woken by the resume. A pause touches no job: running jobs run on, queued ones keep
their place, enqueueing still works (the work waits). The admin's Queues page and
``manage.py workhorse_queue`` call these and nothing else.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import router, transaction
from django.db.transaction import TransactionManagementError

from django_workhorse import conf, sql
from django_workhorse.conf import app_settings
from django_workhorse.enqueueing.storable import check_text
from django_workhorse.enqueueing.validation import check_queue
from django_workhorse.exceptions import DrainTimeoutError, InvalidArgumentError
from django_workhorse.models import QueueState

logger = logging.getLogger(__name__)

# A drain waits at most this long (a pre-deploy hook that waits longer is waiting for a stuck job).
MAX_DRAIN_TIMEOUT = 86_400.0
MIN_DRAIN_POLL, MAX_DRAIN_POLL = 0.01, 60.0
DEFAULT_DRAIN_POLL = 1.0


@dataclass(frozen=True)
class QueueChange:
    """A queue after :func:`pause_queue` or :func:`resume_queue`: whether that call changed it
    (``changed``; False when it already was so, and nothing was written), and since when and by
    whom it is paused or resumed."""

    queue: str
    paused: bool
    changed: bool
    changed_at: datetime
    changed_by: str


@dataclass(frozen=True)
class DrainProgress:
    """One check of a drain: the ids of the queue's running jobs, the transactions older than the
    pause still open (a claim among them may not have committed yet), and the seconds waited."""

    running: list[int]
    waiting_transactions: int
    waited: float

    @property
    def drained(self) -> bool:
        return not self.running and not self.waiting_transactions


def pause_queue(queue: str, *, by: str = "", using: str | None = None) -> QueueChange:
    """Pause ``queue``: no worker claims its jobs from its next claim on; return the queue's state.

    Idempotent: pausing a paused queue writes nothing and keeps when and by whom it was paused.
    Running jobs run on; queued jobs keep their place; enqueueing into the queue still works.
    In a transaction, workers see the pause when it commits (and never if it rolls back). Eager
    mode ignores pauses. Raise ``InvalidArgumentError`` naming the field and its bound for a bad
    ``queue`` or ``by``, before any SQL.
    """
    return _set_paused(queue, paused=True, by=by, using=using)


def resume_queue(queue: str, *, by: str = "", using: str | None = None) -> QueueChange:
    """Resume ``queue``, waking the workers that LISTEN (on commit); return the queue's state.

    Idempotent: resuming a queue that runs writes nothing, except that a queue never paused gets
    its row (with who resumed it). Raise ``InvalidArgumentError`` as :func:`pause_queue` does.
    """
    return _set_paused(queue, paused=False, by=by, using=using)


def paused_queues(*, using: str | None = None) -> list[QueueState]:
    """Return the paused queues (with since when and by whom), by name."""
    return list(QueueState.objects.using(using or router.db_for_read(QueueState)).filter(paused=True).order_by("queue"))


def drain_queue(
    queue: str,
    *,
    timeout: float,
    poll: float = DEFAULT_DRAIN_POLL,
    by: str = "",
    using: str | None = None,
    on_progress: Callable[[DrainProgress], None] | None = None,
) -> DrainProgress:
    """Pause ``queue``, then wait until none of its jobs is running; return the last check.

    A pre-deploy hook: when this returns, no job of the queue runs and none will start until the
    queue is resumed. It checks every ``poll`` seconds (``on_progress`` sees each check), and also
    waits for the transactions that began before the pause committed: a claim among them may have
    read the queue as running. The queue stays paused whatever happens. Must run outside a
    transaction (the pause commits first). Raise ``DrainTimeoutError`` if ``timeout`` seconds pass
    first, ``InvalidArgumentError`` for a bad argument, ``TransactionManagementError`` inside
    ``atomic()``.
    """
    alias = _alias(using)
    _seconds(timeout, "timeout", 0.0, MAX_DRAIN_TIMEOUT)
    _seconds(poll, "poll", MIN_DRAIN_POLL, MAX_DRAIN_POLL)
    if not transaction.get_autocommit(using=alias):
        raise TransactionManagementError("drain_queue() waits for other sessions' commits: call it outside atomic()")
    pause_queue(queue, by=by, using=alias)
    since = sql.actions.clock(alias)  # read after the pause committed, so later than its commit
    started, tick = time.monotonic(), threading.Event()
    while True:
        running, older = sql.queues.drain_check(alias, queue, since)
        progress = DrainProgress(running, older, time.monotonic() - started)
        if on_progress is not None:
            on_progress(progress)
        if progress.drained:
            logger.info("Drained queue queue=%s waited=%.1f", queue, progress.waited)
            return progress
        left = timeout - progress.waited
        if left <= 0:
            raise DrainTimeoutError(queue=queue, timeout=timeout, running=running, waiting_transactions=older)
        tick.wait(min(poll, left))


def _set_paused(queue: Any, *, paused: bool, by: Any, using: str | None) -> QueueChange:
    check_queue(queue, error=InvalidArgumentError)
    by = check_text(by, "by", max_chars=conf.MAX_REQUESTED_BY_CHARS, allow_empty=True)
    row = sql.queues.set_paused(_alias(using), queue, paused=paused, changed_by=by, channel=app_settings.NOTIFY_CHANNEL)
    written, name, is_paused, changed_at, changed_by = row
    change = QueueChange(name, is_paused, written, changed_at, changed_by)
    if written:
        logger.info("%s queue queue=%s requested_by=%s", "Paused" if paused else "Resumed", queue, by)
    return change


def _seconds(value: Any, field: str, low: float, high: float) -> float:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise InvalidArgumentError(field=field, bound=f"a number of seconds in {low:g}..{high:g}", value=value)
    return float(value)


def _alias(using: str | None) -> str:
    return using or router.db_for_write(QueueState)
