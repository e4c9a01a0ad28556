"""Encrypted rows in every place the app stores a value (decision 0024), for the admin and dump tests.

``store_encrypted_rows`` enqueues and runs encrypted jobs (a result, a failing attempt, a checkpoint,
a handler's ``Fail`` reason, a workflow with a dead step, a keyed job), stores an encrypted ``once()``
result and an encrypted ``@idempotent`` response. Each of them carries ``SECRET``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.test import Client

from django_workhorse import EnqueueOptions, EnqueueRequest, Idempotency, enqueue, once
from django_workhorse.models import EffectRecord
from django_workhorse.outcomes.values import Fail
from django_workhorse.tasks.registry import register
from django_workhorse.tasks.retry import RetryPolicy
from django_workhorse.worker import HandlerContext
from django_workhorse.workflows import Workflow
from tests.http_views import CONTROL
from tests.worker_tasks import run_worker

SECRET = "marmalade-4c1e-plaintext"  # the distinctive text no stored row and no described page may show
FRAGMENTS = (SECRET, "4c1e-plain", "marmalade")  # the whole of it, and distinctive parts
SCOPE = "tests.encrypted-rows"
HTTP_PATH = "/http/sealed/by-argument/"  # @idempotent(..., encrypted=True): its body repeats the note
FAST_RETRY = RetryPolicy.fixed(timedelta(milliseconds=1))


@register("tests.encrypted_rows.echo")
def echo(ctx: HandlerContext, payload: Any) -> Any:
    return {"echo": payload}


@register("tests.encrypted_rows.fail")
def fail(payload: dict[str, str]) -> Any:
    raise ValueError(f"cannot handle {payload['secret']}")


@register("tests.encrypted_rows.staged")
def staged(ctx: HandlerContext, payload: dict[str, str]) -> Any:
    """Store a checkpoint; fail attempt 1 after it (an event's error); return it on attempt 2."""
    value = ctx.checkpoint("charge", lambda: {"charged": payload["secret"]})
    if ctx.attempt == 1:
        raise RuntimeError(f"crashed after charging {payload['secret']}")
    return value


@register("tests.encrypted_rows.decide")
def decide(payload: dict[str, str]) -> Any:
    raise Fail(f"gave up on {payload['secret']}")


@dataclass(frozen=True)
class EncryptedRows:
    """The ids of what ``store_encrypted_rows`` stored."""

    succeeded: int  # payload and result, keyed
    dead: int  # last_error, and each attempt's event error
    staged: int  # a checkpoint, an event's error, a result
    failed: int  # a Fail's reason
    workflow: int  # step "a" succeeded, step "b" dead
    effect: int  # a once() result
    http: int  # an @idempotent response


def store_encrypted_rows() -> EncryptedRows:
    """Store and run every kind of encrypted value (``WORKHORSE_ENCRYPTION`` must be set)."""
    payload = {"secret": SECRET}
    succeeded = enqueue("tests.encrypted_rows.echo", payload, encrypted=True, idempotency=Idempotency("rows-1"))
    dead = enqueue("tests.encrypted_rows.fail", payload, encrypted=True, max_attempts=2, retry_policy=FAST_RETRY)
    staged_id = enqueue("tests.encrypted_rows.staged", payload, encrypted=True, retry_policy=FAST_RETRY)
    failed = enqueue("tests.encrypted_rows.decide", payload, encrypted=True)
    flow = Workflow("encrypted-rows")
    step = EnqueueOptions(encrypted=True, max_attempts=1)
    flow.add("a", EnqueueRequest("tests.encrypted_rows.echo", payload, step))
    flow.add("b", EnqueueRequest("tests.encrypted_rows.fail", payload, step), after="a")
    workflow = flow.enqueue().workflow_id
    run_worker()
    once("pay:1", lambda: {"iban": SECRET, "amount": 1250}, scope=SCOPE, encrypted=True)
    CONTROL.reset()
    note = {"product": "book", "quantity": 1, "note": SECRET}
    reply = Client().post(HTTP_PATH, json.dumps(note), content_type="application/json", HTTP_IDEMPOTENCY_KEY='"rows-1"')
    assert reply.status_code == 201, reply.status_code
    return EncryptedRows(
        succeeded=succeeded,
        dead=dead,
        staged=staged_id,
        failed=failed,
        workflow=workflow,
        effect=EffectRecord.objects.get(kind="effect", scope=SCOPE).pk,
        http=EffectRecord.objects.get(kind="http").pk,
    )
