"""The django.tasks backend: a port of what Django's own tests check of a backend, and workhorse's part.

Django's tests (tests/tasks/test_tasks.py, test_dummy_backend.py, test_immediate_backend.py) check
enqueue, get_result, priorities, run_after, queue names and validation errors; here they run
against ``WorkhorseBackend`` and real PostgreSQL, followed by what only this backend does:
transactional enqueue, execution on the worker, attempts and errors read back from the job, the
framework's signals, and workhorse's keyed modes through ``@task(...)`` and ``Task.using()``.

Task functions are module-level (django.tasks requires it) and are decorated while ``TASKS``
points at the backend, so the decorator builds ``WorkhorseTask`` instances. Django 6.0+ provides
``django.tasks``; on Django 5.2 the ``django-tasks`` backport does, and without either this module
is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from django_workhorse import (
    Debounce,
    EnqueueIdempotencyConflictError,
    EnqueueOutcome,
    EnqueueValidationError,
    Idempotency,
    RetryPolicy,
    Throttle,
    Unique,
    enqueue,
)
from django_workhorse.conf import MAX_JSON_DEPTH
from django_workhorse.encryption import is_envelope
from django_workhorse.enqueueing.fingerprints import derived_key
from django_workhorse.exceptions import DjangoTaskNotFoundError, WorkhorseBackendNotConfiguredError, WorkhorseError
from django_workhorse.models import Job, JobEvent, JobStatus
from django_workhorse.tasks.registry import Handler, get_handler
from django_workhorse.testing import eager, run_job
from tests.conftest import connect_directly
from tests.encryption import encryption_setting
from tests.values import as_stored, nested, read_back
from tests.worker_tasks import run_worker

try:
    from django_workhorse.backends import WorkhorseBackend, WorkhorseTask, WorkhorseTaskResult, resolve_handler
except ImportError as exc:  # neither django.tasks (Django 6.0+) nor the django-tasks backport
    pytest.skip(f"no tasks framework: {exc}", allow_module_level=True)

from django_workhorse.backends import _framework
from django_workhorse.backends._framework import (
    FRAMEWORK,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)

framework = importlib.import_module(FRAMEWORK)
task = framework.task
TaskResultMismatch = importlib.import_module(f"{FRAMEWORK}.exceptions").TaskResultMismatch
ImmediateBackend = importlib.import_module(f"{FRAMEWORK}.backends.immediate").ImmediateBackend

BACKEND = "django_workhorse.backends.WorkhorseBackend"
FAST = RetryPolicy.fixed(timedelta(milliseconds=1))
TASKS = {
    # Two attempts, 1 ms apart, unless a task says otherwise.
    "default": {
        "BACKEND": BACKEND,
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"max_attempts": 2, "retry_policy": FAST},
    },
    "open": {"BACKEND": BACKEND, "QUEUES": []},
    "immediate": {"BACKEND": f"{FRAMEWORK}.backends.immediate.ImmediateBackend", "QUEUES": []},
    "missing": {"BACKEND": "does.not.exist"},
}
LATER = timedelta(hours=1)
ROOT = Path(__file__).resolve().parent.parent

# -- the tasks -------------------------------------------------------------------------------------

with override_settings(TASKS=TASKS):

    @task()
    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    @task
    def noop_from_bare_decorator(*args: Any, **kwargs: Any) -> None:
        return None

    @task()
    async def noop_async(*args: Any, **kwargs: Any) -> None:
        return None

    @task()
    def add(a: int, b: int) -> int:
        return a + b

    @task()
    async def add_async(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    @task()
    def calculate_meaning_of_life() -> int:
        return 42

    @task(max_attempts=1)
    def failing_value_error() -> None:
        raise ValueError("This Task failed due to ValueError")

    @task()
    def always_failing() -> None:
        raise ValueError("always broken")

    @task(max_attempts=1)
    def complex_exception() -> None:
        raise ValueError(ValueError("This task failed"))

    @task(max_attempts=1)
    def complex_return_value() -> Any:
        return lambda: True  # neither JSON nor picklable

    @task(takes_context=True)
    def get_task_id(context: TaskContext) -> str:
        return context.task_result.id

    @task(takes_context=True)
    def describe_context(context: TaskContext, label: str) -> dict[str, Any]:
        result = context.task_result
        return {
            "label": label,
            "attempt": context.attempt,
            "status": str(result.status),
            "worker_ids": result.worker_ids,
            "errors": len(result.errors),
        }

    @task(takes_context=True, max_attempts=3)
    def fail_on_first_attempt(context: TaskContext) -> int:
        if context.attempt == 1:
            raise RuntimeError("boom on attempt 1")
        return context.attempt

    @task(queue_name="emails", priority=7, max_attempts=3, timeout=timedelta(minutes=5), tags=("mail",))
    def send_email(to: str) -> str:
        return to

    @task(idempotent=True)
    def charge(customer_id: int, amount_cents: int, currency: str = "eur") -> dict[str, Any]:
        return {"customer_id": customer_id, "amount_cents": amount_cents, "currency": currency}

    @task(unique=lambda report_id: Unique(f"report:{report_id}"))
    def build_report(report_id: int) -> int:
        return report_id

    @task(debounce=lambda product_id, **_: Debounce(f"reindex:{product_id}", window=LATER))
    def reindex(product_id: int, fields: list[str] | None = None) -> None:
        return None

    @task(throttle=lambda user_id: Throttle(f"digest:{user_id}", window=LATER))
    def send_digest(user_id: int) -> None:
        return None

    @task(concurrency_key=lambda account_id: f"account:{account_id}")
    def sync_account(account_id: int) -> None:
        return None

    @task()
    def tally(n: int) -> int:
        return n

    # Django 6.0 passes no extra decorator arguments to the task class: using() right after it does.
    tally = tally.using(idempotent=True)

    @task(max_attempts=1)
    def enqueue_out_of_bounds() -> None:
        enqueue("tests.noop", priority=1000)  # workhorse's own enqueue refuses it


# -- fixtures and helpers --------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _tasks_setting() -> Iterator[None]:
    with override_settings(TASKS=TASKS):
        yield


@pytest.fixture
def signals() -> Iterator[list[tuple[str, Any, str, str]]]:
    """Record (signal, sender, result id, status) for every task signal sent."""
    sent: list[tuple[str, Any, str, str]] = []
    receivers = []
    for name, signal in (("enqueued", task_enqueued), ("started", task_started), ("finished", task_finished)):

        def receiver(sender: Any, task_result: Any, _name: str = name, **kwargs: Any) -> None:
            sent.append((_name, sender, task_result.id, str(task_result.status)))

        signal.connect(receiver)
        receivers.append((signal, receiver))
    yield sent
    for signal, receiver in receivers:
        signal.disconnect(receiver)


def job_of(result: Any) -> Job:
    return Job.objects.get(pk=int(result.id))


def run(result: Any) -> Any:
    """Run the result's job once, in this thread, as a worker would; return the refreshed result."""
    run_job(int(result.id), propagate=False)
    result.refresh()
    return result


