"""Traces: producer spans at enqueue, the trace context on the job, consumer spans in the worker.

The OpenTelemetry SDK records into an in-memory exporter, set as the global tracer provider for
each test and taken away afterwards (as OpenTelemetry's own tests do), so every other test runs
without an SDK, as most deployments without the otel extra do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util._once import Once

from django_workhorse import (
    EnqueueIdempotencyConflictError,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    Idempotency,
    RetryPolicy,
    enqueue,
    enqueue_many,
    enqueue_with_result,
    redrive,
    register,
)
from django_workhorse.models import Job
from tests.worker_tasks import run_worker

pytestmark = pytest.mark.django_db(transaction=True)

FAST = RetryPolicy.fixed(timedelta(milliseconds=1))
KEY = "trace-key-5c1e-secret"


def _reset_global_provider() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    _reset_global_provider()


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name.startswith(prefix)]


def stored_context(job_id: int) -> dict[str, str] | None:
    return Job.objects.get(pk=job_id).trace_context


def traceparent_of(span: ReadableSpan) -> str:
    """What OpenTelemetry's own W3C propagator writes for ``span``."""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(NonRecordingSpan(span.context)))
    return carrier["traceparent"]


def test_enqueue_makes_a_producer_span_and_stores_its_context_on_the_job(spans):
    job_id = enqueue("tests.record", {"n": 1}, queue="t-send", idempotency=Idempotency(KEY, scope="traces"))

    [span] = named(spans, "send")
    assert (span.name, span.kind) == ("send t-send", SpanKind.PRODUCER)
    assert dict(span.attributes or {}) == {
        "messaging.system": "workhorse",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "t-send",
        "messaging.message.id": str(job_id),
        "workhorse.job.type": "tests.record",
        "workhorse.enqueue.mode": "idempotency",
        "workhorse.enqueue.outcome": "accepted",
    }
    assert KEY not in json.dumps(dict(span.attributes or {}))
    assert stored_context(job_id) == {"traceparent": traceparent_of(span)}


def test_a_replay_from_another_trace_still_replays_and_the_job_keeps_its_first_context(spans):
    tracer = trace.get_tracer("tests")
    key = Idempotency(KEY, scope="traces")
    with tracer.start_as_current_span("first request"):
        first = enqueue_with_result("tests.record", {"n": 1}, queue="t-replay", idempotency=key)
    with tracer.start_as_current_span("retried request"):
        again = enqueue_with_result("tests.record", {"n": 1}, queue="t-replay", idempotency=key)

    assert (again.job_id, again.outcome) == (first.job_id, EnqueueOutcome.REPLAYED)
    sent, replayed = named(spans, "send")
    first_request, retried_request = named(spans, "first"), named(spans, "retried")
    assert sent.parent is not None and sent.parent.span_id == first_request[0].context.span_id
    assert replayed.parent is not None and replayed.parent.span_id == retried_request[0].context.span_id
    assert sent.context.trace_id != replayed.context.trace_id
    assert (replayed.attributes or {})["workhorse.enqueue.outcome"] == "replayed"
    assert (replayed.attributes or {})["messaging.message.id"] == str(first.job_id)
    assert stored_context(first.job_id) == {"traceparent": traceparent_of(sent)}


def test_a_conflict_ends_the_producer_span_with_an_error(spans):
    key = Idempotency(KEY, scope="traces")
    enqueue("tests.record", {"n": 1}, queue="t-conflict", idempotency=key)
    with pytest.raises(EnqueueIdempotencyConflictError):
        enqueue("tests.record", {"n": 2}, queue="t-conflict", idempotency=key)

    _, refused = named(spans, "send")
    assert refused.status.status_code is StatusCode.ERROR
    assert (refused.attributes or {})["workhorse.enqueue.outcome"] == "conflict"
    assert [event.name for event in refused.events] == ["exception"]
    assert KEY not in json.dumps([dict(event.attributes or {}) for event in refused.events])


def test_a_batch_is_one_producer_span_whose_context_every_job_stores(spans):
    options = EnqueueOptions(queue="t-batch")
    results = enqueue_many([EnqueueRequest("tests.record", {"n": n}, options) for n in range(3)])

    [span] = named(spans, "send")
    assert span.name == "send t-batch"
    assert (span.attributes or {})["messaging.batch.message_count"] == 3
    assert list((span.attributes or {})["workhorse.enqueue.outcomes"]) == ["accepted"] * 3
    assert {json.dumps(stored_context(result.job_id)) for result in results} == {
        json.dumps({"traceparent": traceparent_of(span)})
    }


