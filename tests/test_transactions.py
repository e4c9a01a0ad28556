"""Enqueue joins the caller's transaction: visibility, rollback, savepoints, NOTIFY at commit."""

from __future__ import annotations

import gc
import threading
import weakref
from datetime import timedelta

import psycopg
import pytest
from django.db import DatabaseError, OperationalError, connection, transaction
from django.db.transaction import TransactionManagementError

from django_workhorse import (
    EnqueueIdempotencyConflictError,
    EnqueueOutcome,
    EnqueueResult,
    Idempotency,
    enqueue,
    enqueue_with_result,
)
from django_workhorse.models import IdempotencyBinding, Job
from tests.conftest import count_rows

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])

KEY = Idempotency("order:42", scope="orders")


class RollbackError(Exception):
    pass


def test_enqueue_is_invisible_to_others_until_commit_and_notifies_only_then(other_connection, listener):
    with transaction.atomic():
        job_id = enqueue("t", {"n": 1}, queue="mail", idempotency=KEY)
        assert count_rows(other_connection)["workhorse_job"] == 0
        assert count_rows(other_connection)["workhorse_binding"] == 0
        assert listener(0.2) == []
    assert other_connection.execute("SELECT id FROM workhorse_job").fetchall() == [(job_id,)]
    assert listener(5, 1) == ["mail"]


def test_enqueue_outside_a_transaction_commits_on_its_own(other_connection, listener):
    job_id = enqueue("t", {"n": 1})
    assert other_connection.execute("SELECT id FROM workhorse_job").fetchall() == [(job_id,)]
    assert listener(5, 1) == ["default"]


def test_enqueue_notifies_once_per_queue_and_not_for_scheduled_work(listener):
    with transaction.atomic():
        enqueue("t", {"n": 1}, queue="a")
        enqueue("t", {"n": 2}, queue="a")
        enqueue("t", {"n": 3}, queue="later", delay=timedelta(hours=1))
    assert listener(5, 1) == ["a"]
    assert listener(0.2) == []


def test_enqueue_replay_does_not_notify(listener):
    enqueue("t", {"n": 1}, idempotency=KEY)
    assert listener(5, 1) == ["default"]
    assert enqueue_with_result("t", {"n": 1}, idempotency=KEY).outcome == EnqueueOutcome.REPLAYED
    assert listener(0.2) == []


def test_caller_rollback_removes_job_binding_and_events_and_sends_nothing(other_connection, listener):
    with pytest.raises(RollbackError), transaction.atomic():
        enqueue("t", {"n": 1}, idempotency=KEY)
        raise RollbackError
    assert count_rows(other_connection) == {"workhorse_job": 0, "workhorse_binding": 0, "workhorse_job_event": 0}
    assert listener(0.2) == []
    # The key is free again.
    assert enqueue_with_result("t", {"n": 1}, idempotency=KEY).outcome == EnqueueOutcome.ACCEPTED


def test_caught_conflict_leaves_the_callers_transaction_usable(other_connection):
    owner = enqueue("t", {"n": 1}, idempotency=KEY)
    with transaction.atomic():
        fresh = enqueue("t", {"n": 2})
        with pytest.raises(EnqueueIdempotencyConflictError):
            enqueue("t", {"n": 99}, idempotency=KEY)
        # The transaction still works: queries run and the earlier write commits.
        assert Job.objects.filter(pk=fresh).exists()
        later = enqueue("t", {"n": 3})
    ids = {row[0] for row in other_connection.execute("SELECT id FROM workhorse_job")}
    assert ids == {owner, fresh, later}


def test_enqueue_uses_the_given_database_alias():
    job_id = enqueue("t", {"n": 1}, idempotency=KEY, using="other")
    assert Job.objects.using("other").filter(pk=job_id).exists()
    assert not Job.objects.using("default").exists()
    assert IdempotencyBinding.objects.using("other").count() == 1


def test_single_enqueue_is_one_query(django_assert_num_queries):
    with django_assert_num_queries(1):
        enqueue("t", {"n": 1}, idempotency=KEY)
    with django_assert_num_queries(1):
        enqueue("t", {"n": 1}, idempotency=KEY)
    with django_assert_num_queries(1):
        enqueue("t", {"n": 1})


@pytest.fixture(autouse=True)
def _close_connections():
    yield
    connection.close()


def test_repeatable_read_producer_gets_a_serialization_failure_for_a_key_committed_after_its_snapshot():
    def commit_elsewhere() -> None:
        try:
            enqueue("t", {"n": 1}, idempotency=KEY)
        finally:
            connection.close()

    with pytest.raises(OperationalError) as caught, transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SELECT 1")  # takes the snapshot
        other = threading.Thread(target=commit_elsewhere)
        other.start()
        other.join(30)
        enqueue("t", {"n": 1}, idempotency=KEY)
    assert isinstance(caught.value.__cause__, psycopg.errors.SerializationFailure)
    assert Job.objects.count() == 1


def test_an_execute_wrapper_sees_every_enqueue_statement():
    seen: list[str] = []

    def watch(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(watch):
        enqueue("t", {"n": 1}, idempotency=KEY)
        enqueue("t", {"n": 1}, idempotency=KEY)
        enqueue("t", {"n": 2})
    assert len(seen) == 3 and "workhorse_enqueue_one" in seen[0]


def test_enqueue_in_a_broken_transaction_is_refused_as_django_refuses_any_query():
    with transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(savepoint=False), connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")  # marks the outer block for rollback, as Django does
        with pytest.raises(TransactionManagementError):
            enqueue("t", {"n": 1}, idempotency=KEY)
        with pytest.raises(TransactionManagementError):
            enqueue("t", {"n": 1})
    assert enqueue_with_result("t", {"n": 1}, idempotency=KEY).outcome == EnqueueOutcome.ACCEPTED


def test_enqueue_after_the_connection_was_closed_opens_a_new_one():
    first = enqueue("t", {"n": 1}, idempotency=KEY)
    connection.close()
    assert enqueue_with_result("t", {"n": 1}, idempotency=KEY) == EnqueueResult(first, EnqueueOutcome.REPLAYED)


def test_enqueue_keeps_no_closed_connection_alive():
    enqueue("t", {"n": 1}, idempotency=KEY)
    closed = weakref.ref(connection.connection)
    connection.close()
    enqueue("t", {"n": 2})
    gc.collect()
    assert closed() is None