# -- Django's own backend tests, ported ----------------------------------------------------------

pytestmark = pytest.mark.django_db


def test_using_correct_backend():
    backend = task_backends["default"]
    assert isinstance(backend, WorkhorseBackend)
    assert backend.alias == "default"
    assert backend.options == {"max_attempts": 2, "retry_policy": FAST}
    assert framework.default_task_backend.alias == "default"


def test_capability_flags_are_honest():
    backend = task_backends["default"]
    assert backend.supports_defer is True
    assert backend.supports_async_task is True
    assert backend.supports_get_result is True
    assert backend.supports_priority is True
    assert backend.task_class is WorkhorseTask


def test_task_decorator_builds_workhorse_tasks():
    for task_ in (noop, noop_async, noop_from_bare_decorator, get_task_id, charge):
        assert isinstance(task_, Task)
        assert isinstance(task_, WorkhorseTask)


@pytest.mark.parametrize("task_", [noop, noop_async], ids=["sync", "async"])
def test_enqueue_task(task_):
    result = task_.enqueue(1, two=3)

    assert isinstance(result, WorkhorseTaskResult)
    assert result.status == TaskResultStatus.READY
    assert result.is_finished is False
    assert result.started_at is None
    assert result.last_attempted_at is None
    assert result.finished_at is None
    assert result.enqueued_at is not None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == task_
    assert result.args == [1]
    assert result.kwargs == {"two": 3}
    assert result.attempts == 0
    assert result.errors == []
    assert result.backend == "default"
    assert result.enqueue_result.outcome is EnqueueOutcome.ACCEPTED
    job = job_of(result)
    assert result.job_id == job.pk
    assert (job.job_type, job.payload, job.status) == (task_.module_path, {"args": [1], "kwargs": {"two": 3}}, "queued")


def test_the_backend_enqueues_directly_too():
    result = task_backends["default"].enqueue(add, (1,), {"b": 2})
    assert (result.args, result.kwargs) == ([1], {"b": 2})
    assert job_of(result).payload == {"args": [1], "kwargs": {"b": 2}}


def test_enqueue_with_invalid_argument_raises_type_error_and_writes_nothing():
    with pytest.raises(TypeError, match="Unsupported type"):
        noop.enqueue(datetime.now())
    assert not Job.objects.exists()


def test_using_priority_queue_name_and_run_after():
    now = timezone.now()
    assert noop.priority == 0
    assert noop.using(priority=1).priority == 1
    assert noop.queue_name == "default"
    assert noop.using(queue_name="emails").queue_name == "emails"
    assert noop.run_after is None
    assert noop.using(run_after=now).run_after == now
    assert (noop.priority, noop.queue_name, noop.run_after) == (0, "default", None)


def test_using_creates_a_new_equal_instance_and_chains():
    assert noop.using() == noop
    assert noop.using() is not noop
    now = timezone.now()
    later = noop.using(run_after=now).using(priority=10)
    assert (later.run_after, later.priority) == (now, 10)


