"""Traces, with the otel extra: a producer span for each enqueue call, a consumer span for each attempt.

Follows OpenTelemetry's messaging conventions: ``send <queue>`` (kind PRODUCER) around an enqueue,
whose W3C trace context is stored on the job (``Job.trace_context``, never in the fingerprint), and
``process <queue>`` (kind CONSUMER) around an attempt: the child of that context on a job's first
attempt, a root that links to it on retries and on redriven jobs. Attributes name the job id, type,
queue, keyed mode and outcome, never the key.

Nothing is traced without opentelemetry-api, nor while no SDK tracer provider is configured (the
API's default): each call then returns at once and no context is stored.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django_workhorse.encryption.jobs import shown_error
from django_workhorse.enqueueing.prepared import mode_name

if TYPE_CHECKING:
    from django_workhorse.enqueueing.prepared import PreparedJob
    from django_workhorse.sql.claims import ClaimedJob
    from django_workhorse.types import EnqueueResult
    from django_workhorse.worker.execution import Outcome

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    INSTALLED = True
except ImportError:  # opentelemetry-api is not installed: nothing is traced
    INSTALLED = False

logger = logging.getLogger(__name__)
SYSTEM = "workhorse"
# The attributes of OpenTelemetry's messaging conventions, and ours.
SYSTEM_ATTR = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
JOB_TYPE = "workhorse.job.type"
ATTEMPT = "workhorse.job.attempt"
MODE = "workhorse.enqueue.mode"
OUTCOME = "workhorse.enqueue.outcome"
OUTCOMES = "workhorse.enqueue.outcomes"
STATUS = "workhorse.attempt.status"
ATTEMPT_OUTCOME = "workhorse.attempt.outcome"
# Outcomes a handler asked for that are not errors: the span's status is OK.
OK_OUTCOMES = frozenset({"snoozed", "cancelled"})
# What a job stores of a tracestate, at most (W3C asks propagators to pass on at least 512 characters),
# and what an attempt reads back: a longer one was not written here and is left out.
MAX_TRACESTATE_CHARS = 512

_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()
_ROOT = otel_context.Context() if INSTALLED else None  # an empty context: no parent
# A version-00 traceparent, as this library writes it: version, trace id, span id, flags.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_cached: tuple[Any, Any] | None = None  # (provider, its tracer for this library)


def _tracer() -> Any:
    """This library's tracer, or None while no SDK tracer provider is configured."""
    global _cached
    if not INSTALLED:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    if _cached is None or _cached[0] is not provider:
        from django_workhorse import __version__

        _cached = (provider, provider.get_tracer("django_workhorse", __version__))
    return _cached[1]


def producing(requests: Sequence[PreparedJob]) -> contextlib.AbstractContextManager[Any]:
    """Open the producer span of one enqueue call and put its trace context on ``requests``.

    Gives the span (None when nothing is traced); an exception ends it with an error status.
    """
    tracer = _tracer()
    if tracer is None or not requests:
        return _NOTHING
    try:
        return _producer(tracer, requests)
    except Exception:  # the SDK runs the project's samplers and span processors: never fail the enqueue
        logger.exception("Starting the enqueue's span failed; enqueueing without it")
        return _NOTHING


def _producer(tracer: Any, requests: Sequence[PreparedJob]) -> _Current:
    queues = {request.queue for request in requests}
    queue = next(iter(queues)) if len(queues) == 1 else None
    attributes: dict[str, Any] = {SYSTEM_ATTR: SYSTEM, OPERATION_TYPE: "send", OPERATION_NAME: "send"}
    if queue is not None:
        attributes[DESTINATION] = queue
    if len(requests) == 1:
        attributes[JOB_TYPE] = requests[0].job_type
        attributes[MODE] = mode_name(requests[0])
    else:
        attributes[BATCH_COUNT] = len(requests)
    name = f"send {queue}" if queue is not None else "send"
    span = tracer.start_span(name, kind=trace.SpanKind.PRODUCER, attributes=attributes)
    stored = _carrier_json(span)
    if stored is not None:
        for request in requests:
            request.trace_context_json = stored
    return _Current(span)


class _Current:
    """A started span, current while the block runs and ended after it (an exception ends it with
    an error status). One plain object rather than generator-based context managers: this runs
    for every enqueue call and every attempt."""

    __slots__ = ("span", "token")

    def __init__(self, span: Any) -> None:
        self.span = span

    def __enter__(self) -> Any:
        self.token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        otel_context.detach(self.token)
        try:
            if exc is not None:
                self.span.record_exception(exc)
                self.span.set_status(trace.Status(trace.StatusCode.ERROR, kind.__name__ if kind else None))
            self.span.end()
        except Exception:  # as above: what the span processors do on end is not the work's failure
            logger.exception("Ending a span failed")


