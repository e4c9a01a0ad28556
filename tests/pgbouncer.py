"""A real PgBouncer in transaction pooling mode in front of the test database, for the tests.

``PgBouncer.start`` writes an ini file into a new temporary directory, starts Debian's ``pgbouncer``
on a free loopback port in the foreground (its log in that directory) and waits until a query
goes through it. Two pooler databases lead to the test database:

- ``<name>``, a pool of ``POOL_SIZE`` server connections: the "pooled" Django alias;
- ``<name>_single``, a pool of one server connection: every client of it shares one server
  session, which shows what session state (an advisory lock, a ``SET``) means behind a pooler.

The "pooled" alias in ``tests/settings.py`` reaches the pooler at ``WORKHORSE_TEST_PGBOUNCER``
(``host:port``) when a worker subprocess is given one; in the test process the ``pgbouncer``
fixture fills it in. ``EverythingThroughThePooler`` is a database router for the tests that run
the admin through it.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

POOLER_ENV = "WORKHORSE_TEST_PGBOUNCER"
# CI sets it: a missing pgbouncer fails the suite there instead of skipping its tests.
REQUIRE_ENV = "WORKHORSE_REQUIRE_PGBOUNCER"
POOLED = "pooled"
POOLED_SINGLE = "pooled_single"
POOL_SIZE = 20
PREPARED_STATEMENTS_SINCE = (1, 21)
SINGLE_SUFFIX = "_single"
# The pooler's address until the fixture starts one: nothing listens there.
UNSTARTED = ("127.0.0.1", "1")
# PgBouncer refuses to run as root; "nobody" runs it then (or the owner of the server's socket directory).
UNPRIVILEGED_USER = "nobody"


def pooled_databases(direct: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The "pooled" and "pooled_single" aliases: ``direct``'s database, through the pooler.

    Both mirror "default" in tests (no test database of their own). Django's
    DISABLE_SERVER_SIDE_CURSORS is what an alias behind a transaction pooler needs (and what tells
    django-workhorse that its sessions do not last).
    """
    host, port = os.environ.get(POOLER_ENV, ":".join(UNSTARTED)).rsplit(":", 1)
    pooled = {
        **direct,
        "HOST": host,
        "PORT": port,
        "DISABLE_SERVER_SIDE_CURSORS": True,
        "TEST": {"MIRROR": "default"},
    }
    return {POOLED: pooled, POOLED_SINGLE: {**pooled, "NAME": direct["NAME"] + SINGLE_SUFFIX}}


def binary() -> str | None:
    """The pgbouncer executable, if installed (Debian puts it in /usr/sbin)."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")


def version(executable: str) -> tuple[int, ...]:
    """PgBouncer's version, from ``pgbouncer --version`` ("PgBouncer 1.18.0")."""
    out = subprocess.run([executable, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"PgBouncer (\d+)\.(\d+)(?:\.(\d+))?", out)
    if match is None:
        raise RuntimeError(f"cannot read the version of {executable}: {out!r}")
    return tuple(int(part) for part in match.groups(default="0"))


class PgBouncerError(RuntimeError):
    """PgBouncer did not start, with its log."""


class PgBouncer:
    """One pgbouncer process in transaction pooling mode; ``stop`` ends it and removes its files."""

    def __init__(
        self, executable: str, directory: Path, popen: subprocess.Popen[bytes], port: int, version: tuple[int, ...]
    ) -> None:
        self.executable = executable
        self.version = version
        # PgBouncer 1.21+ keeps protocol-level prepared statements (max_prepared_statements, set below).
        self.keeps_prepared_statements = version >= PREPARED_STATEMENTS_SINCE
        self.directory = directory
        self.popen = popen
        self.host = "127.0.0.1"
        self.port = port

    @classmethod
    def start(cls, executable: str, *, database: dict[str, Any], timeout: float = 30) -> PgBouncer:
        """Start a pooler in front of ``database`` (a Django settings dict naming the real server)."""
        found = version(executable)
        directory = Path(tempfile.mkdtemp(prefix="workhorse-pgbouncer-"))
        directory.chmod(0o755)  # readable by the unprivileged user it may run as
        last_error: PgBouncerError | None = None
        for _ in range(3):  # the free port may be taken between choosing and binding it
            port = _free_port()
            ini = directory / "pgbouncer.ini"
            _write(ini, _ini(database, port, directory / "users.txt", found))
            _write(directory / "users.txt", f'"{database["USER"] or "postgres"}" ""\n')
            log = directory / "pgbouncer.log"
            command = [executable, str(ini)]
            if os.geteuid() == 0:
                command[1:1] = ["-u", _unprivileged_user(database)]
            with log.open("wb") as out:
                popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            pooler = cls(executable, directory, popen, port, found)
            try:
                pooler._wait_until_serving(database["NAME"], database["USER"] or "postgres", timeout)
            except PgBouncerError as exc:
                pooler._end_process()
                last_error = exc
                continue
            return pooler
        shutil.rmtree(directory, ignore_errors=True)
        assert last_error is not None
        raise last_error

    def url(self, dbname: str, user: str) -> str:
        """A postgres:// URL of ``dbname`` through this pooler."""
        return f"postgres://{user}@{self.host}:{self.port}/{dbname}"

    def connect(self, dbname: str, user: str, **options: Any) -> psycopg.Connection[Any]:
        """A psycopg connection (autocommit unless told) through this pooler."""
        options.setdefault("autocommit", True)
        return psycopg.connect(host=self.host, port=self.port, dbname=dbname, user=user, **options)

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        self._end_process()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _end_process(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(30)

    def _wait_until_serving(self, dbname: str, user: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise PgBouncerError(f"pgbouncer exited with {self.popen.returncode}:\n{self.log()}")
            try:
                with self.connect(dbname, user, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() >= deadline:
                    raise PgBouncerError(f"pgbouncer did not serve within {timeout} s: {exc}\n{self.log()}") from exc
            # Polling a process that is starting: there is nothing to wait on but the port.
            time.sleep(0.05)


def _ini(database: dict[str, Any], port: int, auth_file: Path, found: tuple[int, ...]) -> str:
    server = f"host={database['HOST'] or 'localhost'} port={database['PORT'] or 5432}"
    if database.get("PASSWORD"):
        server += f" password={database['PASSWORD']}"
    name = database["NAME"]
    return f"""\
[databases]
{name} = {server} dbname={name}
{name}{SINGLE_SUFFIX} = {server} dbname={name} pool_size=1

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {auth_file}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 500
server_reset_query =
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
""" + ("max_prepared_statements = 200\n" if found >= PREPARED_STATEMENTS_SINCE else "")


def _unprivileged_user(database: dict[str, Any]) -> str:
    """Whom pgbouncer runs as under root: the owner of the server's socket directory, or nobody."""
    host = database["HOST"] or ""
    if host.startswith("/") and os.path.isdir(host):
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    return UNPRIVILEGED_USER


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o644)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class EverythingThroughThePooler:
    """A database router sending every read and write to the "pooled" alias (the admin tests)."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return POOLED

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return POOLED

    def allow_relation(self, *objects: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, *args: Any, **hints: Any) -> bool | None:
        return None