def test_using_unknown_or_missing_backend():
    with pytest.raises(InvalidTaskBackend, match="The connection 'unknown' doesn't exist"):
        noop.using(backend="unknown")
    with pytest.raises(InvalidTaskBackend, match="Could not find backend 'does.not.exist'"):
        noop.using(backend="missing")


def test_priority_run_after_and_queue_name_reach_the_job():
    run_after = timezone.now() + LATER
    result = add.using(priority=90, queue_name="emails", run_after=run_after).enqueue(1, 2)
    job = job_of(result)
    assert (job.priority, job.queue, job.run_at) == (90, "emails", run_after)
    back = task_backends["default"].get_result(result.id)
    assert (back.task.priority, back.task.queue_name) == (90, "emails")


def test_naive_run_after_is_invalid():
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime."):
        noop.using(run_after=datetime.now())


def test_naive_run_after_is_invalid_even_without_use_tz():
    with override_settings(USE_TZ=False), pytest.raises(InvalidTask, match="run_after must be an aware datetime."):
        noop.using(run_after=datetime.now())


@pytest.mark.parametrize("priority", [-101, 101, 3.1])
def test_priority_outside_djangos_range_is_invalid(priority):
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100."):
        noop.using(priority=priority)


@pytest.mark.parametrize("priority", [-1, -100])
def test_negative_priority_cannot_be_honoured(priority):
    with pytest.raises(InvalidTask, match="priority must be a whole number between 0 and 100 with WorkhorseBackend"):
        noop.using(priority=priority)


def test_priorities_zero_to_hundred_are_valid_and_higher_runs_first():
    low = add.using(priority=0).enqueue(1, 1)
    high = add.using(priority=100).enqueue(2, 2)
    middle = add.using(priority=50.0).enqueue(3, 3)
    assert job_of(middle).priority == 50
    assert list(Job.objects.order_by("-priority", "id").values_list("id", flat=True)) == [
        high.job_id,
        middle.job_id,
        low.job_id,
    ]


def test_unknown_queue_name_is_invalid_unless_queues_is_empty():
    with pytest.raises(InvalidTask, match="Queue 'queue-2' is not valid for backend."):
        noop.using(queue_name="queue-2")
    assert noop.using(queue_name="queue-2", backend="open").queue_name == "queue-2"


def test_queue_names_beyond_workhorse_bounds_are_invalid():
    with pytest.raises(InvalidTask, match=r"queue.*1\.\.100 characters"):
        noop.using(queue_name="q" * 101, backend="open")


def test_validate_on_enqueue():
    task_ = noop.using(queue_name="emails")
    with (
        override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["queue-1"]}}),
        pytest.raises(InvalidTask, match="Queue 'emails' is not valid for backend"),
    ):
        task_.enqueue()
    assert not Job.objects.exists()


def test_a_module_path_too_long_for_a_job_type_is_invalid():
    with (
        mock.patch.object(WorkhorseTask, "module_path", new_callable=mock.PropertyMock, return_value="m." + "f" * 254),
        pytest.raises(InvalidTask, match="longer than 255 characters"),
    ):
        noop.using()


def test_invalid_function_and_missing_context_parameter():
    def local() -> None:
        return None

    for invalid in (any, local):
        with pytest.raises(InvalidTask, match="Task function must be defined at a module level."):
            task()(invalid)
    with pytest.raises(InvalidTask, match="Task takes context but does not have a first argument of 'context'."):
        task(takes_context=True)(calculate_meaning_of_life.func)


def test_name_and_module_path():
    assert noop.name == "noop"
    assert noop.module_path == "tests.test_django_tasks_backend.noop"
    assert importlib.import_module("tests.test_django_tasks_backend").noop is noop


def test_get_result_round_trip():
    result = task_backends["default"].enqueue(noop, (1,), {"two": 3})

    again = noop.get_result(result.id)

    assert isinstance(again, WorkhorseTaskResult)
    for name in ("id", "status", "args", "kwargs", "backend", "errors", "worker_ids", "started_at", "finished_at"):
        assert getattr(again, name) == getattr(result, name), name
    assert again.task == noop
    assert again.enqueued_at == job_of(result).created_at
    assert again.enqueue_result is None
    assert again.attempts == 0


def test_get_missing_result():
    backend = task_backends["default"]
    for missing in ("123", "0", "-1", "abc", "1.5", "", "٣", str(2**63)):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(missing)
    with pytest.raises(TaskResultDoesNotExist):
        noop.get_result("123")


def test_get_result_of_a_plain_workhorse_job_does_not_exist():
    job_id = enqueue("tests.record", {"n": 1})
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(job_id))


def test_get_result_of_another_task_is_a_mismatch():
    result = noop_async.enqueue()
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        noop.get_result(result.id)


def test_refresh_result():
    result = calculate_meaning_of_life.enqueue()
    assert result.status == TaskResultStatus.READY

    run_job(result.job_id)
    result.refresh()

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    assert result.is_finished is True
    assert result.attempts == 1
    assert result.worker_ids == ["eager"]
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


