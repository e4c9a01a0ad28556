"""The faster batch paths keep every guarantee: input order, stored values, NOTIFY per ready queue,
all-or-nothing, and options checked once per batch only when they are the same values of the same types."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import transaction

from django_workhorse import (
    EnqueueIdempotencyConflictError,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    EnqueueValidationError,
    Idempotency,
    enqueue_many,
)
from django_workhorse.enqueueing.fingerprints import canonical_json, request_digest
from django_workhorse.enqueueing.validation import prepare
from django_workhorse.models import IdempotencyBinding, Job, JobEvent
from django_workhorse.tasks.retry import RetryPolicy

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_batch_of_1000_without_keys_returns_ids_and_results_in_input_order():
    results = enqueue_many([EnqueueRequest("t", {"i": i}, EnqueueOptions(priority=i % 101)) for i in range(1000)])

    ids = [r.job_id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == 1000
    assert all(r.outcome is EnqueueOutcome.ACCEPTED for r in results)
    stored = dict(Job.objects.values_list("id", "payload"))
    assert [stored[job_id]["i"] for job_id in ids] == list(range(1000))
    assert dict(Job.objects.values_list("id", "priority")) == {job_id: i % 101 for i, job_id in enumerate(ids)}
    assert not JobEvent.objects.exists()  # the job rows record their enqueue (decision 0013)


def test_a_batch_of_1000_new_keys_returns_ids_in_input_order_with_one_binding_each():
    rows = [EnqueueRequest("t", {"i": i}, EnqueueOptions(idempotency=Idempotency(f"k{i}"))) for i in range(1000)]

    results = enqueue_many(rows)

    ids = [r.job_id for r in results]
    assert ids == sorted(ids) and all(r.outcome is EnqueueOutcome.ACCEPTED for r in results)
    stored = dict(Job.objects.values_list("id", "payload"))
    assert [stored[job_id]["i"] for job_id in ids] == list(range(1000))
    assert IdempotencyBinding.objects.count() == 1000


def test_a_batch_notifies_once_per_queue_with_ready_work_only(listener):
    later = EnqueueOptions(queue="later", delay=timedelta(hours=1))
    rows = [EnqueueRequest("t", {"i": i}, EnqueueOptions(queue=("a", "b")[i % 2])) for i in range(600)]
    rows += [EnqueueRequest("t", {"i": i}, later) for i in range(50)]

    enqueue_many(rows)

    assert sorted(listener(1)) == ["a", "b"]


def test_a_keyed_batch_failing_late_inside_atomic_leaves_nothing_and_the_transaction_usable(listener):
    enqueue_many([EnqueueRequest("t", {"v": 1}, EnqueueOptions(idempotency=Idempotency("taken")))])
    listener(1, 1)
    rows = [EnqueueRequest("t", {"i": i}, EnqueueOptions(idempotency=Idempotency(f"k{i}"))) for i in range(999)]
    rows.append(EnqueueRequest("t", {"v": 2}, EnqueueOptions(idempotency=Idempotency("taken"))))

    with transaction.atomic():
        with pytest.raises(EnqueueIdempotencyConflictError) as caught:
            enqueue_many(rows)
        after = enqueue_many([EnqueueRequest("t", {"after": True})])

    assert caught.value.ordinal == 999
    assert Job.objects.count() == 2 and Job.objects.filter(pk=after[0].job_id).exists()
    assert IdempotencyBinding.objects.count() == 1
    assert listener(0.3) == ["default"]  # the job enqueued after the failure, not the failed batch


def test_options_equal_in_value_but_not_in_type_are_each_checked():
    rows = [
        EnqueueRequest("t", {}, EnqueueOptions(priority=1, idempotency=Idempotency("a"))),
        EnqueueRequest("t", {}, EnqueueOptions(priority=True, idempotency=Idempotency("b"))),  # type: ignore[arg-type]
    ]

    with pytest.raises(EnqueueValidationError) as caught:
        enqueue_many(rows)

    assert caught.value.ordinal == 1 and caught.value.field == "priority"
    assert not Job.objects.exists()


def test_retry_policies_equal_in_value_keep_their_own_stored_form():
    whole = RetryPolicy(kind="fixed", base=timedelta(seconds=2), max_delay=timedelta(seconds=8), factor=2)
    fractional = RetryPolicy(kind="fixed", base=timedelta(seconds=2), max_delay=timedelta(seconds=8), factor=2.0)
    rows = [
        EnqueueRequest("t", {}, EnqueueOptions(retry_policy=whole, idempotency=Idempotency("a"))),
        EnqueueRequest("t", {}, EnqueueOptions(retry_policy=fractional, idempotency=Idempotency("b"))),
    ]

    first, second = enqueue_many(rows)

    stored = dict(Job.objects.values_list("id", "retry_policy"))
    assert stored[first.job_id] == whole.to_json() and stored[second.job_id] == fractional.to_json()
    options = [row.options for row in rows]
    assert [prepare("t", {}, o).retry_policy_json for o in options] == [
        canonical_json(p.to_json()) for p in (whole, fractional)
    ]


def test_the_cached_request_digest_is_the_digest_of_the_field_digests():
    for options in (
        EnqueueOptions(idempotency=Idempotency("k", ttl=timedelta(hours=3)), tags=["b", "a"], priority=7),
        EnqueueOptions(idempotency=Idempotency("k"), delay=timedelta(seconds=5), concurrency_key="c"),
    ):
        for payload in (None, {"a": 1}, [1, 2]):
            binding = prepare("t", payload, options).binding
            assert binding is not None
            assert binding.request_digest == request_digest(binding.field_digests)


def test_canonical_json_recovers_after_a_failure_and_in_threads():
    looped: list = []
    looped.append(looped)
    shared = {"b": [1, 2], "a": {"c": None}}
    with pytest.raises(ValueError):
        canonical_json(looped)
    with pytest.raises(TypeError):
        canonical_json({"x": object()})

    assert canonical_json(shared) == '{"a":{"c":null},"b":[1,2]}'
    seen: list[str] = []
    threads = [
        threading.Thread(target=lambda: seen.extend(canonical_json(shared) for _ in range(200))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(seen) == {'{"a":{"c":null},"b":[1,2]}'} and len(seen) == 800
