"""Worker subprocesses for tests: where to connect, and a handle on the process."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def subprocess_database_url() -> str:
    """A DATABASE_URL (as the settings read it) for the database this test runs against, for a subprocess."""
    settings = connection.settings_dict
    user = quote(settings["USER"] or "", safe="")
    password = f":{quote(settings['PASSWORD'], safe='')}" if settings["PASSWORD"] else ""
    host, port, name = settings["HOST"] or "", settings["PORT"] or "", quote(settings["NAME"], safe="")
    if host.startswith("/"):
        # A Unix socket directory (the embedded server): django-environ reads it from the path.
        return f"postgres://{user}{password}@:{port}/{quote(host, safe='/')}/{name}"
    return f"postgres://{user}{password}@{host}:{port}/{name}"


class WorkerProcess:
    """A worker started as a subprocess, with its output in ``log``."""

    def __init__(self, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.popen = popen
        self.log = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text()

    def terminate(self, timeout: float = 60) -> None:
        """SIGTERM this worker once it has registered, or exited. It installs its signal handling
        before it registers; a SIGTERM while it is still starting (importing Django, on a loaded
        machine for seconds) ends it with -15 instead of a drain."""
        from django_workhorse.models import WorkerRecord
        from tests.worker_tasks import wait_for

        wait_for(
            lambda: self.popen.poll() is not None or WorkerRecord.objects.filter(pid=self.pid).exists(),
            timeout,
            what=f"worker process {self.pid} to register",
        )
        self.popen.terminate()

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker process {self.pid} did not exit in {timeout} s:\n{self.output()}") from None


@contextmanager
def worker_spawner(
    log_dir: Path, command: Sequence[str], *, settings: str = "tests.settings", env: Mapping[str, str] | None = None
) -> Iterator[Callable[..., WorkerProcess]]:
    """Yield ``start(*options)``, which runs ``command`` + options as a worker on the test database
    (``DATABASE_URL``, ``DJANGO_SETTINGS_MODULE=settings``, and ``env``); kill what is left at the end."""
    started: list[WorkerProcess] = []
    environment = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "DJANGO_SETTINGS_MODULE": settings,
        **(env or {}),
    }

    def start(*options: str) -> WorkerProcess:
        log = log_dir / f"worker-{len(started)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen([*command, *options], cwd=ROOT, env=environment, stdout=out, stderr=out)
        started.append(WorkerProcess(popen, log))
        return started[-1]

    try:
        yield start
    finally:
        for process in started:
            if process.popen.poll() is None:
                process.popen.kill()
                process.popen.wait(30)
