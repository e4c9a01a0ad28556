"""django-workhorse's async producer, ``aenqueue``, for the peer harness (W1 and W5; copied beside
bench.py by run.sh).

``aenqueue`` runs ``enqueue`` on Django's thread for database work (``sync_to_async`` with
``thread_sensitive=True``: Django's connections belong to a thread), so the harness's eight
coroutines of the W5 race take turns on one thread and one connection. The run measures what that
costs beside eight producer threads (``workhorse``) and pgqueuer's eight coroutines.
"""

from __future__ import annotations

from typing import Any

from peer_workhorse import SAME_REQUEST, WorkhorseAdapter


class Client:
    async def enqueue_one(self, payload: Any, task: str = "noop") -> None:
        from django_workhorse import aenqueue

        await aenqueue(task, payload)

    async def enqueue_batch(self, payloads: Any) -> None:
        from django_workhorse import EnqueueRequest, aenqueue_many

        await aenqueue_many([EnqueueRequest("noop", p) for p in payloads])

    async def enqueue_unique(self, key: str, payload: Any) -> bool:
        from django_workhorse import EnqueueOutcome, Idempotency, aenqueue_with_result

        result = await aenqueue_with_result("noop", SAME_REQUEST, idempotency=Idempotency(key))
        return result.outcome == EnqueueOutcome.ACCEPTED

    async def close(self) -> None:
        pass


class WorkhorseAsyncAdapter(WorkhorseAdapter):
    name = "workhorse_async"
    is_async = True
    notes = "django-workhorse's aenqueue (enqueue on Django's thread for database work); W1, W2 and W5"

    async def open_client(self) -> Client:
        return Client()


ADAPTER = WorkhorseAsyncAdapter
