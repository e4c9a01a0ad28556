"""A transaction's first statement travels with its BEGIN, its last with its COMMIT.

``sql.connection.execute_first`` and ``execute_last`` (what ``@idempotent`` uses for its claim and
its record) save the round trips of psycopg's lone BEGIN and Django's lone COMMIT. These tests read
the protocol itself (libpq's trace of the connection: each round trip ends in one ReadyForQuery)
and what other sessions see, and check that atomic()'s rules hold as they do without the saving:
rollback, nested blocks, on_commit, a COMMIT that fails, isolation levels, query logging.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import Group, User
from django.db import IntegrityError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from psycopg import pq

from django_workhorse.sql.connection import execute, execute_first, execute_last

pytestmark = pytest.mark.django_db(transaction=True)

INSERT_GROUP = "INSERT INTO auth_group (name) VALUES (%(name)s) RETURNING id"


@contextmanager
def protocol_trace() -> Iterator[list[str]]:
    """Trace the messages of Django's connection; the list yielded holds them when the block ends."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace"
        with path.open("w") as file:
            pgconn.trace(file.fileno())
            pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                yield lines
            finally:
                pgconn.untrace()  # flushes what libpq wrote
        lines.extend(path.read_text().splitlines())


def prepare_insert() -> None:
    """Prepare INSERT_GROUP on this connection (its first use takes a round trip of its own: Parse;
    psycopg forgets what it prepared in a transaction that rolls back)."""
    execute("default", INSERT_GROUP, {"name": "prepared"})
    Group.objects.filter(name="prepared").delete()


def round_trips(lines: list[str]) -> int:
    return sum(1 for line in lines if line.startswith("B\t") and "ReadyForQuery" in line)


def sent(lines: list[str], text: str) -> int:
    return sum(1 for line in lines if line.startswith("F\t") and text in line)


def group_names(conn: psycopg.Connection[Any]) -> list[str]:
    return [row[0] for row in conn.execute("SELECT name FROM auth_group ORDER BY name")]


def test_the_first_statement_of_a_transaction_travels_with_its_begin_and_the_last_with_its_commit(
    other_connection,
):
    prepare_insert()
    with protocol_trace() as lines, transaction.atomic():
        execute_first("default", INSERT_GROUP, {"name": "first"})
        execute("default", INSERT_GROUP, {"name": "middle"})
        execute_last("default", INSERT_GROUP, {"name": "last"})
        # Committed already, with the last statement: another session sees all three rows.
        assert group_names(other_connection) == ["first", "last", "middle"]
    assert round_trips(lines) == 3
    assert (sent(lines, '"BEGIN"'), sent(lines, '"COMMIT"')) == (1, 1)


@override_settings(WORKHORSE_PREPARED_STATEMENTS=False)
def test_with_prepared_statements_off_they_travel_the_same_way(other_connection):
    # Through a pooler that keeps no prepared statements: unnamed statements, bound server-side.
    with protocol_trace() as lines, transaction.atomic():
        execute_first("default", INSERT_GROUP, {"name": "first"})
        execute_last("default", INSERT_GROUP, {"name": "last"})
        assert group_names(other_connection) == ["first", "last"]
    assert round_trips(lines) == 2
    assert sent(lines, '"_pg3_') == 0  # nothing prepared


def test_without_them_the_same_transaction_takes_two_more_round_trips():
    prepare_insert()
    with protocol_trace() as lines, transaction.atomic():
        for name in ("first", "middle", "last"):
            execute("default", INSERT_GROUP, {"name": name})
    assert round_trips(lines) == 5  # BEGIN alone, three statements, COMMIT alone


def test_the_first_statement_runs_in_the_transaction_so_a_rollback_undoes_it():
    with transaction.atomic():
        execute_first("default", INSERT_GROUP, {"name": "undone"})
        transaction.set_rollback(True)
    assert not Group.objects.exists()
    assert connection.get_autocommit() and connection.connection.autocommit
    Group.objects.create(name="after")  # the connection is usable, in autocommit again
    assert list(Group.objects.values_list("name", flat=True)) == ["after"]


def test_an_error_in_the_first_statement_rolls_the_block_back_and_leaves_the_connection_usable():
    Group.objects.create(name="taken")
    with pytest.raises(IntegrityError), transaction.atomic():
        execute_first("default", INSERT_GROUP, {"name": "taken"})
    assert connection.get_autocommit() and connection.connection.autocommit
    assert connection.connection.info.transaction_status == pq.TransactionStatus.IDLE
    assert list(Group.objects.values_list("name", flat=True)) == ["taken"]


