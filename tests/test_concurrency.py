"""Racing producers on real concurrent connections: the unique constraint decides."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_workhorse import (
    EnqueueIdempotencyConflictError,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    EnqueueResult,
    Idempotency,
    enqueue_many,
    enqueue_with_result,
)
from django_workhorse.models import IdempotencyBinding, Job
from tests.conftest import connect_directly, race

pytestmark = pytest.mark.django_db(transaction=True)

KEY = Idempotency("webhook:evt_1", scope="webhooks")


def test_sixteen_racing_producers_create_one_job():
    results = race(16, lambda i: enqueue_with_result("t", {"event": "evt_1"}, idempotency=KEY))

    assert all(isinstance(r, EnqueueResult) for r in results), results
    outcomes = sorted(r.outcome for r in results)
    assert outcomes == [EnqueueOutcome.ACCEPTED] + [EnqueueOutcome.REPLAYED] * 15
    assert len({r.job_id for r in results}) == 1
    assert Job.objects.count() == 1 and IdempotencyBinding.objects.count() == 1


def test_eight_racing_producers_with_different_payloads_give_one_job_and_seven_conflicts():
    results = race(8, lambda i: enqueue_with_result("t", {"variant": i}, idempotency=KEY))

    accepted = [r for r in results if isinstance(r, EnqueueResult)]
    conflicts = [r for r in results if isinstance(r, EnqueueIdempotencyConflictError)]
    assert len(accepted) == 1 and len(conflicts) == 7, results
    assert accepted[0].outcome == EnqueueOutcome.ACCEPTED
    assert {c.job_id for c in conflicts} == {accepted[0].job_id}
    assert all(c.conflicting_fields == ("payload",) for c in conflicts)
    assert Job.objects.count() == 1


def test_reversed_overlapping_batches_do_not_deadlock():
    keys = [f"k{i:03d}" for i in range(200)]

    def batch(i: int) -> list[EnqueueResult]:
        order = keys if i % 2 == 0 else list(reversed(keys))
        requests = [EnqueueRequest("t", {"k": k}, EnqueueOptions(idempotency=Idempotency(k))) for k in order]
        with transaction.atomic():
            return enqueue_many(requests)

    for _ in range(3):
        results = race(4, batch)
        assert all(isinstance(r, list) for r in results), results
    assert Job.objects.count() == 200
    ids_by_key = {}
    for i, result in enumerate(results):
        order = keys if i % 2 == 0 else list(reversed(keys))
        for key, entry in zip(order, result, strict=True):
            assert ids_by_key.setdefault(key, entry.job_id) == entry.job_id


def test_waiting_producer_gets_the_key_when_the_holder_rolls_back():
    holder_has_key = threading.Event()
    release_holder = threading.Event()

    class AbortError(Exception):
        pass

    def holder() -> None:
        try:
            with transaction.atomic():
                enqueue_with_result("t", {"n": 1}, idempotency=KEY)
                holder_has_key.set()
                assert release_holder.wait(30)
                raise AbortError
        except AbortError:
            pass

    def waiter() -> EnqueueResult:
        assert holder_has_key.wait(30)
        return enqueue_with_result("t", {"n": 1}, idempotency=KEY)

    def run(i: int):
        return holder() if i == 0 else waiter()

    outcome: list = []
    racer = threading.Thread(target=lambda: outcome.extend(race(2, run)))
    racer.start()
    _wait_until_a_session_waits_on_a_lock()
    release_holder.set()
    racer.join(60)

    result = outcome[1]
    assert isinstance(result, EnqueueResult), outcome
    assert result.outcome == EnqueueOutcome.ACCEPTED
    assert list(Job.objects.values_list("id", flat=True)) == [result.job_id]
    assert IdempotencyBinding.objects.get().job_id == result.job_id


def test_waiting_producer_replays_when_the_holder_commits_in_its_one_round_trip():
    """After ON CONFLICT waited, the enqueue function looks the key up again: no second statement."""
    holder_has_key = threading.Event()
    release_holder = threading.Event()
    statements: list[int] = []

    def run(i: int) -> EnqueueResult:
        if i == 0:
            with transaction.atomic():
                result = enqueue_with_result("t", {"n": 1}, idempotency=KEY)
                holder_has_key.set()
                assert release_holder.wait(30)
            return result
        assert holder_has_key.wait(30)
        with CaptureQueriesContext(connection) as queries:
            result = enqueue_with_result("t", {"n": 1}, idempotency=KEY)
        statements.append(len(queries))
        return result

    outcome: list = []
    racer = threading.Thread(target=lambda: outcome.extend(race(2, run)))
    racer.start()
    _wait_until_a_session_waits_on_a_lock()
    release_holder.set()
    racer.join(60)

    first, second = outcome
    assert (first.outcome, second.outcome) == (EnqueueOutcome.ACCEPTED, EnqueueOutcome.REPLAYED), outcome
    assert first.job_id == second.job_id and Job.objects.count() == 1
    assert statements == [1]


def _wait_until_a_session_waits_on_a_lock(deadline: float = 30) -> None:
    """Poll pg_stat_activity until some session of this database waits on a lock."""
    with connect_directly() as conn:
        until = time.monotonic() + deadline
        while time.monotonic() < until:
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()[0]
            if waiting:
                return
            time.sleep(0.01)
    raise AssertionError("no session started waiting on the key in time")


def test_racing_producers_take_over_an_expired_key_once():
    old = enqueue_with_result("t", {"n": 1}, idempotency=KEY).job_id
    IdempotencyBinding.objects.update(expires_at=datetime(2000, 1, 1, tzinfo=timezone.utc))

    results = race(8, lambda i: enqueue_with_result("t", {"n": 1}, idempotency=KEY))

    assert all(isinstance(r, EnqueueResult) for r in results), results
    assert sorted(r.outcome for r in results) == [EnqueueOutcome.ACCEPTED] + [EnqueueOutcome.REPLAYED] * 7
    new = {r.job_id for r in results}
    assert len(new) == 1 and old not in new
    assert Job.objects.count() == 2 and IdempotencyBinding.objects.get().job_id in new