def settled(span: Any, results: Sequence[EnqueueResult]) -> None:
    """Name the job(s) and outcome(s) of an enqueue call on its producer span."""
    if span is None:
        return
    if len(results) == 1:
        span.set_attribute(MESSAGE_ID, str(results[0].job_id))
        span.set_attribute(OUTCOME, results[0].outcome.value)
    else:
        span.set_attribute(OUTCOMES, [result.outcome.value for result in results])


def refused(span: Any, outcome: str) -> None:
    """Mark an enqueue call refused as ``outcome`` (conflict) on its producer span."""
    if span is not None:
        span.set_attribute(OUTCOME, outcome)


def processing(job: ClaimedJob) -> contextlib.AbstractContextManager[Any]:
    """Open the consumer span of one attempt of ``job``: the child of its enqueue's span on the
    first attempt of a job never redriven, else a root span linked to it. Gives the span or None."""
    tracer = _tracer()
    if tracer is None:
        return _NOTHING
    try:
        return _consumer(tracer, job)
    except Exception:  # the project's samplers and span processors must not fail the attempt
        logger.exception("Starting the attempt's span failed id=%s; running it without", job.id)
        return _NOTHING


def _consumer(tracer: Any, job: ClaimedJob) -> _Current:
    attributes = {
        SYSTEM_ATTR: SYSTEM,
        OPERATION_TYPE: "process",
        OPERATION_NAME: "process",
        DESTINATION: job.queue,
        MESSAGE_ID: str(job.id),
        JOB_TYPE: job.job_type,
        ATTEMPT: job.attempt,
    }
    produced = _produced_context(job.trace_context)
    parent, links = _ROOT, []  # a root unless it continues its producer's trace
    if produced is not None:
        if job.attempt == 1 and job.root_id == job.id:
            parent = produced
        else:
            links = [trace.Link(trace.get_current_span(produced).get_span_context())]
    span = tracer.start_span(
        f"process {job.queue}", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes, links=links
    )
    return _Current(span)


def finished(span: Any, outcome: Outcome) -> None:
    """Give the consumer span the attempt's outcome: OK when it succeeded, snoozed or was cancelled,
    else an error status."""
    if span is None:
        return
    try:
        span.set_attribute(STATUS, outcome.status)
        span.set_attribute(ATTEMPT_OUTCOME, outcome.kind)
        if outcome.kind in OK_OUTCOMES:
            span.set_status(trace.Status(trace.StatusCode.OK))
        elif outcome.status != "succeeded":  # outcome.error is storable text already
            error = shown_error(outcome.error, outcome.job.cipher_salt, outcome.exception)
            span.set_status(trace.Status(trace.StatusCode.ERROR, error.partition("\n")[0] or outcome.status))
        if outcome.exception is not None and outcome.job.cipher_salt is None:  # its message may quote the payload
            _record_exception(span, outcome.exception)
    except Exception:  # the span is the report, not the outcome: the outcome stands as decided
        logger.exception("Describing the attempt on its span failed id=%s", outcome.job.id)


def _record_exception(span: Any, exc: BaseException) -> None:
    """Record ``exc`` on ``span``; by its type alone when its own ``__str__`` or ``__repr__`` fails."""
    try:
        span.record_exception(exc)  # formats the exception: its own code runs
    except Exception:
        span.add_event("exception", {"exception.type": f"{type(exc).__module__}.{type(exc).__qualname__}"})


def _carrier_json(span: Any) -> str | None:
    """The W3C trace context of ``span`` as the JSON text a job stores, or None if it has none.

    Written as the W3C propagator writes it (``traceparent: 00-<trace>-<span>-<flags>``), without
    building a context for it: this runs on every traced enqueue.
    """
    context = span.get_span_context()
    if not context.is_valid:
        return None
    stored = {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"}
    state = context.trace_state.to_header() if context.trace_state else ""
    if state and len(state) <= MAX_TRACESTATE_CHARS:
        stored["tracestate"] = state
    return json.dumps(stored, separators=(",", ":"))


def _produced_context(stored: Any) -> Any:
    """The context stored on a job, or None if it has none (or none this version can read).

    Read as the W3C propagator reads a version-00 traceparent, without its carrier machinery:
    this runs for every attempt.
    """
    if not isinstance(stored, dict):
        return None
    parent = stored.get("traceparent")
    found = _TRACEPARENT.fullmatch(parent) if isinstance(parent, str) else None
    if found is None:
        return None
    trace_id, span_id = int(found[1], 16), int(found[2], 16)
    if not trace_id or not span_id:  # the all-zero ids are invalid
        return None
    context = trace.SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=trace.TraceFlags(int(found[3], 16)),
        trace_state=_stored_trace_state(stored.get("tracestate")),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(context), _ROOT)


def _stored_trace_state(state: Any) -> Any:
    """The stored tracestate, or None when there is none or it is longer than a job stores: parsed
    on every attempt, carried on by every span, and quoted in full in OpenTelemetry's warning when
    malformed, it is bounded before anything reads it."""
    if not isinstance(state, str) or not state or len(state) > MAX_TRACESTATE_CHARS:
        return None
    return trace.TraceState.from_header([state])
