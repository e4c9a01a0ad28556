"""The worker's own threads keep their connections whatever CONN_MAX_AGE says; handler threads
follow Django's per-request rule (the test settings keep Django's default, ``CONN_MAX_AGE = 0``)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections
from django.db.backends.signals import connection_created

from django_workhorse import enqueue
from django_workhorse.models import Job, JobStatus
from django_workhorse.tasks.registry import register
from tests.worker_tasks import run_worker

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 20


@register("tests.connections.query")
def query(payload: Any) -> int:
    return Job.objects.count()


@contextmanager
def connections_opened() -> Iterator[Counter[str]]:
    """Count the connections opened within the block, by the name of the thread that opened them."""
    opened: Counter[str] = Counter()

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened[threading.current_thread().name] += 1

    connection_created.connect(count)
    try:
        yield opened
    finally:
        connection_created.disconnect(count)


def test_the_claim_loop_and_the_recorder_keep_one_connection_each_over_many_jobs():
    assert connection.settings_dict["CONN_MAX_AGE"] == 0
    for n in range(JOBS):
        enqueue("tests.connections.query", {"n": n})

    with connections_opened() as opened:
        # One job per claim and per write: each round would open a connection under the rule for requests.
        run_worker(concurrency=1, batch=1)

    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == JOBS
    assert opened["test-worker"] == 1  # the claim loop
    assert opened["workhorse-recorder"] == 1
    # A handler's thread still starts each job on a fresh connection, as Django starts each request.
    assert opened["workhorse-executor-0"] == JOBS


def test_a_broken_connection_of_the_claim_loop_is_still_replaced():
    from django_workhorse.worker.own_connections import close_broken_connections

    seen: dict[str, Any] = {}

    def claim_thread() -> None:
        own = connections["default"]
        own.ensure_connection()
        first = own.connection
        own.errors_occurred = True
        first.close()  # the server went away under it
        close_broken_connections()
        seen["closed"] = own.connection is None
        own.ensure_connection()
        seen["replaced"] = own.connection is not first
        close_broken_connections()
        seen["kept"] = own.connection is not None
        own.close()

    thread = threading.Thread(target=claim_thread)
    thread.start()
    thread.join(30)
    assert seen == {"closed": True, "replaced": True, "kept": True}
