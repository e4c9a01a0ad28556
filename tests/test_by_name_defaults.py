"""A job type has one set of defaults: an enqueue by a ``@task``'s name takes the task's options
exactly as the task's own calls do; what the caller gives wins (decision 0020)."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import modify_settings

from django_workhorse import (
    EnqueueIdempotencyConflictError,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    EnqueueResult,
    Idempotency,
    RetryPolicy,
    aenqueue,
    aenqueue_many,
    aenqueue_with_result,
    enqueue,
    enqueue_many,
    enqueue_with_result,
    register,
    task,
)
from django_workhorse.models import Job
from django_workhorse.tasks import registry
from django_workhorse.tasks.retry import DEFAULT_RETRY_POLICY
from tests.conftest import race

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "tests.by_name.confirm"
PLAIN = "tests.by_name.plain"
POLICY = RetryPolicy.fixed(timedelta(seconds=7))


@task(name=NAME, queue="mail", priority=40, max_attempts=3, retry_policy=POLICY, timeout=timedelta(seconds=30))
def confirm(order_id: int, copy_to: str | None = None) -> None:
    pass


register(PLAIN, lambda payload: None)

TASK_DEFAULTS = ("mail", 40, 3, POLICY.to_json(), timedelta(seconds=30))
GLOBAL_DEFAULTS = ("default", 0, 25, DEFAULT_RETRY_POLICY.to_json(), None)
PAYLOAD = {"order_id": 1, "copy_to": None}  # what confirm.enqueue(1) stores


def stored(job_id: int) -> tuple[Any, ...]:
    return tuple(Job.objects.values_list("queue", "priority", "max_attempts", "retry_policy", "timeout").get(pk=job_id))


def key(name: str = "order-1") -> Idempotency:
    return Idempotency(name, scope="by-name")


# -- one set of defaults -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "by_name",
    [
        lambda: enqueue(NAME, PAYLOAD),
        lambda: enqueue_with_result(NAME, PAYLOAD).job_id,
        lambda: enqueue(NAME, PAYLOAD, EnqueueOptions()),
        lambda: enqueue(NAME, PAYLOAD, EnqueueOptions(tags=["x"])),
        lambda: enqueue_many([EnqueueRequest(NAME, PAYLOAD)])[0].job_id,
        lambda: (
            enqueue_many([EnqueueRequest(PLAIN), EnqueueRequest(NAME, PAYLOAD, EnqueueOptions(tags=["x"]))])[1].job_id
        ),
    ],
    ids=["enqueue", "enqueue_with_result", "empty-options", "other-options", "enqueue_many", "mixed-batch"],
)
def test_enqueue_by_task_name_takes_the_task_defaults(by_name):
    assert stored(by_name()) == stored(confirm.enqueue(1)) == TASK_DEFAULTS


def test_async_enqueue_by_task_name_takes_the_task_defaults():
    async def enqueue_three() -> list[int]:
        first = await aenqueue(NAME, PAYLOAD)
        second = (await aenqueue_with_result(NAME, PAYLOAD)).job_id
        (third,) = await aenqueue_many([EnqueueRequest(NAME, PAYLOAD)])
        return [first, second, third.job_id]

    try:
        job_ids = asyncio.run(enqueue_three())
    finally:
        asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())
    assert [stored(job_id) for job_id in job_ids] == [TASK_DEFAULTS] * 3


def test_a_job_type_without_a_task_keeps_the_global_defaults_beside_one_with_a_task():
    plain, unregistered, by_name = enqueue_many(
        [EnqueueRequest(PLAIN, {}), EnqueueRequest("tests.by_name.unregistered", {}), EnqueueRequest(NAME, PAYLOAD)]
    )

    assert [stored(r.job_id) for r in (plain, unregistered, by_name)] == [GLOBAL_DEFAULTS] * 2 + [TASK_DEFAULTS]
    assert stored(enqueue(PLAIN, {})) == GLOBAL_DEFAULTS
    assert stored(enqueue(NAME, PAYLOAD)) == TASK_DEFAULTS


# -- explicit wins -----------------------------------------------------------------------------------

# At the global defaults' values: given, they still win over the task's.
EXPLICIT: dict[str, Any] = {"queue": "default", "priority": 0, "timeout": None}
WITH_EXPLICIT = ("default", 0, 3, POLICY.to_json(), None)


@pytest.mark.parametrize(
    "by_name",
    [
        lambda: enqueue(NAME, PAYLOAD, **EXPLICIT),
        lambda: enqueue(NAME, PAYLOAD, EnqueueOptions(**EXPLICIT)),
        lambda: enqueue(NAME, PAYLOAD, EnqueueOptions(queue="elsewhere", priority=5, timeout=None), **EXPLICIT),
        lambda: enqueue_with_result(NAME, PAYLOAD, EnqueueOptions(queue="default"), priority=0, timeout=None).job_id,
        lambda: enqueue_many([EnqueueRequest(NAME, PAYLOAD, EnqueueOptions(**EXPLICIT))])[0].job_id,
    ],
    ids=["keywords", "options", "keywords-over-options", "options-and-keywords", "enqueue_many"],
)
def test_options_given_explicitly_win_even_at_the_global_default(by_name):
    assert stored(by_name()) == stored(confirm.apply_async((1,), **EXPLICIT).job_id) == WITH_EXPLICIT


def test_a_task_request_keeps_its_explicit_options_through_enqueue_many():
    # as_request's options say every value: the batch does not fill in the task's again.
    request = confirm.as_request((1,), **EXPLICIT)

    results = enqueue_many([request, EnqueueRequest(NAME, PAYLOAD)])

    assert [stored(r.job_id) for r in results] == [WITH_EXPLICIT, TASK_DEFAULTS]
    assert stored(enqueue(NAME, PAYLOAD, request.options)) == WITH_EXPLICIT


# -- one fingerprint ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (
            lambda: enqueue_with_result(NAME, PAYLOAD, idempotency=key()),
            lambda: confirm.apply_async((1,), idempotency=key()),
        ),
        (
            lambda: confirm.apply_async((1,), idempotency=key()),
            lambda: enqueue_with_result(NAME, PAYLOAD, idempotency=key()),
        ),
        (
            lambda: enqueue_many([EnqueueRequest(NAME, PAYLOAD, EnqueueOptions(idempotency=key()))])[0],
            lambda: enqueue_many([confirm.as_request((1,), idempotency=key())])[0],
        ),
        (
            lambda: enqueue_with_result(NAME, PAYLOAD, queue="mail", priority=40, idempotency=key()),
            lambda: enqueue_with_result(NAME, PAYLOAD, idempotency=key()),
        ),
    ],
    ids=["by-name-then-task", "task-then-by-name", "batches", "defaults-spelled-out"],
)
def test_keyed_enqueue_by_name_and_by_task_replay_each_other(first, second):
    accepted, replayed = first(), second()

    assert accepted.outcome is EnqueueOutcome.ACCEPTED
    assert replayed == EnqueueResult(accepted.job_id, EnqueueOutcome.REPLAYED)
    assert Job.objects.count() == 1


def test_a_batch_mixing_both_spellings_of_one_key_gives_one_job():
    results = enqueue_many(
        [EnqueueRequest(NAME, PAYLOAD, EnqueueOptions(idempotency=key())), confirm.as_request((1,), idempotency=key())]
    )

    assert [r.outcome for r in results] == [EnqueueOutcome.ACCEPTED, EnqueueOutcome.REPLAYED]
    assert results[0].job_id == results[1].job_id


def test_concurrent_keyed_enqueues_in_both_spellings_give_one_job():
    def submit(i: int) -> EnqueueResult:
        if i % 2:
            return confirm.apply_async((1,), idempotency=key("raced"))
        return enqueue_with_result(NAME, PAYLOAD, idempotency=key("raced"))

    results = race(8, submit)

    assert all(isinstance(r, EnqueueResult) for r in results), results
    assert sorted(r.outcome for r in results) == sorted([EnqueueOutcome.ACCEPTED] + [EnqueueOutcome.REPLAYED] * 7)
    assert len({r.job_id for r in results}) == 1
    assert Job.objects.count() == 1


def test_an_explicit_global_default_is_a_different_request_from_the_task_default():
    enqueue(NAME, PAYLOAD, idempotency=key())

    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue(NAME, PAYLOAD, queue="default", idempotency=key())

    assert caught.value.conflicting_fields == ("queue",)


# -- a task this process has not imported yet --------------------------------------------------------


def test_enqueue_by_name_imports_the_apps_tasks_modules_once_to_find_the_task(monkeypatch):
    monkeypatch.setattr(registry, "_tasks_discovered", False)
    monkeypatch.delitem(sys.modules, "tests.discovery_app.tasks", raising=False)
    with modify_settings(INSTALLED_APPS={"append": "tests.discovery_app"}):
        job_id = enqueue("tests.discovery_app.undiscovered", {})

    assert "tests.discovery_app.tasks" in sys.modules
    assert Job.objects.values_list("queue", "priority").get(pk=job_id) == ("discovered", 7)
    assert registry._tasks_discovered
