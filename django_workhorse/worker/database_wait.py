"""Waiting for the database: a worker or scheduler whose database is unreachable backs off and carries on.

Each attempt that finds the database down logs one line (no traceback) and sleeps a random time of
up to 0.5 s, doubling each step to 30 s (capped exponential backoff with full jitter, so a fleet
does not reconnect in step after a failover). Only ``max_wait`` makes it give up, with
``DatabaseUnavailableError``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import psycopg
from django.db import DatabaseError, connections

from django_workhorse import sql
from django_workhorse.exceptions import DatabaseUnavailableError

logger = logging.getLogger(__name__)
T = TypeVar("T")
BACKOFF_START = 0.5
BACKOFF_CAP = 30.0
# The longest --max-db-wait (a week); no value waits for ever.
MAX_DB_WAIT = 7 * 24 * 3600.0


# How long a ping waits for the database before it counts as down.
PING_TIMEOUT = 5.0


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with full jitter: step ``n`` sleeps up to ``start * 2**n``, at most ``cap``."""

    start: float = BACKOFF_START
    cap: float = BACKOFF_CAP

    def ceiling(self, step: int) -> float:
        """The longest sleep of ``step`` (0-based)."""
        return min(self.cap, self.start * 2.0 ** min(step, 64))

    def delay(self, step: int) -> float:
        """A random sleep for ``step``, uniform in ``[0, ceiling(step)]``."""
        return random.uniform(0, self.ceiling(step))


class DatabaseWait:
    """Wait for ``alias`` to answer, sleeping on ``stopping`` (so a stop ends the wait at once).

    ``beat`` is called at least every ``beat_every`` seconds while waiting (the health file and
    ``/live`` keep saying the process is alive); ``waiting`` is set while the database is known down.
    """

    def __init__(
        self,
        alias: str,
        *,
        max_wait: float | None = None,
        stopping: threading.Event | None = None,
        beat: Callable[[], None] | None = None,
        beat_every: float = 10.0,
        backoff: Backoff | None = None,
    ) -> None:
        self.alias = alias
        self.max_wait = max_wait
        self.stopping = stopping or threading.Event()
        self.beat = beat
        self.beat_every = beat_every
        self.backoff = backoff or Backoff(BACKOFF_START, BACKOFF_CAP)
        self.waiting = threading.Event()

    def until_up(self, first_error: BaseException | None = None) -> bool:
        """Return True once the database answers, False if stopped first.

        Raise ``DatabaseUnavailableError`` once it has not answered for longer than ``max_wait``.
        """
        began, step, error = time.monotonic(), 0, first_error
        while not self.stopping.is_set():
            if error is None:
                error = self._ping()
                if error is None:
                    self._back(began, step)
                    return True
            waited = time.monotonic() - began
            if self.max_wait is not None and waited >= self.max_wait:
                self.waiting.clear()
                raise DatabaseUnavailableError(
                    alias=self.alias, waited=waited, max_wait=self.max_wait, error=_one_line(error)
                )
            self.waiting.set()
            delay = self.backoff.delay(step)
            if self.max_wait is not None:
                delay = min(delay, max(self.max_wait - waited, 0.0))
            logger.warning(
                "Database unreachable alias=%s attempt=%s next_in=%.1fs: %s",
                self.alias,
                step + 1,
                delay,
                _one_line(error),
            )
            self._sleep(delay)
            step, error = step + 1, None
        self.waiting.clear()
        return False

    def call(self, step: Callable[[], T]) -> T | None:
        """Run ``step``; while it fails because the database is down, wait for it and run it again.

        Return its result, or None if stopped while waiting. A ``DatabaseError`` while the database
        answers is the step's own: it is raised.
        """
        while True:
            try:
                return step()
            except DatabaseError as exc:
                connections[self.alias].close()  # broken, perhaps: ask on a fresh one
                if self.answers():
                    raise
                if not self.until_up(exc):
                    return None

    def answers(self) -> bool:
        """Whether the database answers now (on a connection of its own: this thread's may be in a
        broken transaction, which is the caller's error, not an outage)."""
        return self._ping() is None

    def _ping(self) -> BaseException | None:
        try:
            sql.connection.ping_directly(self.alias, PING_TIMEOUT)
        except psycopg.Error as exc:
            return exc
        return None

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and not self.stopping.is_set():
            if self.beat is not None:
                self.beat()
            self.stopping.wait(min(left, self.beat_every))

    def _back(self, began: float, steps: int) -> None:
        if self.waiting.is_set():
            logger.info(
                "Database answers again alias=%s after=%.1fs attempts=%s",
                self.alias,
                time.monotonic() - began,
                steps + 1,
            )
        self.waiting.clear()


def _one_line(error: BaseException) -> str:
    """The first line of a database error (psycopg adds hints on the lines after)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
