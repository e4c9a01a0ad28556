"""``workhorse_worker --health-file/--health-port``: the command's side of ``worker.health``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.core.management.base import CommandError

from django_workhorse import sql
from django_workhorse.worker.health import READY_TIMEOUT, Health, HealthServer


@contextmanager
def serving_health(
    *, database: str, file: Path | None, port: int | None, address: str, heartbeat: float
) -> Iterator[Health | None]:
    """Yield the worker's ``Health`` (None without ``file`` and ``port``), its server serving ``port``.

    ``/live`` is 200 while a heartbeat (every ``heartbeat`` seconds) came within three of them.
    Raise ``CommandError`` (exit status 2) if the port cannot be served or the file cannot be touched.
    """
    if file is None and port is None:
        yield None
        return
    health = Health(live_within=3 * heartbeat, ready=lambda: sql.connection.answers(database, READY_TIMEOUT), file=file)
    if file is not None:
        try:
            file.touch()
        except OSError as exc:
            raise CommandError(f"--health-file: cannot touch {file}: {exc.strerror or exc}", returncode=2) from exc
    server = None
    if port is not None:
        try:
            server = HealthServer(health, address, port)
        except OSError as exc:
            message = f"--health-port: cannot serve on {address}:{port}: {exc.strerror or exc}"
            raise CommandError(message, returncode=2) from exc
        server.start()
    try:
        yield health
    finally:
        if server is not None:
            server.close()