def test_enqueue_logs(caplog):
    caplog.set_level(logging.DEBUG, logger=FRAMEWORK)
    result = noop.enqueue()
    messages = [r.getMessage() for r in caplog.records if r.name == FRAMEWORK]
    assert len(messages) == 1
    assert "enqueued" in messages[0] and result.id in messages[0]


def test_check(monkeypatch):
    assert task_backends["default"].check() == []
    monkeypatch.setattr("django_workhorse.backends.backend.apps.is_installed", lambda name: False)
    [error] = task_backends["default"].check()
    assert error.id == "workhorse.E101"
    monkeypatch.undo()
    [error] = WorkhorseBackend("elsewhere", {"OPTIONS": {"database": "nowhere"}}).check()
    assert error.id == "workhorse.E102"
    assert WorkhorseBackend("elsewhere", {"OPTIONS": {"database": "other"}}).check() == []


def test_unknown_or_invalid_options_make_an_invalid_backend():
    for options, match in (
        ({"max_retries": 3}, "Unknown OPTIONS"),
        ({"max_attempts": 0}, r"max_attempts.*1\.\.100"),
        ({"database": 5}, "database alias"),
    ):
        settings = {"default": {"BACKEND": BACKEND, "OPTIONS": options}}
        with override_settings(TASKS=settings), pytest.raises(InvalidTaskBackend, match=match):
            task_backends["default"]


def test_building_a_backend_touches_no_database(django_assert_num_queries):
    with django_assert_num_queries(0):
        WorkhorseBackend("other", {"OPTIONS": {"database": "other", "max_attempts": 3}})


# -- execution, results, errors, context (one attempt at a time, in this thread) -------------------


def test_result():
    result = run(add.enqueue(2, b=3))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert job_of(result).result == 5


def test_async_task_runs():
    result = run(add_async.enqueue(2, 3))
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


@pytest.mark.parametrize(
    ("task_", "exception", "message"),
    [
        (failing_value_error, ValueError, "This Task failed due to ValueError"),
        (complex_exception, ValueError, "This task failed"),
    ],
)
def test_catches_exception(task_, exception, message, caplog):
    caplog.set_level(logging.ERROR, logger=FRAMEWORK)
    result = run(task_.enqueue())

    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.is_finished is True
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.attempts == 1
    [error] = result.errors
    assert error.exception_class is exception
    assert error.traceback.endswith(f"{exception.__name__}: {message}\n")
    assert "Traceback (most recent call last)" in error.traceback
    # Django's own receiver logs the failure with the exception (task_finished is sent while handling it).
    [record] = [r for r in caplog.records if r.name == FRAMEWORK and r.levelno == logging.ERROR]
    assert "state=FAILED" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is exception


def test_complex_return_value_fails_the_task():
    result = run(complex_return_value.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError
    assert "Unsupported type" in result.errors[0].traceback


def test_takes_context():
    result = run(get_task_id.enqueue())
    assert result.return_value == result.id


def test_context_has_the_running_result_with_one_worker_id_per_attempt():
    result = run(describe_context.enqueue("x"))
    assert result.return_value == {
        "label": "x",
        "attempt": 1,
        "status": "RUNNING",
        "worker_ids": ["eager"],
        "errors": 0,
    }


def test_a_retried_task_keeps_its_errors_and_counts_its_attempts():
    result = run(fail_on_first_attempt.enqueue())
    # Attempt 1 failed; a retry is scheduled: ready to be executed again.
    assert (result.status, result.attempts, len(result.errors)) == (TaskResultStatus.READY, 1, 1)
    assert result.finished_at is None
    assert result.errors[0].exception_class is RuntimeError

    run_job(result.job_id, scheduled=True)
    result.refresh()

    assert (result.status, result.attempts, result.return_value) == (TaskResultStatus.SUCCESSFUL, 2, 2)
    assert [e.exception_class for e in result.errors] == [RuntimeError]
    assert result.worker_ids == ["eager", "eager"]
    assert result.last_attempted_at > result.started_at


def test_a_cancelled_task_is_failed():
    from django_workhorse import cancel

    result = noop.enqueue()
    cancel(result.job_id)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at is not None
    assert result.errors == []


def test_signals_around_enqueue_and_execution(signals):
    result = add.enqueue(1, 2)
    assert signals == [("enqueued", WorkhorseBackend, result.id, "READY")]

    run(result)

    assert signals[1:] == [
        ("started", WorkhorseBackend, result.id, "RUNNING"),
        ("finished", WorkhorseBackend, result.id, "SUCCESSFUL"),
    ]


def test_task_finished_reports_a_failed_attempt(signals, caplog):
    result = run(failing_value_error.enqueue())
    assert [s[0] for s in signals] == ["enqueued", "started", "finished"]
    assert signals[-1] == ("finished", WorkhorseBackend, result.id, "FAILED")


def test_eager_mode_runs_the_task_after_task_enqueued(signals):
    with eager():
        result = add.enqueue(4, 5)
    assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, 9, 1)
    assert [s[0] for s in signals] == ["enqueued", "started", "finished"]


def test_eager_mode_propagates_a_failure_after_recording_it():
    with eager(), pytest.raises(ValueError, match="This Task failed"):
        failing_value_error.enqueue()
    job = Job.objects.get()
    assert job.status == JobStatus.DEAD


