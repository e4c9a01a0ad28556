"""A TCP proxy in front of the test database that the tests can take down and bring back up.

It listens on a free loopback port. While up it forwards each connection to the real server (its
Unix socket, or its host and port); while down it closes every connection it accepts at once and
drops those it was forwarding, as a database in a failover looks to its clients. The shared server
itself is never stopped.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any
from urllib.parse import quote


class DatabaseProxy:
    """Forward loopback TCP connections to the database of ``settings`` (a Django ``DATABASES`` entry)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self._up = threading.Event()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept_forever, name="database-proxy", daemon=True).start()

    def url(self) -> str:
        """A DATABASE_URL (as the settings read it) reaching the test database through this proxy."""
        user = quote(self.settings["USER"] or "", safe="")
        return f"postgres://{user}@127.0.0.1:{self.port}/{quote(self.settings['NAME'], safe='')}"

    def up(self) -> None:
        """Forward new connections from now on."""
        self._up.set()

    def down(self) -> None:
        """Refuse new connections and cut those being forwarded."""
        self._up.clear()
        with self._lock:
            dropped, self._open = self._open, []
        for sock in dropped:
            _close(sock)

    def close(self) -> None:
        """Stop listening and cut everything."""
        self._closed = True
        self.down()
        _close(self._listener)

    def _accept_forever(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up.is_set():
                _close(client)
                continue
            try:
                server = self._connect()
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open += [client, server]
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, target), daemon=True).start()

    def _connect(self) -> socket.socket:
        host, port = self.settings["HOST"] or "", int(self.settings["PORT"] or 5432)
        if host.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(f"{host}/.s.PGSQL.{port}")
            return sock
        return socket.create_connection((host or "localhost", port))


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    _close(source)
    _close(target)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
