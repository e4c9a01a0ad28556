"""Handler outcomes (Snooze, Retry, Cancel, Fail, fail_on/retry_on) through a real worker and PostgreSQL.

Workers run in-process on threads (``tests.worker_tasks.run_worker``), in burst mode or with
``max_jobs`` so they end by themselves; a test then reads the job, its events and its key from the
database. Each test uses a queue of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from django_workhorse import (
    EnqueueOutcome,
    Fail,
    Idempotency,
    RetryPolicy,
    Unique,
    enqueue,
    enqueue_with_result,
    redrive,
    task,
)
from django_workhorse.models import IdempotencyBinding, Job, JobEvent, JobStatus
from tests.worker_tasks import CALLS, run_worker

pytestmark = pytest.mark.django_db(transaction=True)

ONE_MINUTE_AT_MOST = RetryPolicy(base=timedelta(seconds=1), max_delay=timedelta(minutes=1), jitter=0.0)


@pytest.fixture(autouse=True)
def _fresh_calls() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


def events(job_id: int) -> list[tuple[str, int, dict[str, Any]]]:
    return list(JobEvent.objects.filter(job_id=job_id).order_by("id").values_list("kind", "attempt", "details"))


def kinds(job_id: int) -> list[tuple[str, int]]:
    return [(kind, attempt) for kind, attempt, _ in events(job_id)]


def outcome_job(queue: str, **payload: Any) -> int:
    return enqueue("tests.outcome", payload, queue=queue, **payload.pop("options", {}))


# -- Snooze ---------------------------------------------------------------------------------------


def test_fifty_snoozes_keep_the_attempt_where_it_was_and_are_counted():
    job_id = enqueue("tests.outcome.snooze_times", {"snoozes": 50}, queue="o-snooze50")

    with override_settings(WORKHORSE_MAX_SNOOZES=50):
        stats = run_worker(queues=["o-snooze50"], max_jobs=51)

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.snoozes) == (JobStatus.SUCCEEDED, 1, 50)
    assert job.result["attempt"] == 1 and job.result["snoozes"] == 50
    assert stats.finished == {"queued": 50, "succeeded": 1}
    history = kinds(job_id)
    assert history.count(("claimed", 1)) == 51  # every claim was attempt 1: no snooze consumed one
    assert history.count(("snoozed", 1)) == 50
    counts = [details["snoozes"] for kind, _, details in events(job_id) if kind == "snoozed"]
    assert counts == list(range(1, 51))


def test_the_snooze_past_max_snoozes_makes_the_job_dead_and_the_worker_goes_on():
    job_id = enqueue("tests.outcome.snooze_times", {"snoozes": 51}, queue="o-snoozemax")
    other = enqueue("tests.record", {"n": 1}, queue="o-snoozemax")

    with override_settings(WORKHORSE_MAX_SNOOZES=50):
        stats = run_worker(queues=["o-snoozemax"], max_jobs=52)

    assert stats.finished == {"queued": 50, "dead": 1, "succeeded": 1}
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.snoozes) == (JobStatus.DEAD, 1, 50)
    assert job.last_error == "Snooze: snoozed more than 50 times"
    assert job.finished_at is not None
    assert kinds(job_id)[-2:] == [("failed", 1), ("dead", 1)]
    assert events(job_id)[-2][2]["outcome"] == "snooze"
    assert Job.objects.get(pk=other).status == JobStatus.SUCCEEDED


def test_a_snooze_goes_back_to_queued_at_its_instant_without_consuming_an_attempt():
    until = (timezone.now() + timedelta(hours=3)).replace(microsecond=0)
    job_id = outcome_job("o-until", kind="snooze_until", until=until.isoformat())

    stats = run_worker(queues=["o-until"])

    assert stats.finished == {"queued": 1}
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.snoozes, job.run_at) == (JobStatus.QUEUED, 0, 1, until)
    assert job.finished_at is None
    assert events(job_id)[-1] == ("snoozed", 1, {"until": until.isoformat(), "snoozes": 1})


def test_a_snooze_by_a_delay_waits_that_long():
    before = timezone.now()
    job_id = outcome_job("o-delay", kind="snooze", seconds=600)

    run_worker(queues=["o-delay"])

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.snoozes) == (JobStatus.QUEUED, 0, 1)
    assert before + timedelta(seconds=600) <= job.run_at <= timezone.now() + timedelta(seconds=600)


def test_a_snooze_past_the_deadline_makes_the_job_dead_saying_so():
    deadline = timezone.now() + timedelta(hours=1)
    job_id = outcome_job("o-snoozedl", kind="snooze", seconds=7200, options={"deadline": deadline})

    run_worker(queues=["o-snoozedl"])

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.snoozes) == (JobStatus.DEAD, 1, 0)
    assert job.last_error.startswith("Snooze: snoozed until ")
    assert "past the job's deadline" in job.last_error


# -- Retry ----------------------------------------------------------------------------------------


def test_retry_after_two_hours_waits_at_least_that_under_a_one_minute_max_delay():
    before = timezone.now()
    job_id = outcome_job("o-retry2h", kind="retry", seconds=7200, options={"retry_policy": ONE_MINUTE_AT_MOST})

    stats = run_worker(queues=["o-retry2h"])

    assert stats.finished == {"queued": 1}
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 1)  # an attempt consumed
    assert job.run_at >= before + timedelta(hours=2)
    assert job.last_error.startswith("Retry: retry after 2:00:00")
    failed, scheduled = events(job_id)[-2:]
    assert (failed[0], failed[2]["outcome"], failed[2]["after"]) == ("failed", "retry", 7200.0)
    assert failed[2]["exception_class"] == "django_workhorse.outcomes.values.Retry"
    assert scheduled[0] == "retry_scheduled"
    assert (scheduled[2]["outcome"], scheduled[2]["after"]) == ("retry", 7200.0)


def test_retry_after_shorter_than_the_policy_delay_waits_the_policy_delay():
    before = timezone.now()
    policy = RetryPolicy.fixed(timedelta(hours=1))
    job_id = outcome_job("o-retryfloor", kind="retry", seconds=1, options={"retry_policy": policy})

    run_worker(queues=["o-retryfloor"])

    assert Job.objects.get(pk=job_id).run_at >= before + timedelta(hours=1)


def test_retry_without_after_uses_the_policy_delay():
    before = timezone.now()
    policy = RetryPolicy.fixed(timedelta(minutes=10))
    job_id = outcome_job("o-retrynone", kind="retry", options={"retry_policy": policy})

    run_worker(queues=["o-retrynone"])

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 1)
    assert before + timedelta(minutes=10) <= job.run_at <= timezone.now() + timedelta(minutes=10)
    assert events(job_id)[-1][2]["after"] is None


def test_retry_on_the_last_attempt_is_dead_as_usual():
    job_id = outcome_job("o-retrylast", kind="retry", seconds=5, options={"max_attempts": 1})

    run_worker(queues=["o-retrylast"])

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.DEAD, 1)
    assert kinds(job_id)[-2:] == [("failed", 1), ("dead", 1)]


def test_retry_past_the_deadline_is_dead():
    deadline = timezone.now() + timedelta(minutes=30)
    job_id = outcome_job("o-retrydl", kind="retry", seconds=3600, options={"deadline": deadline})

    run_worker(queues=["o-retrydl"])

    assert Job.objects.get(pk=job_id).status == JobStatus.DEAD


# -- Cancel ---------------------------------------------------------------------------------------


def test_cancel_ends_the_job_cancelled_with_its_reason_and_frees_its_unique_key():
    first = enqueue_with_result(
        "tests.outcome", {"kind": "cancel", "reason": "order was refunded"}, queue="o-cancel", unique=Unique("order-7")
    )

    run_worker(queues=["o-cancel"])

    job = Job.objects.get(pk=first.job_id)
    assert (job.status, job.attempt, job.last_error) == (JobStatus.CANCELLED, 1, "order was refunded")
    assert job.finished_at is not None
    assert events(job.pk)[-1] == ("cancelled", 1, {"outcome": "cancel", "reason": "order was refunded"})
    again = enqueue_with_result("tests.record", {"n": 1}, queue="o-cancel", unique=Unique("order-7"))
    assert again.outcome is EnqueueOutcome.ACCEPTED
    assert again.job_id != first.job_id


def test_cancel_leaves_an_idempotency_key_its_ttl():
    key = Idempotency("charge-9", ttl=timedelta(hours=1))
    first = enqueue_with_result(
        "tests.outcome", {"kind": "cancel", "reason": "no"}, queue="o-cancelttl", idempotency=key
    )
    expires = IdempotencyBinding.objects.get(job_id=first.job_id).expires_at

    run_worker(queues=["o-cancelttl"])

    assert Job.objects.get(pk=first.job_id).status == JobStatus.CANCELLED
    again = enqueue_with_result(
        "tests.outcome", {"kind": "cancel", "reason": "no"}, queue="o-cancelttl", idempotency=key
    )
    assert (again.outcome, again.job_id) == (EnqueueOutcome.REPLAYED, first.job_id)
    assert IdempotencyBinding.objects.get(job_id=first.job_id).expires_at == expires


# -- Fail -----------------------------------------------------------------------------------------


def test_fail_dead_letters_on_attempt_1_of_25_and_can_be_redriven():
    job_id = outcome_job("o-fail", kind="fail", reason="card permanently declined", options={"max_attempts": 25})

    run_worker(queues=["o-fail"])

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.max_attempts) == (JobStatus.DEAD, 1, 25)
    assert job.last_error.startswith("Fail: card permanently declined")
    failed, dead = events(job_id)[-2:]
    assert (failed[0], failed[2]["outcome"], failed[2]["reason"]) == ("failed", "fail", "card permanently declined")
    assert dead[0] == "dead"
    new_id = redrive(job_id, request_id="after-fix")
    assert Job.objects.get(pk=new_id).status == JobStatus.QUEUED


# -- fail_on / retry_on ---------------------------------------------------------------------------


class DeclinedError(Exception):
    pass


class HardDeclinedError(DeclinedError):
    pass


@task(
    name="tests.outcomes.fail_on",
    fail_on=(DeclinedError,),
    queue="o-failon",
    retry_policy=RetryPolicy.fixed(timedelta(hours=1)),
)
def charge_with_fail_on(error: str) -> None:
    raise {"declined": HardDeclinedError, "other": RuntimeError}[error]("no")


@task(
    name="tests.outcomes.retry_on",
    retry_on=ConnectionError,
    queue="o-retryon",
    retry_policy=RetryPolicy.fixed(timedelta(hours=1)),
)
def charge_with_retry_on(error: str) -> None:
    raise {"connection": ConnectionResetError, "other": ValueError}[error]("no")


@pytest.mark.parametrize(("error", "status", "outcome"), [("declined", "dead", "fail"), ("other", "queued", None)])
def test_fail_on_dead_letters_a_matching_exception_at_once_and_retries_others(error, status, outcome):
    job_id = charge_with_fail_on.enqueue(error)

    run_worker(queues=["o-failon"])

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (status, 1)
    failed = next(details for kind, _, details in events(job_id) if kind == "failed")
    assert failed.get("outcome") == outcome
    if outcome:
        assert failed["rule"] == "fail_on"


@pytest.mark.parametrize(("error", "status"), [("connection", "queued"), ("other", "dead")])
def test_retry_on_retries_only_matching_exceptions_and_dead_letters_the_rest(error, status):
    job_id = charge_with_retry_on.enqueue(error)

    run_worker(queues=["o-retryon"])

    assert Job.objects.filter(pk=job_id).values_list("status", "attempt").get() == (status, 1)


# -- bad outcomes built in a handler ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"kind": "snooze", "seconds": 0}, "delay must be a timedelta > 0 and at most 365 days, 0:00:00"),
        ({"kind": "retry", "seconds": -1}, "after must be a timedelta > 0"),
        ({"kind": "cancel", "reason": "bad", "nul": True}, "reason must be text without NUL characters"),
        ({"kind": "fail", "reason": "x" * 10_001}, "reason must be 0..10000 characters"),
        ({"kind": "snooze_until", "until": "2030-01-01T00:00:00"}, "until must be an aware datetime"),
    ],
    ids=["zero-snooze", "negative-retry", "nul-cancel", "long-fail", "naive-until"],
)
def test_a_bad_outcome_built_in_a_handler_fails_the_attempt_readably_and_the_worker_goes_on(payload, message):
    job_id = outcome_job("o-bad", **payload, options={"max_attempts": 1})
    other = enqueue("tests.record", {"n": 1}, queue="o-bad")

    stats = run_worker(queues=["o-bad"])

    assert stats.finished == {"dead": 1, "succeeded": 1}
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.DEAD
    assert job.last_error.startswith("OutcomeValidationError: ")
    assert message in job.last_error.partition("\n")[0]
    assert Job.objects.get(pk=other).status == JobStatus.SUCCEEDED


def test_outcomes_of_many_jobs_written_together_touch_only_their_own_jobs():
    until = (timezone.now() + timedelta(hours=1)).replace(microsecond=0).isoformat()
    payloads = [
        {"kind": "snooze_until", "until": until},
        {"kind": "retry", "seconds": 60},
        {"kind": "cancel", "reason": "c"},
        {"kind": "fail", "reason": "f"},
    ]
    ids = [outcome_job("o-mixed", **payload) for payload in payloads]
    ok = enqueue("tests.record", {"n": 1}, queue="o-mixed")

    run_worker(queues=["o-mixed"], concurrency=4, batch=5)

    rows = dict(Job.objects.filter(pk__in=[*ids, ok]).values_list("pk", "status"))
    assert [rows[i] for i in ids] == ["queued", "queued", "cancelled", "dead"]
    assert rows[ok] == "succeeded"
    assert list(Job.objects.filter(pk__in=ids).order_by("pk").values_list("attempt", "snoozes")) == [
        (0, 1),
        (1, 0),
        (1, 0),
        (1, 0),
    ]


def test_an_outcome_escapes_a_handler_s_own_except_exception():
    @task(name="tests.outcomes.swallowing", queue="o-swallow")
    def swallowing() -> str:
        try:
            raise Fail("no use retrying")
        except Exception:  # a handler's log-and-carry-on must not swallow the decision
            return "swallowed"

    job_id = swallowing.enqueue()

    run_worker(queues=["o-swallow"])

    assert Job.objects.get(pk=job_id).status == JobStatus.DEAD


def test_a_snooze_after_a_failed_attempt_keeps_that_attempt_s_error_and_count():
    job_id = outcome_job("o-snoozeafter", kind="snooze", seconds=600)
    Job.objects.filter(pk=job_id).update(attempt=1, last_error="RuntimeError: boom on attempt 1")

    run_worker(queues=["o-snoozeafter"])

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.snoozes) == (JobStatus.QUEUED, 1, 1)
    assert job.last_error == "RuntimeError: boom on attempt 1"
    assert kinds(job_id)[-2:] == [("claimed", 2), ("snoozed", 2)]