def test_eager_mode_propagates_the_task_s_own_enqueue_error_as_it_is(signals):
    # Raised after this call was written and announced: not an InvalidTask about this call.
    with eager(), pytest.raises(EnqueueValidationError, match="priority"):
        enqueue_out_of_bounds.enqueue()
    assert Job.objects.get().status == JobStatus.DEAD
    assert [s[0] for s in signals] == ["enqueued", "started", "finished"]


def test_a_task_enqueued_receiver_s_enqueue_error_reaches_the_caller_as_it_is():
    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        enqueue("tests.noop", priority=1000)

    task_enqueued.connect(receiver)
    try:
        with pytest.raises(EnqueueValidationError, match="priority"):
            add.enqueue(1, 2)
    finally:
        task_enqueued.disconnect(receiver)


# -- the worker finds django.tasks jobs by module path --------------------------------------------


def test_the_worker_resolves_a_task_by_its_module_path():
    handler = resolve_handler(add.module_path)
    assert isinstance(handler, Handler)
    assert (handler.job_type, handler.takes_context, handler.spreads_payload) == (add.module_path, True, False)
    assert get_handler(add.module_path).job_type == add.module_path


@pytest.mark.parametrize("job_type", ["tests.record", "os.path.join", "nodots", "tests.no_such_module.f"])
def test_only_tasks_resolve(job_type):
    assert resolve_handler(job_type) is None


def test_a_job_whose_task_is_gone_since_it_resolved_fails_saying_so(monkeypatch):
    handler = resolve_handler(add.module_path)
    assert handler is not None
    monkeypatch.delattr(sys.modules[__name__], "add")  # renamed or removed after the worker resolved it
    with pytest.raises(DjangoTaskNotFoundError, match="no longer names a django.tasks task") as caught:
        handler.func(None, {"args": [1, 2], "kwargs": {}})
    assert isinstance(caught.value, WorkhorseError) and caught.value.job_type == handler.job_type


def test_a_job_with_no_workhorse_backend_configured_fails_saying_so():
    handler = resolve_handler(add.module_path)
    assert handler is not None
    with (
        override_settings(TASKS={"immediate": TASKS["immediate"]}),
        pytest.raises(WorkhorseBackendNotConfiguredError, match="no WorkhorseBackend in settings.TASKS") as caught,
    ):
        handler.func(None, {"args": [1, 2], "kwargs": {}})
    assert isinstance(caught.value, WorkhorseError) and caught.value.job_type == add.module_path


# -- workhorse options through the decorator and using() -----------------------------------------


def test_decorator_options_reach_the_job():
    job = job_of(send_email.enqueue("a@example.com"))
    assert (job.queue, job.priority, job.max_attempts, job.timeout, job.tags) == (
        "emails",
        7,
        3,
        timedelta(minutes=5),
        ["mail"],
    )


def test_backend_options_are_the_default_of_every_task():
    job = job_of(noop.enqueue())
    assert job.max_attempts == 2
    assert job.retry_policy == FAST.to_json()


def test_a_concurrency_key_callable_gets_the_call():
    job = job_of(sync_account.enqueue(7))
    assert (job.concurrency_key, job.concurrency_limit) == ("account:7", 1)


def test_using_keeps_workhorse_options():
    moved = send_email.using(priority=9)
    assert isinstance(moved, WorkhorseTask)
    assert (moved.max_attempts, moved.tags, moved.timeout) == (3, ("mail",), timedelta(minutes=5))
    assert charge.using(queue_name="emails").idempotent is True
    assert build_report.using(priority=1).unique is build_report.unique
    job = job_of(send_email.using(max_attempts=5, tags=["a", "b"]).enqueue("x"))
    assert (job.max_attempts, job.tags, job.priority) == (5, ["a", "b"], 7)


def test_idempotent_derives_one_key_from_the_bound_arguments(signals):
    first = charge.enqueue(42, 1000)
    again = charge.enqueue(amount_cents=1000, customer_id=42)
    other = charge.enqueue(42, 1000, "usd")

    assert again.id == first.id
    assert again.enqueue_result.outcome is EnqueueOutcome.COALESCED
    assert other.id != first.id
    # The stored call is canonical: bound to the signature, defaults applied.
    assert (again.args, again.kwargs) == ([42, 1000, "eur"], {})
    assert job_of(first).payload == {"args": [42, 1000, "eur"], "kwargs": {}}
    # task_enqueued is sent for the two new jobs only.
    assert [s[2] for s in signals] == [first.id, other.id]
    # The key is workhorse's recipe over the module path and {parameter: value}.
    key = derived_key(charge.module_path, {"customer_id": 42, "amount_cents": 1000, "currency": "eur"})
    assert charge.derived_key(42, 1000) == charge.derived_key(amount_cents=1000, customer_id=42) == key
    assert key.startswith("auto:")