def test_a_batch_over_several_queues_names_no_destination(spans):
    enqueue_many(
        [
            EnqueueRequest("tests.record", {"n": 1}, EnqueueOptions(queue="t-a")),
            EnqueueRequest("tests.record", {"n": 2}, EnqueueOptions(queue="t-b")),
        ]
    )
    [span] = named(spans, "send")
    assert span.name == "send" and "messaging.destination.name" not in (span.attributes or {})


def test_the_first_attempt_is_a_child_of_the_enqueue_and_a_retry_links_to_it(spans):
    job_id = enqueue("tests.fail_until", {"succeed_on": 2}, queue="t-retry", max_attempts=3, retry_policy=FAST)
    run_worker(queues=["t-retry"], max_jobs=2)

    [sent] = named(spans, "send")
    first, second = sorted(named(spans, "process"), key=lambda span: (span.attributes or {})["workhorse.job.attempt"])
    for span in (first, second):
        assert (span.name, span.kind) == ("process t-retry", SpanKind.CONSUMER)
        assert (span.attributes or {})["messaging.message.id"] == str(job_id)
        assert (span.attributes or {})["messaging.operation.type"] == "process"
    # Attempt 1 continues the producer's trace.
    assert first.parent is not None and first.parent.span_id == sent.context.span_id
    assert first.context.trace_id == sent.context.trace_id and not first.links
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["workhorse.attempt.status"] == "queued"
    assert [event.name for event in first.events] == ["exception"]
    # Attempt 2 is a trace of its own, linked to the enqueue.
    assert second.parent is None and second.context.trace_id != sent.context.trace_id
    assert [link.context.span_id for link in second.links] == [sent.context.span_id]
    assert second.status.status_code is StatusCode.UNSET
    assert (second.attributes or {})["workhorse.attempt.status"] == "succeeded"
    assert Job.objects.get(pk=job_id).status == "succeeded"


def test_a_redriven_job_links_to_the_enqueue_of_the_job_it_replaces(spans):
    dead = enqueue("tests.always_fail", {"n": 1}, queue="t-redrive", max_attempts=1)
    run_worker(queues=["t-redrive"])
    again = redrive(dead, request_id="trace-redrive")
    run_worker(queues=["t-redrive"])

    [sent] = named(spans, "send")
    assert stored_context(again) == stored_context(dead)
    [redriven] = [s for s in named(spans, "process") if (s.attributes or {})["messaging.message.id"] == str(again)]
    assert (redriven.attributes or {})["workhorse.job.attempt"] == 1
    assert redriven.parent is None
    assert [link.context.span_id for link in redriven.links] == [sent.context.span_id]


TRACED_CHILD: dict[str, Any] = {}


@register("tests.trace.enqueue_child")
def enqueue_child(payload: Any) -> int:
    TRACED_CHILD["id"] = enqueue("tests.record", {"child": True}, queue="t-child")
    return TRACED_CHILD["id"]


def test_a_handler_that_enqueues_continues_the_trace(spans):
    enqueue("tests.trace.enqueue_child", {}, queue="t-parent")
    run_worker(queues=["t-parent"])

    [process] = named(spans, "process t-parent")
    [child_send] = named(spans, "send t-child")
    assert child_send.parent is not None and child_send.parent.span_id == process.context.span_id
    assert stored_context(TRACED_CHILD["id"]) == {"traceparent": traceparent_of(child_send)}


@pytest.mark.parametrize(
    "stored",
    [
        {"traceparent": "not a traceparent"},
        {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"},  # the invalid (all-zero) ids
        {"traceparent": 17},
        ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"],
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ],
    ids=["garbage", "zero ids", "not text", "a list", "a bare string"],
)
def test_a_stored_context_that_cannot_be_read_gives_a_root_span_and_the_job_still_runs(spans, stored):
    job_id = enqueue("tests.record", {"n": 1}, queue="t-garbled")
    Job.objects.filter(pk=job_id).update(trace_context=stored)
    run_worker(queues=["t-garbled"])

    [process] = named(spans, "process t-garbled")
    assert process.parent is None and not process.links
    assert Job.objects.get(pk=job_id).status == "succeeded"


def test_a_long_tracestate_is_left_out_and_a_short_one_kept(spans):
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState

    def remote(state: TraceState) -> Any:
        """A caller's span from another service, whose tracestate the producer span inherits."""
        context = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True, TraceFlags(1), state)
        return trace.use_span(NonRecordingSpan(context))

    short = TraceState([("vendor", "v" * 10)])
    long = TraceState([(f"k{n}", "v" * 200) for n in range(3)])  # over 512 characters in all
    with remote(short):
        kept = enqueue("tests.record", {"n": 1}, queue="t-state")
    with remote(long):
        dropped = enqueue("tests.record", {"n": 2}, queue="t-state")

    assert (stored_context(kept) or {})["tracestate"] == "vendor=" + "v" * 10
    assert "tracestate" not in (stored_context(dropped) or {})
    # The worker reads it back: the first attempt's span carries the caller's tracestate on.
    run_worker(queues=["t-state"])
    process = {(s.attributes or {})["messaging.message.id"]: s for s in named(spans, "process t-state")}
    assert process[str(kept)].context.trace_state.to_header() == "vendor=" + "v" * 10
    assert process[str(kept)].context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert not process[str(dropped)].context.trace_state


