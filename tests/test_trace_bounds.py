"""A tracestate stored on a job is bounded when an attempt reads it back (a job stores at most the
512 characters W3C asks propagators to keep): a longer one, written by something other than this
library, is neither parsed, logged nor carried on, and the job still runs as the child of its
traceparent."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from django_workhorse import enqueue
from django_workhorse.models import Job
from django_workhorse.observability.tracing import MAX_TRACESTATE_CHARS
from tests.test_tracing import named, spans  # noqa: F401 (the fixture)
from tests.worker_tasks import run_worker

pytestmark = pytest.mark.django_db(transaction=True)

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"


def run_with_stored(queue: str, stored: object) -> int:
    job_id = enqueue("tests.record", {"n": 1}, queue=queue)
    Job.objects.filter(pk=job_id).update(trace_context=stored)
    run_worker(queues=[queue])
    assert Job.objects.get(pk=job_id).status == "succeeded"
    return job_id


def test_a_two_megabyte_stored_tracestate_is_neither_logged_nor_carried_on(spans, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG)
    run_with_stored("t-huge-state", {"traceparent": TRACEPARENT, "tracestate": "x" * 2_000_000})

    [process] = named(spans, "process t-huge-state")
    assert process.parent is not None and (process.parent.trace_id, process.parent.span_id) == (TRACE_ID, SPAN_ID)
    assert not process.context.trace_state
    assert max(len(record.getMessage()) for record in caplog.records) < 2_000


def test_a_well_formed_tracestate_past_the_bound_is_not_carried_on_and_one_at_it_is(spans):  # noqa: F811
    at = f"k0={'v' * 200},k1={'v' * 200},k2={'v' * 101}"  # every member well formed
    over = at + "v"
    assert len(at) == MAX_TRACESTATE_CHARS
    dropped = run_with_stored("t-long-state", {"traceparent": TRACEPARENT, "tracestate": over})
    kept = run_with_stored("t-long-state", {"traceparent": TRACEPARENT, "tracestate": at})

    process = {(s.attributes or {})["messaging.message.id"]: s for s in named(spans, "process t-long-state")}
    assert not process[str(dropped)].context.trace_state
    assert process[str(dropped)].context.trace_id == TRACE_ID
    assert process[str(kept)].context.trace_state.to_header() == at


def test_a_claim_reads_a_huge_stored_context_as_its_traceparent_only():
    from django.db import connection

    from django_workhorse import sql

    small = {"traceparent": TRACEPARENT, "tracestate": "k=v"}
    big = {"traceparent": TRACEPARENT, "tracestate": "x" * 2_000_000}  # compresses to far less than 2 MB
    ids = [enqueue("tests.record", {"n": n}, queue="t-claimed-context") for n in range(3)]
    Job.objects.filter(pk=ids[0]).update(trace_context=small)
    Job.objects.filter(pk=ids[1]).update(trace_context=big)

    claimed = sql.claims.claim(
        connection.alias, queues=["t-claimed-context"], limit=3, lease=timedelta(minutes=1), worker="w"
    )

    contexts = {job.id: job.trace_context for job in claimed}
    assert contexts == {ids[0]: small, ids[1]: {"traceparent": TRACEPARENT}, ids[2]: None}