def test_idempotent_coalesces_only_while_the_job_is_live():
    first = charge.enqueue(1, 10)
    run_job(first.job_id)
    again = charge.enqueue(1, 10)
    assert again.id != first.id
    assert again.enqueue_result.outcome is EnqueueOutcome.ACCEPTED


def test_a_coalesced_call_returns_the_owning_jobs_result_as_stored():
    first = charge.enqueue(5, 50)
    again = charge.enqueue(5, 50)
    assert (again.id, again.status, again.enqueue_result.outcome) == (first.id, "READY", EnqueueOutcome.COALESCED)
    assert again.enqueued_at == job_of(first).created_at  # read back from the job, not made up


def test_per_call_idempotency_replays(signals):
    key = Idempotency("order-7")
    first = add.using(idempotency=key).enqueue(1, 2)
    again = add.using(idempotency=key).enqueue(1, 2)

    assert again.id == first.id
    assert again.enqueue_result.outcome is EnqueueOutcome.REPLAYED
    assert len(signals) == 1

    with pytest.raises(EnqueueIdempotencyConflictError) as conflict:
        add.using(idempotency=key).enqueue(1, 3)
    assert conflict.value.job_id == first.job_id
    assert Job.objects.count() == 1


def test_an_idempotency_replay_after_the_job_ran_returns_its_result():
    key = Idempotency("order-8")
    first = add.using(idempotency=key).enqueue(2, 2)
    run_job(first.job_id)
    again = add.using(idempotency=key).enqueue(2, 2)
    assert (again.id, again.status, again.return_value) == (first.id, TaskResultStatus.SUCCESSFUL, 4)


def test_unique_factory_coalesces_per_key():
    first = build_report.enqueue(1)
    assert build_report.enqueue(report_id=1).id == first.id
    assert build_report.enqueue(2).id != first.id


def test_debounce_replaces_the_waiting_job(signals):
    first = reindex.enqueue(3, fields=["title"])
    again = reindex.enqueue(3, fields=["price"])

    assert again.id == first.id
    assert again.enqueue_result.outcome is EnqueueOutcome.REPLACED
    assert again.args == [3, ["price"]]
    assert job_of(first).payload == {"args": [3, ["price"]], "kwargs": {}}
    assert [s[0] for s in signals] == ["enqueued", "enqueued"]


def test_debounce_leaves_a_started_job_alone(signals):
    first = reindex.enqueue(4)
    run_job(first.job_id, scheduled=True)

    again = reindex.enqueue(4, fields=["stock"])

    assert again.id == first.id
    assert again.enqueue_result.outcome is EnqueueOutcome.NON_REPLACEABLE
    assert again.enqueue_result.reason == "not_pending"
    assert (again.status, again.args) == (TaskResultStatus.SUCCESSFUL, [4, None])
    assert [s[0] for s in signals] == ["enqueued", "started", "finished"]


def test_using_right_after_the_decorator_sets_options_on_django_6_0_too():
    assert tally.idempotent is True
    assert importlib.import_module("tests.test_django_tasks_backend").tally is tally
    first = tally.enqueue(3)
    assert tally.enqueue(n=3).id == first.id
    assert run(first).return_value == 3


def test_throttle_coalesces_within_the_window():
    first = send_digest.enqueue(9)
    again = send_digest.enqueue(9)
    assert (again.id, again.enqueue_result.outcome) == (first.id, EnqueueOutcome.COALESCED)


def test_using_a_keyed_mode_replaces_the_tasks_and_idempotent_false_turns_it_off():
    per_call = charge.using(idempotency=Idempotency("charge-1"))
    assert (per_call.idempotent, per_call.idempotency) == (False, Idempotency("charge-1"))
    assert charge.using(idempotent=False).enqueue(1, 1).id != charge.using(idempotent=False).enqueue(1, 1).id
    assert build_report.using(idempotent=True).unique is None


def test_a_mode_factory_returning_none_means_no_key():
    loose = noop.using(unique=lambda *args, **kwargs: None)
    assert loose.enqueue(1).id != loose.enqueue(1).id


def test_unsupported_combinations_raise_invalid_task():
    with pytest.raises(InvalidTask, match="at most one keyed mode; this one sets idempotent, unique"):
        charge.using(unique=Unique("x"), idempotent=True)
    with pytest.raises(InvalidTask, match="run_after cannot be combined with debounce"):
        reindex.using(run_after=timezone.now())
    with pytest.raises(InvalidTask, match="unique must be a Unique"):
        noop.using(unique="a-raw-key")
    with pytest.raises(InvalidTask, match="cannot honour workhorse options"):
        charge.using(backend="immediate")
    with pytest.raises(InvalidTask, match=r"max_attempts.*1\.\.100"):
        noop.using(max_attempts=101)


def test_enqueue_validation_errors_become_invalid_task():
    with pytest.raises(InvalidTask, match=r"idempotency\.key.*1\.\.512 UTF-8 bytes"):
        noop.using(idempotency=Idempotency("k" * 513)).enqueue()
    with override_settings(WORKHORSE_MAX_PAYLOAD_BYTES=64), pytest.raises(InvalidTask, match="payload"):
        noop.enqueue("x" * 100)
    assert not Job.objects.exists()


