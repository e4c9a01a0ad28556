"""Whether a database alias is reached through a connection pooler that forwards prepared
statements to the server as they are (the probe of check ``workhorse.W001``).

PgBouncer before 1.21, or 1.21+ without ``max_prepared_statements``, hands a protocol-level
prepared statement to whichever server connection runs it: the next transaction may meet another
server that does not know it, or one that already has one of that name. PgBouncer 1.21+ that keeps
them renames them on the server (``PGBOUNCER_<n>``).
"""

from __future__ import annotations

import logging
import uuid

import psycopg
from django.db import connections
from psycopg import pq
from psycopg import sql as pgsql

logger = logging.getLogger(__name__)

# How long the probe waits for a connection (unless the alias's OPTIONS say).
CONNECT_TIMEOUT = 10

# check_prepared_statements: a protocol-level prepared statement whose text holds its (unique)
# name, then whether the server knows it by that name, in one transaction (so on one server
# connection, even behind a transaction pooler), and the server's process id.
PROBE_STATEMENT = "SELECT '{name}'::text"
KEPT_AS_NAMED = """
SELECT pg_backend_pid(), coalesce(bool_or(name = %(name)s), false)
FROM pg_prepared_statements WHERE statement = %(statement)s
"""
DEALLOCATE = "DEALLOCATE {name}"


def forwards_prepared_statements(alias: str) -> bool:
    """Whether ``alias`` goes through a pooler that hands a prepared statement to the server as it is."""
    params = connections[alias].get_connection_params()
    for django_only in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(django_only, None)
    params.setdefault("connect_timeout", CONNECT_TIMEOUT)
    name = f"workhorse_check_{uuid.uuid4().hex}"
    statement = PROBE_STATEMENT.format(name=name)
    try:
        with psycopg.connect(**params, autocommit=True) as conn, conn.transaction():
            prepared = conn.pgconn.prepare(name.encode(), statement.encode())
            if prepared.status != pq.ExecStatus.COMMAND_OK:
                return False
            row = conn.execute(KEPT_AS_NAMED, {"name": name, "statement": statement}).fetchone()
            assert row is not None
            server_pid, kept_as_named = row
            if kept_as_named:  # handed over as it is: deallocate it where it is
                conn.execute(pgsql.SQL(DEALLOCATE).format(name=pgsql.Identifier(name)))
            pooled = conn.info.backend_pid != server_pid
    except psycopg.Error:  # unreachable: the database checks (and the command itself) say so
        logger.debug("workhorse.W001 not checked: database %r cannot be reached", alias, exc_info=True)
        return False
    return bool(pooled and kept_as_named)
