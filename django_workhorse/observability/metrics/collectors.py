"""The metrics, in prometheus-client's registry, and how each event updates them.

Importing this module needs prometheus-client; ``django_workhorse.observability.instruments`` imports it only
when it is installed.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from django_workhorse.conf import app_settings
from django_workhorse.enqueueing.prepared import mode_name
from django_workhorse.observability.metrics import multiprocess_dir

if TYPE_CHECKING:
    from django_workhorse.enqueueing.prepared import PreparedJob
    from django_workhorse.sql.claims import ClaimedJob
    from django_workhorse.types import EnqueueResult

# Enqueue calls take about a millisecond; handlers anything from microseconds to hours.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
HANDLER_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

# The job_type label is empty ("", which Prometheus stores as no label at all) unless
# WORKHORSE_METRICS_JOB_TYPE_LABEL is on: job types are as many as the project's tasks.
ENQUEUE_REQUESTS = Counter(
    "workhorse_enqueue_requests",
    "Enqueue requests by queue, keyed mode (workflow: a workflow's steps) and outcome (accepted, replayed, "
    "replaced, non_replaceable, coalesced, conflict, invalid).",
    ["queue", "mode", "outcome", "job_type"],
)
KEYED_REQUESTS_NAME = "workhorse_keyed_requests"
KEYED_REQUESTS = Counter(
    KEYED_REQUESTS_NAME,
    "Keyed enqueue requests by idempotency scope and outcome: replayed, coalesced and replaced are "
    "duplicates the keys saved; conflict is a key reused for different work.",
    ["scope", "outcome"],
)
ENQUEUE_DURATION = Histogram(
    "workhorse_enqueue_duration_seconds",
    "Time of one enqueue call (its statements included), by keyed mode (batch for enqueue_many, workflow).",
    ["mode"],
    buckets=FAST_BUCKETS,
)
CLAIM_DURATION = Histogram(
    "workhorse_claim_duration_seconds",
    "Time of one claim statement of a worker, its round trip included.",
    buckets=FAST_BUCKETS,
)
ATTEMPTS_FINISHED = Counter(
    "workhorse_attempts_finished",
    "Finished attempts by queue, what was written (status: succeeded, queued (a retry or a snooze), dead, "
    "cancelled, lost (the lease was gone) or unrecorded) and what the attempt came to (outcome: succeeded, "
    "retry, snoozed, cancelled, failed (dead at once by the handler's decision), dead or lost).",
    ["queue", "status", "job_type", "outcome"],
)
HANDLER_DURATION = Histogram(
    "workhorse_handler_duration_seconds",
    "Time the handler of an attempt ran, by queue.",
    ["queue", "job_type"],
    buckets=HANDLER_BUCKETS,
)
WAIT_DURATION = Histogram(
    "workhorse_wait_duration_seconds",
    "Time from a job's run_at to the start of its attempt, by queue (on PostgreSQL's clock).",
    ["queue", "job_type"],
    buckets=HANDLER_BUCKETS,
)
LEASE_LOSSES = Counter(
    "workhorse_lease_losses", "Attempts whose lease was lost before their outcome was written.", ["queue"]
)
DEAD_LETTERS = Counter(
    "workhorse_dead_letters", "Jobs that went dead (their last attempt failed), by queue.", ["queue"]
)
# Labelled by the state only: breaker keys are as many as the destinations (the state gauge, read
# from the database, carries the key).
BREAKER_TRANSITIONS = Counter(
    "workhorse_breaker_transitions",
    "Circuit breaker state changes this process wrote, by the state it went to (open, half_open, closed).",
    ["to"],
)
RECLAIMS = Counter("workhorse_reclaims", "Jobs whose expired leases a worker reclaimed.")
REDRIVES = Counter("workhorse_redrives", "Dead jobs run again as new jobs (repeats of a redrive excluded).", ["queue"])
SCHEDULE_TICKS = Counter(
    "workhorse_schedule_ticks",
    "Schedule ticks by schedule and outcome: accepted (this process enqueued the tick's job), replayed "
    "(another worker had), skipped (catch_up or overlap), conflict (another definition of it had).",
    ["schedule", "outcome"],
)
# Set by each evaluation: in multiprocess mode the largest value of the live processes (they read
# the same code and settings).
SCHEDULES_LEFT_OUT = Gauge(
    "workhorse_schedules_left_out",
    "Declared schedules this process's evaluation leaves out, by the system check that reports them "
    "(workhorse.E203-E208); each is logged at ERROR.",
    ["check"],
    multiprocess_mode="livemax",
)

# The mode label of enqueue_many's calls; the labels of a request refused before its queue and
# mode were known to be valid (and the job_type label while it is off).
BATCH = "batch"
CONFLICT = "conflict"
WORKFLOW = "workflow"  # the mode label of a workflow's steps, and of its enqueue's duration
UNKNOWN = ""


@functools.cache
def child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once per label set: ``labels()`` takes a lock and checks
    every value, some microseconds that would otherwise be spent on every job."""
    return metric.labels(*labels)