def test_a_keyed_call_that_does_not_fit_the_signature_raises_type_error():
    with pytest.raises(TypeError):
        charge.enqueue(1)
    assert not Job.objects.exists()


def test_a_plain_task_moved_to_the_workhorse_backend_enqueues():
    plain = ImmediateBackend.task_class(func=add.func, backend="immediate")
    assert not isinstance(plain, WorkhorseTask)
    result = plain.using(backend="default").enqueue(1, 2)
    assert result.status == TaskResultStatus.READY
    assert run(result).return_value == 3


# -- without a tasks framework ------------------------------------------------------------------


def test_without_a_tasks_framework_the_import_error_names_the_backport():
    spec = importlib.util.spec_from_file_location("_framework_without_tasks", _framework.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # None in sys.modules makes `import name` raise ImportError.
    with (
        mock.patch.dict(sys.modules, {"django.tasks": None, "django_tasks": None}),
        pytest.raises(ImportError, match=r"django-tasks>=0\.12"),
    ):
        spec.loader.exec_module(module)


# -- transactions and the real worker (threads: each has its own connection) ------------------------


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        add.enqueue(1, 2)
        raise RuntimeError("roll back")
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_joins_the_callers_transaction():
    with connect_directly() as other, transaction.atomic():
        result = add.enqueue(1, 2)
        assert other.execute("SELECT count(*) FROM workhorse_job").fetchone()[0] == 0
    with connect_directly() as other:
        assert other.execute("SELECT id FROM workhorse_job").fetchall() == [(result.job_id,)]


@pytest.mark.django_db(transaction=True)
def test_the_worker_runs_tasks_and_get_result_reads_them_back(signals):
    results = [add.enqueue(1, 2), noop_async.enqueue(), get_task_id.enqueue(), describe_context.enqueue("w")]

    stats = run_worker(concurrency=2)

    assert stats.finished == {"succeeded": 4}
    worker_names = set(JobEvent.objects.filter(kind="claimed").values_list("details__worker", flat=True))
    assert len(worker_names) == 1
    worker = worker_names.pop()
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert (result.attempts, result.worker_ids, result.errors) == (1, [worker], [])
        assert result.enqueued_at <= result.started_at <= result.finished_at
    assert [r.return_value for r in results[:3]] == [3, None, results[2].id]
    assert results[3].return_value["worker_ids"] == [worker]
    assert sorted(s[0] for s in signals) == ["enqueued"] * 4 + ["finished"] * 4 + ["started"] * 4
    assert all(sender is WorkhorseBackend for _, sender, _, _ in signals)


@pytest.mark.django_db(transaction=True)
def test_a_failing_task_is_failed_after_max_attempts_with_one_error_per_attempt():
    result = always_failing.enqueue()  # max_attempts=2 from the backend OPTIONS

    stats = run_worker(max_jobs=2)

    assert stats.finished == {"queued": 1, "dead": 1}
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2 == job_of(result).max_attempts
    assert [e.exception_class for e in result.errors] == [ValueError, ValueError]
    # Each starts with the exception; earlier attempts' text is cut at 500 characters, the last one's is whole.
    assert all(e.traceback.startswith("ValueError: always broken\n") for e in result.errors)
    assert result.errors[-1].traceback.endswith("ValueError: always broken\n")
    assert len(set(result.worker_ids)) == 1
    assert result.finished_at is not None


@pytest.mark.django_db(transaction=True)
def test_get_result_opens_what_encrypt_all_sealed():
    with override_settings(WORKHORSE_ENCRYPTION=encryption_setting(encrypt_all=True)):
        result, failing = add.enqueue(1, 2), always_failing.enqueue()
        assert is_envelope(job_of(result).payload) and is_envelope(job_of(failing).payload)

        run_worker(max_jobs=3)

        again = task_backends["default"].get_result(result.id)
        failing.refresh()
        assert is_envelope(job_of(result).result) and is_envelope(job_of(failing).last_error)
    assert (again.status, again.args, again.return_value) == (TaskResultStatus.SUCCESSFUL, [1, 2], 3)
    assert failing.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in failing.errors] == [ValueError, ValueError]
    assert all(e.traceback.startswith("ValueError: always broken\n") for e in failing.errors)
    assert failing.errors[-1].traceback.endswith("ValueError: always broken\n")


@pytest.mark.django_db(transaction=True)
def test_a_worker_without_the_handler_registered_resolves_it(monkeypatch):
    from django_workhorse.tasks import registry

    monkeypatch.setattr(registry, "_handlers", {})  # as in a fresh worker process
    result = add.enqueue(20, 22)

    run_worker()

    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


@pytest.mark.django_db(transaction=True)
def test_a_worker_process_runs_tasks_another_process_enqueued(tmp_path):
    """A fresh process that never imported the backend, with checks skipped, still finds the task."""
    from tests.processes import subprocess_database_url

    results = [add.enqueue(1, 41), describe_context.enqueue("process")]
    env = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.django_tasks_settings",
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "django", "workhorse_worker", "--burst", "--skip-checks"]
    command += ["--listen-database", "none", "--poll-interval", "0.05"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)

    assert done.returncode == 0, done.stdout + done.stderr
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert results[0].return_value == 42
    [worker] = results[1].worker_ids
    assert worker != "eager" and results[1].return_value["worker_ids"] == [worker]


