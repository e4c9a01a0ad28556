"""The metrics, in prometheus-client's registry, and how each event updates them.

Importing this module needs prometheus-client; ``django_workhorse.instruments`` imports it only
when it is installed.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram

if TYPE_CHECKING:
    from django_workhorse.prepared import PreparedJob
    from django_workhorse.sql.claims import ClaimedJob
    from django_workhorse.types import EnqueueResult

# Enqueue calls take about a millisecond; handlers anything from microseconds to hours.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
HANDLER_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

ENQUEUE_REQUESTS = Counter(
    "workhorse_enqueue_requests",
    "Enqueue requests by queue, keyed mode and outcome (accepted, replayed, replaced, non_replaceable, "
    "coalesced, conflict, invalid).",
    ["queue", "mode", "outcome"],
)
ENQUEUE_DURATION = Histogram(
    "workhorse_enqueue_duration_seconds",
    "Time of one enqueue call (its statements included), by keyed mode (batch for enqueue_many).",
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
    "Finished attempts by queue and what was written: succeeded, queued (a retry), dead, cancelled, "
    "lost (the lease was gone) or unrecorded.",
    ["queue", "status"],
)
HANDLER_DURATION = Histogram(
    "workhorse_handler_duration_seconds",
    "Time the handler of an attempt ran, by queue.",
    ["queue"],
    buckets=HANDLER_BUCKETS,
)
LEASE_LOSSES = Counter(
    "workhorse_lease_losses", "Attempts whose lease was lost before their outcome was written.", ["queue"]
)
DEAD_LETTERS = Counter(
    "workhorse_dead_letters", "Jobs that went dead (their last attempt failed), by queue.", ["queue"]
)
RECLAIMS = Counter("workhorse_reclaims", "Jobs whose expired leases a worker reclaimed.")

# The mode label of enqueue_many's calls; of a request without a key; and the labels of a request
# refused before its queue and mode were known to be valid.
BATCH = "batch"
UNKEYED = "none"
UNKNOWN = ""


def mode_of(request: PreparedJob) -> str:
    """The keyed-mode label of ``request``."""
    return UNKEYED if request.binding is None else request.binding.mode.value


def enqueue_settled(requests: Sequence[PreparedJob], results: Sequence[EnqueueResult], seconds: float) -> None:
    if len(requests) == 1:
        ENQUEUE_REQUESTS.labels(requests[0].queue, mode_of(requests[0]), results[0].outcome.value).inc()
    else:  # a batch: one increment per distinct label set
        counts = collections.Counter(
            (request.queue, mode_of(request), result.outcome.value)
            for request, result in zip(requests, results, strict=True)
        )
        for labels, count in counts.items():
            ENQUEUE_REQUESTS.labels(*labels).inc(count)
    ENQUEUE_DURATION.labels(mode_of(requests[0]) if len(requests) == 1 else BATCH).observe(seconds)


def enqueue_refused(outcome: str, request: PreparedJob | None) -> None:
    if request is None:
        ENQUEUE_REQUESTS.labels(UNKNOWN, UNKNOWN, outcome).inc()
    else:
        ENQUEUE_REQUESTS.labels(request.queue, mode_of(request), outcome).inc()


def claimed(seconds: float) -> None:
    CLAIM_DURATION.observe(seconds)


def attempt_finished(job: ClaimedJob, status: str, duration: float | None) -> None:
    ATTEMPTS_FINISHED.labels(job.queue, status).inc()
    if duration is not None:
        HANDLER_DURATION.labels(job.queue).observe(duration)
    if status == "lost":
        LEASE_LOSSES.labels(job.queue).inc()
    elif status == "dead":
        DEAD_LETTERS.labels(job.queue).inc()


def reclaimed(count: int) -> None:
    RECLAIMS.inc(count)
