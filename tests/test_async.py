"""aenqueue, aenqueue_with_result and aenqueue_many: the same decisions from async code."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from django_workhorse import (
    EnqueueOutcome,
    EnqueueRequest,
    EnqueueResult,
    Idempotency,
    aenqueue,
    aenqueue_many,
    aenqueue_with_result,
)
from django_workhorse.models import Job
from django_workhorse.workflows import WorkflowResult

pytestmark = pytest.mark.django_db(transaction=True)  # the coroutines run on another thread


@pytest.fixture(autouse=True)
def _close_the_async_threads_connection() -> Iterator[None]:
    yield
    # sync_to_async runs Django's database work on one shared thread, whose connection a request
    # would close at its end; close it here so the test database can be dropped.
    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


def test_aenqueue_enqueues_and_replays_like_enqueue():
    key = Idempotency("async-order-1")

    async def twice() -> tuple[int, EnqueueResult]:
        first = await aenqueue("tests.record", {"n": 1}, idempotency=key)
        again = await aenqueue_with_result("tests.record", {"n": 1}, idempotency=key)
        return first, again

    first, again = asyncio.run(twice())

    assert again == EnqueueResult(first, EnqueueOutcome.REPLAYED)
    assert list(Job.objects.values_list("id", "payload")) == [(first, {"n": 1})]


def test_aenqueue_many_answers_in_input_order():
    requests = [EnqueueRequest("tests.record", {"n": n}) for n in range(3)]
    results = asyncio.run(aenqueue_many(requests))
    assert [r.outcome for r in results] == [EnqueueOutcome.ACCEPTED] * 3
    assert [Job.objects.get(pk=r.job_id).payload for r in results] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_a_workflows_aenqueue_enqueues_and_replays_like_enqueue():
    from django_workhorse import Workflow

    def fulfil() -> Workflow:
        wf = Workflow("async fulfil", idempotency=Idempotency("async-fulfil-1"))
        wf.add("charge", EnqueueRequest("tests.record", {"n": 1}))
        wf.add("close", EnqueueRequest("tests.record", {"n": 2}), after=["charge"])
        return wf

    async def twice() -> tuple[WorkflowResult, WorkflowResult]:
        return await fulfil().aenqueue(), await fulfil().aenqueue()

    first, again = asyncio.run(twice())

    assert (first.outcome, again.outcome) == (EnqueueOutcome.ACCEPTED, EnqueueOutcome.REPLAYED)
    assert again.jobs == first.jobs and again.workflow_id == first.workflow_id
    steps = dict(Job.objects.values_list("step_name", "status"))
    assert steps == {"charge": "queued", "close": "waiting"}