def test_without_an_sdk_nothing_is_traced_or_stored():
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    job_id = enqueue("tests.record", {"n": 1}, queue="t-off")
    run_worker(queues=["t-off"])
    job = Job.objects.get(pk=job_id)
    assert (job.trace_context, job.status) == (None, "succeeded")


@pytest.mark.parametrize("kind", ["unprintable_error", "not_text_error", "nul_error", "surrogate_result"])
def test_with_tracing_on_a_poison_outcome_still_kills_its_own_attempt_only(spans, kind):
    from tests.test_worker_poison import POISONS, enqueue_pair

    poison, good = enqueue_pair(kind)
    stats = run_worker(concurrency=2, batch=2, timeout=30)

    assert stats.finished == {"dead": 1, "succeeded": 1} and stats.failed_threads == []
    assert Job.objects.get(pk=poison).last_error.startswith(POISONS[kind])
    assert Job.objects.get(pk=good).status == "succeeded"
    statuses = {(s.attributes or {})["messaging.message.id"]: s.status.status_code for s in named(spans, "process")}
    assert statuses == {str(poison): StatusCode.ERROR, str(good): StatusCode.UNSET}


class Raising(SimpleSpanProcessor):
    """A project's span processor with a bug: it raises when a span starts or ends."""

    def __init__(self, on: str) -> None:
        super().__init__(InMemorySpanExporter())
        self.on = on

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.on == "start":
            raise RuntimeError("span processor broken on start")

    def on_end(self, span: Any) -> None:
        if self.on == "end":
            raise RuntimeError("span processor broken on end")


@pytest.mark.parametrize("on", ["start", "end"])
def test_a_broken_span_processor_fails_neither_enqueue_nor_the_attempt(spans, on, caplog):
    trace.get_tracer_provider().add_span_processor(Raising(on))  # type: ignore[attr-defined]
    key = Idempotency(KEY, scope="traces")
    first = enqueue("tests.record", {"n": 1}, queue="t-broken", idempotency=key)
    assert enqueue("tests.record", {"n": 1}, queue="t-broken", idempotency=key) == first
    run_worker(queues=["t-broken"])

    assert Job.objects.get(pk=first).status == "succeeded"
    logged = {
        r.getMessage().split(" id=")[0] for r in caplog.records if r.name == "django_workhorse.observability.tracing"
    }
    if on == "start":
        assert logged == {
            "Starting the enqueue's span failed; enqueueing without it",
            "Starting the attempt's span failed",
        }
    else:
        assert logged == {"Ending a span failed"}


def test_a_debounce_replacement_from_another_trace_keeps_the_jobs_first_context(spans):
    from django_workhorse import Debounce

    tracer = trace.get_tracer("tests")
    key = Debounce("trace-debounce", timedelta(minutes=5), scope="traces")
    with tracer.start_as_current_span("first request"):
        first = enqueue_with_result("tests.record", {"n": 1}, queue="t-debounce", debounce=key)
    with tracer.start_as_current_span("second request"):
        second = enqueue_with_result("tests.record", {"n": 2}, queue="t-debounce", debounce=key)

    assert (second.job_id, second.outcome) == (first.job_id, EnqueueOutcome.REPLACED)
    sent, replaced = named(spans, "send")
    assert (replaced.attributes or {})["workhorse.enqueue.outcome"] == "replaced"
    assert Job.objects.get(pk=first.job_id).payload == {"n": 2}  # the definition was replaced
    assert stored_context(first.job_id) == {"traceparent": traceparent_of(sent)}  # the context was not
