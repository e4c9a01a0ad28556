"""Eager mode runs accepted jobs in the caller's thread through the worker's own steps; dedup stays on."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from django_workhorse import (
    Debounce,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    EnqueueResult,
    Idempotency,
    Throttle,
    Unique,
    enqueue,
    enqueue_many,
    enqueue_with_result,
)
from django_workhorse.models import Job, JobEvent, JobStatus
from django_workhorse.tasks.registry import register
from django_workhorse.testing import eager, run_job, run_jobs
from tests.worker_tasks import CALLS

pytestmark = pytest.mark.django_db(transaction=True)
LATER = timedelta(hours=1)


@pytest.fixture(autouse=True)
def _fresh_calls() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


@register("tests.eager.chain")
def chain(payload: dict[str, Any]) -> None:
    """Record the payload and enqueue the next link while ``left`` > 0."""
    CALLS.add(payload["left"])
    if payload["left"]:
        enqueue("tests.eager.chain", {"left": payload["left"] - 1})


def status_of(job_id: int) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job_id)


def kinds(job_id: int) -> list[str]:
    return list(JobEvent.objects.filter(job_id=job_id).order_by("id").values_list("kind", flat=True))


def test_eager_runs_an_accepted_job_before_enqueue_returns():
    with eager():
        job_id = enqueue("tests.record", {"n": 1})

    assert CALLS.items() == [{"n": 1}]
    assert status_of(job_id) == JobStatus.SUCCEEDED
    assert kinds(job_id) == ["claimed", "succeeded"]
    assert Job.objects.get(pk=job_id).result == {"n": 1}


def test_outside_eager_mode_enqueue_only_enqueues():
    job_id = enqueue("tests.record", {"n": 1})
    assert CALLS.items() == []
    assert status_of(job_id) == JobStatus.QUEUED


@override_settings(WORKHORSE_EAGER=True)
def test_the_setting_turns_eager_mode_on_and_eager_active_false_turns_it_off():
    enqueue("tests.record", {"n": 1})
    with eager(active=False):
        quiet = enqueue("tests.record", {"n": 2})
    assert CALLS.items() == [{"n": 1}]
    assert status_of(quiet) == JobStatus.QUEUED


@eager()
def test_eager_works_as_a_decorator():
    enqueue("tests.record", {"n": 3})
    assert CALLS.items() == [{"n": 3}]


@eager()
def test_eager_still_replays_an_idempotent_request_without_running_it_again():
    key = Idempotency("order-1:confirmation")
    first = enqueue_with_result("tests.record", {"order": 1}, idempotency=key)
    again = enqueue_with_result("tests.record", {"order": 1}, idempotency=key)

    assert first.outcome is EnqueueOutcome.ACCEPTED
    assert again == EnqueueResult(first.job_id, EnqueueOutcome.REPLAYED)
    assert CALLS.items() == [{"order": 1}]
    assert Job.objects.count() == 1


@eager()
def test_eager_coalesces_onto_a_scheduled_unique_job_and_runs_it_once():
    first = enqueue_with_result("tests.record", {"n": 1}, unique=Unique("reindex:7"), delay=LATER)
    again = enqueue_with_result("tests.record", {"n": 1}, unique=Unique("reindex:7"), delay=LATER)

    assert again == EnqueueResult(first.job_id, EnqueueOutcome.COALESCED)
    assert CALLS.items() == []  # scheduled for later: eager runs only due jobs
    assert run_jobs(include_scheduled=True) == [first.job_id]
    assert CALLS.items() == [{"n": 1}]


@eager()
def test_eager_frees_a_unique_key_once_its_job_ran_like_an_infinitely_fast_worker():
    first = enqueue_with_result("tests.record", {"n": 1}, unique=Unique("reindex:8"))
    second = enqueue_with_result("tests.record", {"n": 1}, unique=Unique("reindex:8"))

    assert (first.outcome, second.outcome) == (EnqueueOutcome.ACCEPTED, EnqueueOutcome.ACCEPTED)
    assert first.job_id != second.job_id
    assert CALLS.items() == [{"n": 1}, {"n": 1}]


@eager()
def test_eager_debounce_replaces_the_pending_job_and_runs_the_last_definition_once():
    key = Debounce("search:42", window=LATER)
    outcomes = [enqueue_with_result("tests.record", {"edit": n}, debounce=key) for n in range(3)]

    assert [r.outcome for r in outcomes] == [EnqueueOutcome.ACCEPTED, EnqueueOutcome.REPLACED, EnqueueOutcome.REPLACED]
    assert {r.job_id for r in outcomes} == {outcomes[0].job_id}
    assert CALLS.items() == []
    run_jobs(include_scheduled=True)
    assert CALLS.items() == [{"edit": 2}]


@eager()
def test_eager_throttle_coalesces_onto_the_finished_job_within_its_window():
    key = Throttle("digest:user-5", window=LATER)
    first = enqueue_with_result("tests.record", {"user": 5}, throttle=key)
    again = enqueue_with_result("tests.record", {"user": 5}, throttle=key)

    assert status_of(first.job_id) == JobStatus.SUCCEEDED
    assert again == EnqueueResult(first.job_id, EnqueueOutcome.COALESCED)
    assert CALLS.items() == [{"user": 5}]


def test_eager_propagates_the_handler_exception_after_recording_the_failed_attempt():
    with eager(), pytest.raises(ValueError, match="always broken"):
        enqueue("tests.always_fail", {"n": 1}, max_attempts=2)

    job = Job.objects.get()
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 1)
    assert "ValueError: always broken" in job.last_error
    assert kinds(job.pk) == ["claimed", "failed", "retry_scheduled"]


def test_eager_without_propagation_records_the_failure_and_returns_the_job():
    with eager(propagate=False):
        job_id = enqueue("tests.always_fail", {"n": 1}, max_attempts=1)

    assert status_of(job_id) == JobStatus.DEAD
    assert kinds(job_id) == ["claimed", "failed", "dead"]


@override_settings(WORKHORSE_EAGER=True, WORKHORSE_EAGER_PROPAGATES=False)
def test_the_propagates_setting_applies_when_eager_comes_from_the_setting():
    job_id = enqueue("tests.always_fail", {"n": 1}, max_attempts=1)
    assert status_of(job_id) == JobStatus.DEAD


@eager()
def test_jobs_that_a_handler_enqueues_run_too():
    enqueue("tests.eager.chain", {"left": 2})
    assert CALLS.items() == [2, 1, 0]
    assert set(Job.objects.values_list("status", flat=True)) == {JobStatus.SUCCEEDED}


@eager()
def test_eager_runs_each_accepted_row_of_a_batch_but_not_its_repeats():
    key = Idempotency("batch-key")
    results = enqueue_many(
        [
            EnqueueRequest("tests.record", {"n": 1}),
            EnqueueRequest("tests.record", {"n": 2}),
            EnqueueRequest("tests.record", {"k": 1}, EnqueueOptions(idempotency=key)),
            EnqueueRequest("tests.record", {"k": 1}, EnqueueOptions(idempotency=key)),
        ]
    )
    assert [r.outcome for r in results][-1] is EnqueueOutcome.REPLAYED
    assert sorted(map(str, CALLS.items())) == sorted(map(str, [{"n": 1}, {"n": 2}, {"k": 1}]))


def test_a_rolled_back_transaction_takes_the_eager_job_and_its_outcome_with_it():
    with eager(), pytest.raises(RuntimeError, match="undo"), transaction.atomic():
        enqueue("tests.record", {"n": 1})
        assert Job.objects.get().status == JobStatus.SUCCEEDED
        raise RuntimeError("undo")

    assert Job.objects.count() == 0
    assert CALLS.items() == [{"n": 1}]  # effects outside the database are not undone


def test_run_jobs_runs_due_jobs_in_priority_order_and_filters_by_queue():
    low = enqueue("tests.record", {"p": 0}, priority=0)
    high = enqueue("tests.record", {"p": 9}, priority=9)
    other = enqueue("tests.record", {"p": 5}, priority=5, queue="other")
    later = enqueue("tests.record", {"p": 1}, delay=LATER)

    assert run_jobs(queues=["default"]) == [high, low]
    assert run_jobs() == [other]
    assert status_of(later) == JobStatus.QUEUED
    assert run_jobs(include_scheduled=True) == [later]
    assert run_jobs() == []


def test_run_job_returns_none_for_a_job_that_is_not_queued():
    job_id = enqueue("tests.record", {"n": 1})
    assert run_job(job_id) == "succeeded"
    assert run_job(job_id) is None


def test_eager_respects_a_saturated_concurrency_key():
    busy = enqueue("tests.record", {"n": 1}, concurrency_key="tenant-1", concurrency_limit=1)
    Job.objects.filter(pk=busy).update(status=JobStatus.RUNNING, concurrency_slot=1)

    with eager():
        waiting = enqueue("tests.record", {"n": 2}, concurrency_key="tenant-1")

    assert status_of(waiting) == JobStatus.QUEUED
    assert CALLS.items() == []
