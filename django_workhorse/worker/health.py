"""A worker's health for its supervisor: a file touched every heartbeat, and HTTP ``/live`` and ``/ready``.

Liveness is the process's own heartbeat (it ticks while the database is down too: waiting is not
dead); readiness is the database answering a trivial query within ``READY_TIMEOUT``. The server is
the standard library's, on a daemon thread, loopback unless told otherwise.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

logger = logging.getLogger(__name__)
# How long /ready waits for the database's answer.
READY_TIMEOUT = 2.0


class Health:
    """What a worker says of itself: ``beat()`` on every heartbeat, read by ``/live`` and the file's mtime.

    ``live_within`` is how recent the last beat must be for ``is_live()``; ``ready`` answers ``is_ready()``.
    """

    def __init__(self, *, live_within: float, ready: Callable[[], bool], file: Path | None = None) -> None:
        self.live_within = live_within
        self.ready = ready
        self.file = file
        self._last_beat = time.monotonic()
        self._lock = threading.Lock()

    def beat(self) -> None:
        """Record a heartbeat: ``/live`` answers 200 for ``live_within`` seconds, and the file is touched."""
        with self._lock:
            self._last_beat = time.monotonic()
        if self.file is not None:
            try:
                self.file.touch()
            except OSError as exc:  # the supervisor sees a stale file; the worker goes on
                logger.warning("Touching the health file failed path=%s: %s", self.file, exc)

    def is_live(self) -> bool:
        """Whether the last heartbeat is at most ``live_within`` seconds old."""
        with self._lock:
            return time.monotonic() - self._last_beat <= self.live_within

    def is_ready(self) -> bool:
        """Whether the database answers now."""
        return self.ready()


class HealthServer:
    """Serve ``/live`` and ``/ready`` of ``health`` on ``address:port``: 200 when so, 503 when not.

    The socket is bound here (raise ``OSError`` if the port is taken); ``start()`` serves it on a
    daemon thread and ``close()`` stops it.
    """

    def __init__(self, health: Health, address: str, port: int) -> None:
        self.health = health
        self._server = ThreadingHTTPServer((address, port), _handler(health))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="workhorse-health", daemon=True)

    def start(self) -> None:
        """Serve on a daemon thread until ``close()`` or the process exits."""
        self._thread.start()

    def close(self) -> None:
        """Stop serving and free the port."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


def _handler(health: Health) -> type[BaseHTTPRequestHandler]:
    probes = {"/live": health.is_live, "/ready": health.is_ready}

    class HealthHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            probe = probes.get(self.path.split("?", 1)[0])
            if probe is None:
                self._answer(404, b"not found\n")
            elif probe():
                self._answer(200, b"ok\n")
            else:
                self._answer(503, b"unavailable\n")

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the standard library's name)
            logger.debug("Health probe %s", format % args)

    return HealthHandler