@pytest.fixture
def _close_the_async_threads_connection() -> Iterator[None]:
    yield
    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_close_the_async_threads_connection")
def test_aenqueue_and_aget_result():
    async def scenario() -> tuple[Any, Any]:
        result = await add.aenqueue(3, 4)
        return result, await add.aget_result(result.id)

    result, again = asyncio.run(scenario())

    assert result.status == again.status == TaskResultStatus.READY
    assert (again.id, again.args) == (result.id, [3, 4])
    run_job(result.job_id)

    async def refresh() -> None:
        await result.arefresh()

    asyncio.run(refresh())
    assert result.return_value == 7


# -- values PostgreSQL cannot store: InvalidTask before any SQL --------------------------------------

UNSTORABLE_TEXT = {"nul": "a\x00b", "surrogate": "a\udc80b"}


@pytest.mark.parametrize("bad", UNSTORABLE_TEXT.values(), ids=UNSTORABLE_TEXT.keys())
@pytest.mark.parametrize(
    "call",
    [
        lambda bad: noop.enqueue(bad),
        lambda bad: noop.enqueue(key={"nested": [bad]}),
        lambda bad: noop.using(queue_name=f"q{bad}", backend="open").enqueue(),
    ],
    ids=["arg", "kwarg", "queue"],
)
def test_unstorable_text_is_invalid_task_and_writes_nothing(call, bad):
    with transaction.atomic():
        with pytest.raises(InvalidTask, match="without NUL characters or lone surrogates"):
            call(bad)
        assert noop.enqueue("after").status == TaskResultStatus.READY  # the transaction is usable
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    "run_after",
    [
        datetime(9999, 12, 31, 23, 0, tzinfo=dt_timezone(timedelta(hours=-5))),
        datetime(1, 1, 1, 4, 0, tzinfo=dt_timezone(timedelta(hours=5))),
    ],
    ids=["year-10000", "year-0"],
)
def test_run_after_python_cannot_read_back_is_invalid(run_after):
    with pytest.raises(InvalidTask, match=r"run_at must be an instant in UTC years 1\.\.9999"):
        noop.using(run_after=run_after).enqueue()
    assert not Job.objects.exists()


def test_the_last_readable_run_after_round_trips():
    last = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt_timezone.utc)
    result = noop.using(run_after=last).enqueue()
    assert result.task.run_after == last
    assert task_backends["default"].get_result(result.id).status == TaskResultStatus.READY


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, 5000], ids=["one-past", "thousands"])
def test_arguments_nested_past_the_bound_are_invalid_task_not_recursion_error(depth):
    # The payload is {"args": [arg], ...}: an argument nested 99 deep makes a payload 101 deep.
    with pytest.raises(InvalidTask, match=f"nested at most {MAX_JSON_DEPTH} deep"):
        noop.enqueue(nested(depth - 1))
    assert not Job.objects.exists()


def test_arguments_nested_to_the_bound_round_trip():
    result = noop.enqueue(nested(MAX_JSON_DEPTH - 2))
    assert Job.objects.get(pk=result.id).payload["args"] == [nested(MAX_JSON_DEPTH - 2)]


# Any code point (surrogates included), nested JSON, numbers past what Python can write, wrong types.
_any_text = st.text(st.characters(exclude_categories=()) | st.sampled_from(["\x00", "\udc80"]), max_size=8)
_arguments = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _any_text | st.just(4400).map(lambda digits: 10**digits),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_any_text, children, max_size=3),
    max_leaves=12,
) | st.integers(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 1).map(nested)


@given(args=st.lists(_arguments, max_size=3), kwargs=st.dictionaries(st.sampled_from(["a", "b"]), _arguments))
def test_any_arguments_are_refused_cleanly_or_read_back_equal(args, kwargs):
    with contextlib.suppress(_ExampleDone), transaction.atomic():
        try:
            result = noop.enqueue(*args, **kwargs)
        except (InvalidTask, TypeError, ValueError):  # Django's contract for arguments that are not JSON
            assert not Job.objects.exists()
            assert noop.enqueue("after").status == TaskResultStatus.READY  # the transaction is usable
            raise _ExampleDone from None
        stored = Job.objects.get(pk=result.id).payload
        assert read_back(stored) == as_stored({"args": args, "kwargs": kwargs})
        raise _ExampleDone


class _ExampleDone(Exception):  # noqa: N818 (rolls one example back; not an error)
    pass


@pytest.mark.parametrize("bad", UNSTORABLE_TEXT.values(), ids=UNSTORABLE_TEXT.keys())
def test_unstorable_text_in_an_idempotent_tasks_arguments_is_invalid_task(bad):
    with pytest.raises(InvalidTask, match="without NUL characters or lone surrogates"):
        charge.enqueue(bad, 1000)
    assert not Job.objects.exists()
