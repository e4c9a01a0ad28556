"""Outcomes beyond the worker's own tests: eager mode, the django.tasks backend, metrics, spans, the
admin timeline, and real worker processes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from prometheus_client import REGISTRY

from django_workhorse import Cancel, EnqueueOptions, EnqueueRequest, Fail, Retry, Snooze, enqueue, enqueue_many
from django_workhorse.backends._framework import FRAMEWORK, TaskResultStatus, task_finished, task_started
from django_workhorse.models import Job, JobStatus
from django_workhorse.observability.tracing import ATTEMPT_OUTCOME
from django_workhorse.testing import eager, run_job
from tests.processes import WorkerProcess, worker_spawner
from tests.test_outcomes import HardDeclinedError, charge_with_fail_on
from tests.test_tracing import named, spans  # noqa: F401 (a fixture)
from tests.worker_tasks import run_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
WORKER_MAIN = ROOT / "tests" / "worker_main.py"
ONE_HOUR = timedelta(hours=1)

# -- eager mode -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "status", "attempt", "snoozes"),
    [
        ({"kind": "snooze", "seconds": 3600}, JobStatus.QUEUED, 0, 1),
        ({"kind": "retry", "seconds": 3600}, JobStatus.QUEUED, 1, 0),
        ({"kind": "cancel", "reason": "refunded"}, JobStatus.CANCELLED, 1, 0),
        ({"kind": "fail", "reason": "declined"}, JobStatus.DEAD, 1, 0),
    ],
    ids=["snooze", "retry", "cancel", "fail"],
)
def test_eager_mode_records_each_outcome_as_a_worker_would_and_never_re_raises_it(payload, status, attempt, snoozes):
    with eager(propagate=True):
        job_id = enqueue("tests.outcome", payload)

    assert Job.objects.filter(pk=job_id).values_list("status", "attempt", "snoozes").get() == (
        status,
        attempt,
        snoozes,
    )


def test_eager_mode_re_raises_an_exception_that_fail_on_dead_letters():
    with eager(propagate=True), pytest.raises(HardDeclinedError):
        charge_with_fail_on.enqueue("declined")
    job = Job.objects.get(job_type="tests.outcomes.fail_on")
    assert (job.status, job.attempt) == (JobStatus.DEAD, 1)


def test_run_job_returns_the_written_status_of_an_outcome():
    job_id = enqueue("tests.outcome", {"kind": "snooze", "seconds": 60})
    assert run_job(job_id) == "queued"
    job_id = enqueue("tests.outcome", {"kind": "cancel"})
    assert run_job(job_id) == "cancelled"


# -- the django.tasks backend ------------------------------------------------------------------------------

TASKS = {"default": {"BACKEND": "django_workhorse.backends.WorkhorseBackend", "QUEUES": []}}
framework_task = __import__(FRAMEWORK, fromlist=["task"]).task

with override_settings(TASKS=TASKS):

    @framework_task()
    def snoozing_task() -> None:
        raise Snooze(ONE_HOUR)

    @framework_task()
    def retrying_task() -> None:
        raise Retry(after=ONE_HOUR)

    @framework_task()
    def cancelling_task() -> None:
        raise Cancel("order was refunded")

    @framework_task()
    def failing_task() -> None:
        raise Fail("card permanently declined")


@pytest.fixture
def tasks_setting() -> Iterator[list[tuple[str, str]]]:
    sent: list[tuple[str, str]] = []

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(("started", str(task_result.status)))

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(("finished", str(task_result.status)))

    task_started.connect(started)
    task_finished.connect(finished)
    with override_settings(TASKS=TASKS):
        yield sent
    task_started.disconnect(started)
    task_finished.disconnect(finished)


def test_a_django_task_that_snoozes_is_ready_again_with_no_attempt_consumed(tasks_setting):
    result = snoozing_task.enqueue()
    run_worker()
    result.refresh()
    job = Job.objects.get(pk=int(result.id))
    assert (job.status, job.attempt, job.snoozes) == (JobStatus.QUEUED, 0, 1)
    assert (result.status, result.errors) == (TaskResultStatus.READY, [])
    assert tasks_setting == [("started", "RUNNING")]  # it has not finished: it runs again later


def test_a_django_task_that_retries_is_ready_with_its_error(tasks_setting):
    result = retrying_task.enqueue()
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert [error.exception_class for error in result.errors] == [Retry]


def test_a_django_task_that_cancels_is_failed_without_an_error(tasks_setting):
    result = cancelling_task.enqueue()
    run_worker()
    result.refresh()
    job = Job.objects.get(pk=int(result.id))
    assert (job.status, job.last_error) == (JobStatus.CANCELLED, "order was refunded")
    assert (result.status, result.errors) == (TaskResultStatus.FAILED, [])
    assert tasks_setting == [("started", "RUNNING"), ("finished", "FAILED")]


def test_a_django_task_that_fails_is_failed_at_once_with_its_reason(tasks_setting):
    result = failing_task.enqueue()
    run_worker()
    result.refresh()
    job = Job.objects.get(pk=int(result.id))
    assert (job.status, job.attempt) == (JobStatus.DEAD, 1)
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in result.errors] == [Fail]
    assert result.errors[0].traceback.startswith("Fail: card permanently declined")
    assert tasks_setting == [("started", "RUNNING"), ("finished", "FAILED")]


def test_a_django_task_outcome_in_eager_mode_is_recorded_not_raised(tasks_setting):
    with eager(propagate=True):
        result = failing_task.enqueue()
    assert Job.objects.get(pk=int(result.id)).status == JobStatus.DEAD


# -- metrics and spans ----------------------------------------------------------------------------


def finished_count(queue: str, status: str, outcome: str) -> float:
    labels = {"queue": queue, "status": status, "job_type": "", "outcome": outcome}
    return REGISTRY.get_sample_value("workhorse_attempts_finished_total", labels) or 0.0


def test_the_finished_attempts_counter_has_a_bounded_outcome_label():
    payloads = [
        ({"kind": "snooze", "seconds": 3600}, "queued", "snoozed"),
        ({"kind": "retry", "seconds": 3600}, "queued", "retry"),
        ({"kind": "cancel"}, "cancelled", "cancelled"),
        ({"kind": "fail"}, "dead", "failed"),
        ({"kind": "retry", "seconds": 5, "max_attempts": 1}, "dead", "dead"),
    ]
    before = {labels[1:]: finished_count("o-metrics", *labels[1:]) for labels in payloads}
    for payload, _, _ in payloads:
        max_attempts = payload.pop("max_attempts", 25)
        enqueue("tests.outcome", payload, queue="o-metrics", max_attempts=max_attempts)

    run_worker(queues=["o-metrics"])

    after = {labels[1:]: finished_count("o-metrics", *labels[1:]) for labels in payloads}
    assert {key: after[key] - before[key] for key in after} == dict.fromkeys(after, 1.0)


def test_the_span_is_ok_for_a_snooze_or_cancel_and_an_error_for_fail_naming_the_outcome(spans):  # noqa: F811
    from opentelemetry.trace import StatusCode

    jobs = {
        "snoozed": enqueue("tests.outcome", {"kind": "snooze", "seconds": 3600}, queue="o-spans"),
        "cancelled": enqueue("tests.outcome", {"kind": "cancel"}, queue="o-spans"),
        "failed": enqueue("tests.outcome", {"kind": "fail", "reason": "declined"}, queue="o-spans"),
        "retry": enqueue("tests.outcome", {"kind": "retry", "seconds": 60}, queue="o-spans"),
    }

    run_worker(queues=["o-spans"])

    by_job = {int(span.attributes["messaging.message.id"]): span for span in named(spans, "process")}
    outcomes = {
        kind: (by_job[job_id].attributes[ATTEMPT_OUTCOME], by_job[job_id].status.status_code)
        for kind, job_id in jobs.items()
    }
    assert outcomes == {
        "snoozed": ("snoozed", StatusCode.OK),
        "cancelled": ("cancelled", StatusCode.OK),
        "failed": ("failed", StatusCode.ERROR),
        "retry": ("retry", StatusCode.ERROR),
    }


# -- the admin timeline -------------------------------------------------------------------------------


def test_the_admin_timeline_shows_snoozes_and_outcomes_readably(admin_client):
    snoozed = enqueue("tests.outcome", {"kind": "snooze", "seconds": 3600}, queue="o-admin")
    failed = enqueue("tests.outcome", {"kind": "fail", "reason": "card declined"}, queue="o-admin")
    run_worker(queues=["o-admin"])

    page = unescape(admin_client.get(f"/admin/workhorse/job/{snoozed}/change/").content.decode())
    timeline = page[page.index('id="workhorse-events"') :]
    assert "snoozed" in timeline and "until=" in timeline and "snoozes=1" in timeline
    assert "0/25, snoozed 1×" in page
    page = unescape(admin_client.get(f"/admin/workhorse/job/{failed}/change/").content.decode())
    timeline = page[page.index('id="workhorse-events"') :]
    assert "outcome=fail" in timeline and "reason=card declined" in timeline


# -- real worker processes -----------------------------------------------------------------------------


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    common = ("--poll-interval", "0.05", "--listen-database", "none", "--queues", "o-procs")
    with worker_spawner(tmp_path, [sys.executable, str(WORKER_MAIN), *common]) as start:
        yield start


def test_jobs_snoozing_across_three_worker_processes_each_succeed_once_on_attempt_1(spawn):
    requests = [
        EnqueueRequest("tests.outcome.snooze_times", {"snoozes": 5, "n": n}, EnqueueOptions(queue="o-procs"))
        for n in range(12)
    ]
    ids = [result.job_id for result in enqueue_many(requests)]
    workers = [spawn("--concurrency", "2") for _ in range(3)]

    done = Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED)
    wait_for(lambda: done.count() == len(ids), 120, what="every snoozing job to succeed")
    for worker in workers:
        worker.terminate()
    assert all(worker.wait() == 0 for worker in workers)

    rows = Job.objects.filter(pk__in=ids).values_list("attempt", "snoozes", "result")
    assert {(attempt, snoozes) for attempt, snoozes, _ in rows} == {(1, 5)}
    assert all(result["attempt"] == 1 and result["snoozes"] == 5 for _, _, result in rows)
