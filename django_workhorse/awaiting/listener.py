"""One LISTEN connection per process and database alias, on the result channel, waking the waits
registered for the job ids its notifications name (decision 0022 §5).

A daemon thread holds the connection (``sql.connection.listen``) while anyone waits, and closes it
once nobody has waited for ``IDLE_SECONDS``. After a failure it reconnects and wakes every waiter
once: notifications sent while it was away are lost, so each wait re-reads its job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from django_workhorse import sql
from django_workhorse.conf import NO_RESULT_LISTENER, app_settings

logger = logging.getLogger(__name__)
# How long a listener keeps its connection after its last waiter left.
IDLE_SECONDS = 30.0
# How long the thread waits between two attempts to connect.
RECONNECT_SECONDS = 0.5
# How often the thread looks up from the connection (to notice it is idle, or asked to stop).
TICK_SECONDS = 0.5


@dataclass(eq=False)
class Waiter:
    """One wait: woken through ``wake(source)``; ``sources`` counts its wake-ups by where they came
    from (``notify``; ``connect`` and ``reconnect``, when LISTEN comes up), for tests and benchmarks."""

    notify: Callable[[], None]
    sources: dict[str, int] = field(default_factory=dict)

    def wake(self, source: str) -> None:
        self.sources[source] = self.sources.get(source, 0) + 1
        self.notify()


def thread_waiter(event: threading.Event) -> Waiter:
    """A waiter that sets ``event``."""
    return Waiter(event.set)


def future_waiter(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Waiter:
    """A waiter that sets an asyncio ``event`` on ``loop`` (from the listener's thread)."""

    def notify() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting any more
            loop.call_soon_threadsafe(event.set)

    return Waiter(notify)


class Listener:
    """The result channel's LISTEN connection for one alias, and the waits registered on it."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.up = threading.Event()  # LISTEN is in place: notifications from now on arrive
        self.backend_pid: int | None = None  # the listening session's server process (for tests)
        self.connections = 0  # how many times it connected
        self._lock = threading.Lock()
        self._waiters: dict[int, set[Waiter]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def register(self, job_ids: Iterable[int], waiter: Waiter) -> None:
        """Wake ``waiter`` when one of ``job_ids`` is announced; start listening if not yet."""
        with self._lock:
            for job_id in job_ids:
                self._waiters.setdefault(job_id, set()).add(waiter)
            if self._thread is None or not self._thread.is_alive():
                self._stopping.clear()
                self._thread = threading.Thread(target=self._run, name=f"workhorse-results-{self.alias}", daemon=True)
                self._thread.start()

    def unregister(self, job_ids: Iterable[int], waiter: Waiter) -> None:
        """Stop waking ``waiter`` for ``job_ids``."""
        with self._lock:
            for job_id in job_ids:
                waiters = self._waiters.get(job_id)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[job_id]

    def stop(self, timeout: float = 5.0) -> None:
        """Close the connection and end the thread (tests; a later ``register`` starts it again)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                with sql.connection.listen(self.alias, app_settings.RESULT_CHANNEL) as conn:
                    self.backend_pid = conn.info.backend_pid
                    self.connections += 1
                    self.up.set()
                    # Whatever was announced before LISTEN was in place is lost: every wait re-reads.
                    self._wake_all("connect" if self.connections == 1 else "reconnect")
                    if self._listen(conn):
                        return
            except Exception:  # each wait polls meanwhile
                logger.exception("Result LISTEN connection failed; reconnecting alias=%s", self.alias)
            self.up.clear()
            self._stopping.wait(RECONNECT_SECONDS)
        self.up.clear()

    def _listen(self, conn: psycopg.Connection[Any]) -> bool:
        """Dispatch notifications until stopped (False) or idle for ``IDLE_SECONDS`` (True: the
        thread is done, and a later ``register`` starts another)."""
        idle_since: float | None = None
        while not self._stopping.is_set():
            for notice in conn.notifies(timeout=TICK_SECONDS):
                self._wake(notice.payload)
            with self._lock:
                if self._waiters:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= IDLE_SECONDS:
                    self.up.clear()
                    self._thread = None
                    return True
        return False

    def _wake(self, payload: str) -> None:
        try:
            job_id = int(payload)
        except ValueError:  # someone else's notification on our channel
            return
        with self._lock:
            waiters = list(self._waiters.get(job_id, ()))
        for waiter in waiters:
            waiter.wake("notify")

    def _wake_all(self, source: str) -> None:
        with self._lock:
            waiters = {waiter for group in self._waiters.values() for waiter in group}
        for waiter in waiters:
            waiter.wake(source)


class Polling:
    """No listener (``WORKHORSE_RESULT_LISTEN_DATABASE = "none"``): nothing wakes a wait, which polls."""

    def __init__(self) -> None:
        self.up = threading.Event()  # never set: waits poll at the "down" interval

    def register(self, job_ids: Iterable[int], waiter: Waiter) -> None:
        """Nothing to register with."""

    def unregister(self, job_ids: Iterable[int], waiter: Waiter) -> None:
        """Nothing to unregister from."""


POLLING = Polling()
_listeners: dict[tuple[int, str], Listener] = {}
_listeners_lock = threading.Lock()


def listener(alias: str) -> Listener:
    """This process's listener on the connection of ``alias`` (a forked child gets its own)."""
    key = (os.getpid(), alias)
    with _listeners_lock:
        found = _listeners.get(key)
        if found is None:
            found = _listeners[key] = Listener(alias)
        return found


def listener_for(alias: str) -> Listener | Polling:
    """What wakes the waits that read ``alias``: the listener on ``WORKHORSE_RESULT_LISTEN_DATABASE``
    (by default ``alias`` itself), or ``POLLING`` when that setting is ``"none"``."""
    listen_alias = app_settings.RESULT_LISTEN_DATABASE
    if listen_alias == NO_RESULT_LISTENER:
        return POLLING
    return listener(listen_alias or alias)
