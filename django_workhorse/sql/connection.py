"""How the statements run: on Django's connection (so they join the caller's transaction),
as prepared statements, the first or last of a transaction in the round trip of its BEGIN or
COMMIT, and LISTEN on a connection of its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from psycopg import sql as pgsql
from psycopg.pq import TransactionStatus

from django_workhorse.conf import app_settings


def run(alias: str, statement: str, params: dict[str, Any]) -> int:
    """Run ``statement`` on ``alias``'s connection (in the caller's transaction); return the row count."""
    with open_cursor(alias) as cursor:
        cursor.execute(statement, params)
        return int(cursor.rowcount)


# listen: subscribe a dedicated connection to the channel enqueue notifies on commit.
LISTEN = "LISTEN {channel}"


@contextmanager
def listen(alias: str, channel: str) -> Iterator[psycopg.Connection[Any]]:
    """Open a dedicated autocommit connection (outside Django's) that LISTENs on ``channel``."""
    params = connections[alias].get_connection_params()
    for django_only in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(django_only, None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(pgsql.SQL(LISTEN).format(channel=pgsql.Identifier(channel)))
        yield conn


# ping: does the database answer? A trivial statement that reads no table.
PING = "SELECT 1"


def ping_directly(alias: str, timeout: float) -> None:
    """Run PING on a connection of its own to ``alias``'s database (outside Django's, so any thread
    may ask, and a broken transaction of this thread's connection does not count as an outage);
    raise ``psycopg.Error`` if it does not answer within about ``timeout`` seconds."""
    params = connections[alias].get_connection_params()
    for django_only in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(django_only, None)
    params["connect_timeout"] = max(int(timeout), 1)
    params["options"] = f"{params.get('options', '')} -c statement_timeout={int(timeout * 1000)}".strip()
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(PING).fetchone()


def answers(alias: str, timeout: float) -> bool:
    """Whether ``alias``'s database answers PING within about ``timeout`` seconds (``ping_directly``)."""
    try:
        ping_directly(alias, timeout)
    except psycopg.Error:
        return False
    return True


def constraint_name(exc: BaseException) -> str | None:
    """Return the name of the constraint a database error violated, if PostgreSQL named one."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)


def decode_json(value: Any) -> Any:
    """Decode a jsonb value a raw cursor returned (Django's connections hand jsonb back as text)."""
    return json.loads(value) if isinstance(value, str) else value


def execute(alias: str, statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run ``statement`` on ``alias``'s connection (in the caller's transaction); return its rows."""
    connection = connections[alias]
    if _watched(connection):
        with open_cursor(alias) as wrapped:
            wrapped.execute(statement, params)
            return list(wrapped.fetchall())
    # Nothing watches this connection's statements (no query logging, no execute wrapper): skip
    # Django's per-call cursor wrapper but keep what it guarantees (a live connection in this
    # thread, no use of a broken transaction, Django's database errors), on one prepared-statement
    # cursor kept per connection.
    _ready(connection)
    with connection.wrap_database_errors:
        cursor = _kept_cursor(connection)
        cursor.execute(statement, params)
        return cursor.fetchall()


# execute_last: ends the transaction that atomic() opened, in the round trip of the statement before.
COMMIT = "COMMIT"


def execute_first(alias: str, statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run ``statement`` as the first of the transaction that ``atomic()`` opened on ``alias``: its
    ``BEGIN`` and the statement go to the server in one round trip.

    Where the transaction is already under way (or there is none, or Django logs the connection's
    statements) this is ``execute()``. The ``BEGIN`` carries the connection's isolation level and
    access mode, as psycopg's own would; the block commits or rolls back as usual.
    """
    connection = connections[alias]
    if _logged(connection) or not connection.in_atomic_block:
        return execute(alias, statement, params)
    _ready(connection)
    raw = connection.connection
    if raw.autocommit or raw.info.transaction_status != TransactionStatus.IDLE or not psycopg.Pipeline.is_supported():
        return execute(alias, statement, params)
    with connection.wrap_database_errors:
        # psycopg would send its own BEGIN, alone, before the statement. With autocommit on it sends
        # none, and the explicit BEGIN below opens the transaction; psycopg's commit() and rollback()
        # end it (they act on the server's transaction status), and atomic() turns autocommit back
        # on when it leaves its outermost block.
        raw.autocommit = True
        cursor = _pipeline_cursor(connection)
        with raw.pipeline():
            psycopg.Cursor(raw).execute(_begin_statement(raw))
            cursor.execute(statement, params)
        return cursor.fetchall()


def execute_last(alias: str, statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run ``statement`` as the last of the outermost ``atomic()`` block on ``alias`` and commit the
    block's transaction with it, in one round trip.

    The caller promises that the block ends right after, running nothing more. If the statement
    fails, nothing is committed and its error is raised here, as is a failed ``COMMIT`` (a deferred
    constraint, a serialization failure); the block then rolls back. Django's commit at the end of
    the block finds nothing left to commit and runs the ``on_commit`` callbacks as usual. In a
    nested block, or where Django logs the connection's statements, this is ``execute()``, and the
    block commits as usual.
    """
    connection = connections[alias]
    if _logged(connection) or len(connection.atomic_blocks) != 1:
        return execute(alias, statement, params)
    _ready(connection)
    raw = connection.connection
    if raw.info.transaction_status != TransactionStatus.INTRANS or not psycopg.Pipeline.is_supported():
        return execute(alias, statement, params)
    with connection.wrap_database_errors:
        cursor = _pipeline_cursor(connection)
        with raw.pipeline():
            cursor.execute(statement, params)
            psycopg.Cursor(raw).execute(COMMIT)
        return cursor.fetchall()


def _begin_statement(raw: psycopg.Connection[Any]) -> str:
    """The BEGIN psycopg would send for ``raw``: its isolation level and access mode, if set."""
    parts = ["BEGIN"]
    if raw.isolation_level is not None:
        parts.append("ISOLATION LEVEL " + psycopg.IsolationLevel(raw.isolation_level).name.replace("_", " "))
    if raw.read_only is not None:
        parts.append("READ ONLY" if raw.read_only else "READ WRITE")
    if raw.deferrable is not None:
        parts.append("DEFERRABLE" if raw.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


def _watched(connection: BaseDatabaseWrapper) -> bool:
    """Whether the statements must go through Django's cursor wrapper (query logging, execute
    wrappers), or prepared statements are off."""
    return _logged(connection) or not app_settings.PREPARED_STATEMENTS


def _logged(connection: BaseDatabaseWrapper) -> bool:
    """Whether Django logs or wraps this connection's statements (``DEBUG``, execute wrappers)."""
    return bool(connection.queries_logged or connection.execute_wrappers)


def _pipeline_cursor(connection: BaseDatabaseWrapper) -> psycopg.Cursor[Any]:
    """The cursor a pipeline runs statements on: the kept prepared-statement cursor, or with
    prepared statements off (a pooler that keeps none) one that binds server-side, unprepared."""
    if app_settings.PREPARED_STATEMENTS:
        return _kept_cursor(connection)
    return psycopg.Cursor(connection.connection)


def _ready(connection: BaseDatabaseWrapper) -> None:
    """What Django's cursor wrapper checks before a statement: a live connection of this thread, and
    a transaction that is not broken."""
    connection.ensure_connection()
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()


def _kept_cursor(connection: BaseDatabaseWrapper) -> _PreparedCursor:
    """The prepared-statement cursor of ``connection``'s current psycopg connection.

    Kept on Django's connection object (one per thread), and replaced when Django has opened a new
    psycopg connection, so a closed one is not kept alive. A statement's rows are read before the
    next statement runs.
    """
    raw = connection.connection
    cursor: _PreparedCursor | None = getattr(connection, "_workhorse_cursor", None)
    if cursor is None or cursor.connection is not raw:
        _enable_preparing(raw)
        cursor = _PreparedCursor(raw)
        connection._workhorse_cursor = cursor  # type: ignore[attr-defined]
    return cursor


def _enable_preparing(raw: psycopg.Connection[Any]) -> None:
    if raw.prepare_threshold is None:
        # Django disables preparing by default; a threshold this high prepares only what asks for
        # it explicitly, as _PreparedCursor does.
        raw.prepare_threshold = 2**31 - 1


class _PreparedCursor(psycopg.Cursor[Any]):
    """A server-side-binding cursor that always uses a prepared statement.

    The enqueue statements are large CTEs whose planning costs more than running them; preparing
    them once per connection roughly halves the time of an enqueue.
    """

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
    ) -> Any:
        return super().execute(query, params, prepare=True, binary=binary)


def open_cursor(alias: str) -> CursorWrapper:
    """Return a Django cursor wrapper (query logging, execute wrappers, error translation) for ``alias``.

    With WORKHORSE_PREPARED_STATEMENTS it wraps a prepared-statement cursor over Django's own
    connection, so the statement still joins the caller's transaction.
    """
    connection = connections[alias]
    if not app_settings.PREPARED_STATEMENTS:
        return connection.cursor()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        _enable_preparing(connection.connection)
        raw = _PreparedCursor(connection.connection)
    return cast(CursorWrapper, connection._prepare_cursor(raw))  # type: ignore[attr-defined]
