"""Signals acted on by a thread of their own, never inside a lock the main thread holds.

Python runs a signal handler in the main thread between two of its bytecodes, which may be inside
a lock: ``threading.Event.set()`` from a handler deadlocks when the signal lands while the main
thread is within that Event's ``wait()`` or ``clear()`` (a worker once ignored a SIGTERM for ever
this way). Here the handler only puts the signal's number on a ``queue.SimpleQueue``, whose
``put()`` is reentrant, and a relay thread runs the action.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

Action = Callable[[], None]


class SignalRelay:
    """Run ``actions[signum]()`` on a relay thread when ``signum`` arrives, between :meth:`start`
    and :meth:`stop`. Only the main thread handles signals: elsewhere both do nothing."""

    def __init__(self, actions: Mapping[int, Action]) -> None:
        self._actions = dict(actions)
        self._arrived: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._previous: dict[int, Any] = {}

    def start(self) -> None:
        """Start the relay thread and install the handlers (remembering the ones they replace)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._thread = threading.Thread(target=self._relay, name="workhorse-signals", daemon=True)
        self._thread.start()
        self._previous = {signum: signal.signal(signum, self._arrive) for signum in self._actions}

    def stop(self) -> None:
        """Put the previous handlers back and end the relay thread once it has acted on what arrived."""
        if self._thread is None:
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._arrived.put(None)
        self._thread.join(5)
        self._thread = None

    def _arrive(self, signum: int, _frame: object) -> None:
        self._arrived.put(signum)  # reentrant: safe whatever the main thread was doing

    def _relay(self) -> None:
        while (signum := self._arrived.get()) is not None:
            try:
                self._actions[signum]()
            except Exception:
                logger.exception("Acting on signal %s failed", signal.Signals(signum).name)


@contextmanager
def relayed(actions: Mapping[int, Action]) -> Iterator[None]:
    """Within the block, act on each signal of ``actions`` on a relay thread (see the module)."""
    relay = SignalRelay(actions)
    relay.start()
    try:
        yield
    finally:
        relay.stop()