def job_type_label(job_type: str) -> str:
    """The job_type label's value: the type when WORKHORSE_METRICS_JOB_TYPE_LABEL is on, else empty."""
    return job_type if app_settings.METRICS_JOB_TYPE_LABEL else UNKNOWN


def enqueue_settled(requests: Sequence[PreparedJob], results: Sequence[EnqueueResult], seconds: float) -> None:
    if len(requests) == 1:
        request, outcome = requests[0], results[0].outcome.value
        child(ENQUEUE_REQUESTS, request.queue, mode_name(request), outcome, job_type_label(request.job_type)).inc()
        if request.binding is not None:
            child(KEYED_REQUESTS, request.binding.scope, outcome).inc()
    else:  # a batch: one increment per distinct label set
        counts = collections.Counter(
            (request.queue, mode_name(request), result.outcome.value, job_type_label(request.job_type))
            for request, result in zip(requests, results, strict=True)
        )
        for labels, count in counts.items():
            child(ENQUEUE_REQUESTS, *labels).inc(count)
        keyed = collections.Counter(
            (request.binding.scope, result.outcome.value)
            for request, result in zip(requests, results, strict=True)
            if request.binding is not None
        )
        for (scope, outcome), count in keyed.items():
            child(KEYED_REQUESTS, scope, outcome).inc(count)
    child(ENQUEUE_DURATION, mode_name(requests[0]) if len(requests) == 1 else BATCH).observe(seconds)


def workflow_settled(steps: Sequence[PreparedJob], scope: str | None, outcome: str, seconds: float) -> None:
    counts = collections.Counter((step.queue, job_type_label(step.job_type)) for step in steps)
    for (queue, job_type), count in counts.items():
        child(ENQUEUE_REQUESTS, queue, WORKFLOW, outcome, job_type).inc(count)
    if scope is not None:
        child(KEYED_REQUESTS, scope, outcome).inc()
    child(ENQUEUE_DURATION, WORKFLOW).observe(seconds)


def workflow_conflicted(scope: str) -> None:
    child(ENQUEUE_REQUESTS, UNKNOWN, WORKFLOW, CONFLICT, UNKNOWN).inc()
    child(KEYED_REQUESTS, scope, CONFLICT).inc()


def enqueue_refused(outcome: str, request: PreparedJob | None) -> None:
    if request is None:
        child(ENQUEUE_REQUESTS, UNKNOWN, UNKNOWN, outcome, UNKNOWN).inc()
        return
    child(ENQUEUE_REQUESTS, request.queue, mode_name(request), outcome, job_type_label(request.job_type)).inc()
    if request.binding is not None:
        child(KEYED_REQUESTS, request.binding.scope, outcome).inc()


def claimed(seconds: float) -> None:
    CLAIM_DURATION.observe(seconds)


def attempt_started(job: ClaimedJob, waited: float) -> None:
    child(WAIT_DURATION, job.queue, job_type_label(job.job_type)).observe(max(waited, 0.0))


def attempt_finished(job: ClaimedJob, status: str, duration: float | None, outcome: str) -> None:
    job_type = job_type_label(job.job_type)
    child(ATTEMPTS_FINISHED, job.queue, status, job_type, outcome).inc()
    if duration is not None:
        child(HANDLER_DURATION, job.queue, job_type).observe(duration)
    if status == "lost":
        child(LEASE_LOSSES, job.queue).inc()
    elif status == "dead":
        child(DEAD_LETTERS, job.queue).inc()


def reclaimed(count: int) -> None:
    RECLAIMS.inc(count)


def redriven(queue: str) -> None:
    child(REDRIVES, queue).inc()


def schedule_ticked(schedule: str, outcome: str) -> None:
    child(SCHEDULE_TICKS, schedule, outcome).inc()


def schedules_left_out(counts: Mapping[str, int]) -> None:
    for check_id, count in counts.items():
        child(SCHEDULES_LEFT_OUT, check_id).set(count)


def keyed_counts() -> dict[tuple[str, str], float]:
    """The keyed requests counted so far by (scope, outcome): every process's in multiprocess mode
    (``PROMETHEUS_MULTIPROC_DIR``), else this process's."""
    directory = multiprocess_dir()
    if directory:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
        families = list(registry.collect())
    else:
        families = list(KEYED_REQUESTS.collect())
    return {
        (sample.labels["scope"], sample.labels["outcome"]): sample.value
        for family in families
        if family.name == KEYED_REQUESTS_NAME
        for sample in family.samples
        if sample.name == KEYED_REQUESTS_NAME + "_total"
    }


def breaker_transitioned(to_state: str) -> None:
    child(BREAKER_TRANSITIONS, to_state).inc()
