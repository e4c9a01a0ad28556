"""enqueue_many: one round trip, input order, in-batch duplicates, whole-batch rollback."""

from __future__ import annotations

import pytest

from django_workhorse import (
    EnqueueIdempotencyConflictError,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    Idempotency,
    enqueue,
    enqueue_many,
)
from django_workhorse.models import Job, JobEvent
from tests.conftest import count_rows

pytestmark = pytest.mark.django_db


def keyed(key: str, payload: dict | None = None) -> EnqueueRequest:
    return EnqueueRequest("t", payload or {"k": key}, EnqueueOptions(idempotency=Idempotency(key)))


def test_enqueue_many_returns_results_in_input_order():
    results = enqueue_many([EnqueueRequest("t", {"i": i}, EnqueueOptions(priority=i)) for i in range(5)])
    assert [Job.objects.get(pk=r.job_id).payload["i"] for r in results] == [0, 1, 2, 3, 4]
    assert all(r.outcome == EnqueueOutcome.ACCEPTED for r in results)
    assert not JobEvent.objects.exists()  # the job rows record their enqueue (decision 0013)


def test_enqueue_many_without_keys_is_one_query(django_assert_num_queries):
    with django_assert_num_queries(1):
        enqueue_many([EnqueueRequest("t", {"i": i}) for i in range(100)])
    assert Job.objects.count() == 100


def test_enqueue_many_maps_a_repeated_key_to_one_job():
    results = enqueue_many([keyed("a"), keyed("b"), keyed("a")])
    assert [r.outcome for r in results] == [EnqueueOutcome.ACCEPTED, EnqueueOutcome.ACCEPTED, EnqueueOutcome.REPLAYED]
    assert results[0].job_id == results[2].job_id != results[1].job_id
    assert Job.objects.count() == 2


def test_enqueue_many_replays_keys_accepted_before():
    existing = enqueue("t", {"k": "b"}, idempotency=Idempotency("b"))
    results = enqueue_many([keyed("a"), keyed("b")])
    assert results[1].job_id == existing and results[1].outcome == EnqueueOutcome.REPLAYED
    assert results[0].outcome == EnqueueOutcome.ACCEPTED


def test_enqueue_many_conflict_rolls_back_the_whole_batch_and_names_the_ordinal():
    owner = enqueue("t", {"k": "c"}, idempotency=Idempotency("c"))
    before = count_rows()
    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue_many([keyed("a"), keyed("b"), keyed("c", {"changed": True})])
    assert (caught.value.ordinal, caught.value.job_id, caught.value.conflicting_fields) == (2, owner, ("payload",))
    assert count_rows() == before


def test_enqueue_many_conflict_inside_the_batch_names_the_later_ordinal():
    before = count_rows()
    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue_many([keyed("a"), keyed("b"), keyed("a", {"changed": True})])
    assert caught.value.ordinal == 2 and caught.value.conflicting_fields == ("payload",)
    assert count_rows() == before


def test_enqueue_many_conflict_between_two_rows_of_one_key_writes_nothing():
    before = count_rows()
    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue_many([keyed("a"), keyed("a", {"changed": True})])
    assert caught.value.ordinal == 1
    assert count_rows() == before


def test_enqueue_many_mixes_keyed_and_unkeyed_rows():
    results = enqueue_many([EnqueueRequest("t", {"i": 0}), keyed("a"), EnqueueRequest("t", {"i": 2})])
    assert len({r.job_id for r in results}) == 3
    assert Job.objects.count() == 3


def test_enqueue_many_of_nothing_returns_nothing(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert enqueue_many([]) == []