def test_once_the_transaction_is_under_way_the_first_statement_is_an_ordinary_one():
    prepare_insert()
    with protocol_trace() as lines, transaction.atomic():
        execute("default", INSERT_GROUP, {"name": "a"})
        execute_first("default", INSERT_GROUP, {"name": "b"})
    assert round_trips(lines) == 4  # psycopg's BEGIN, "a", "b", COMMIT
    assert sent(lines, "BEGIN") == 1


def test_outside_atomic_the_first_statement_runs_in_autocommit(other_connection):
    execute_first("default", INSERT_GROUP, {"name": "alone"})
    assert group_names(other_connection) == ["alone"]
    assert connection.connection.info.transaction_status == pq.TransactionStatus.IDLE


@pytest.mark.parametrize(
    ("attribute", "value", "setting", "shown"),
    [
        ("isolation_level", psycopg.IsolationLevel.SERIALIZABLE, "transaction_isolation", "serializable"),
        ("isolation_level", psycopg.IsolationLevel.REPEATABLE_READ, "transaction_isolation", "repeatable read"),
        ("isolation_level", None, "transaction_isolation", "read committed"),
        ("read_only", True, "transaction_read_only", "on"),
        ("deferrable", True, "transaction_deferrable", "on"),
    ],
)
def test_the_begin_carries_the_connections_isolation_level_and_access_mode(attribute, value, setting, shown):
    connection.ensure_connection()
    raw = connection.connection
    setattr(raw, attribute, value)
    try:
        with transaction.atomic():
            rows = execute_first("default", "SELECT current_setting(%(setting)s)", {"setting": setting})
    finally:
        setattr(raw, attribute, None)
    assert rows == [(shown,)]


def test_the_last_statement_commits_and_on_commit_callbacks_run_once_after_it(other_connection):
    seen: list[list[str]] = []
    with transaction.atomic():
        execute_first("default", INSERT_GROUP, {"name": "a"})
        transaction.on_commit(lambda: seen.append(group_names(other_connection)))
        execute_last("default", INSERT_GROUP, {"name": "b"})
        assert seen == []  # committed, but the callbacks wait for the block to end, as always
    assert seen == [["a", "b"]]


def test_a_commit_that_fails_raises_from_the_last_statement_and_commits_nothing(other_connection):
    seen: list[str] = []
    with pytest.raises(IntegrityError), transaction.atomic():
        execute_first("default", INSERT_GROUP, {"name": "a"})
        transaction.on_commit(lambda: seen.append("committed"))
        # A foreign key Django declares DEFERRABLE INITIALLY DEFERRED: checked by the COMMIT.
        User.groups.through.objects.create(user_id=10**9, group_id=10**9)
        execute_last("default", INSERT_GROUP, {"name": "b"})
    assert (group_names(other_connection), seen) == ([], [])
    assert connection.connection.info.transaction_status == pq.TransactionStatus.IDLE
    Group.objects.create(name="after")
    assert group_names(other_connection) == ["after"]


def test_an_error_in_the_last_statement_commits_nothing(other_connection):
    Group.objects.create(name="taken")
    with pytest.raises(IntegrityError), transaction.atomic():
        execute_first("default", INSERT_GROUP, {"name": "a"})
        execute_last("default", INSERT_GROUP, {"name": "taken"})
    assert group_names(other_connection) == ["taken"]


def test_in_a_nested_block_the_last_statement_leaves_the_commit_to_the_outermost(other_connection):
    with transaction.atomic():
        execute_first("default", INSERT_GROUP, {"name": "outer"})
        with transaction.atomic():
            execute_last("default", INSERT_GROUP, {"name": "inner"})
        assert group_names(other_connection) == []
        execute("default", INSERT_GROUP, {"name": "after"})
    assert group_names(other_connection) == ["after", "inner", "outer"]


def test_with_query_logging_both_are_ordinary_statements_that_django_logs(other_connection):
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        execute_first("default", INSERT_GROUP, {"name": "a"})
        execute_last("default", INSERT_GROUP, {"name": "b"})
        assert group_names(other_connection) == []  # not committed yet: Django's COMMIT does it
    # Django logs its own BEGIN and COMMIT, each a statement of its own, around the two.
    logged = [query["sql"] for query in queries.captured_queries]
    assert (len(logged), logged[0], logged[-1]) == (4, "BEGIN", "COMMIT")
    # Django 5.2 logs a statement bound server-side without its text (None); later versions show it.
    assert all(sql is None or "INSERT INTO auth_group" in sql for sql in logged[1:3])
    assert group_names(other_connection) == ["a", "b"]
