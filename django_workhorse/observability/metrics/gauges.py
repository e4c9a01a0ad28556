"""Gauges read from PostgreSQL when the metrics are scraped: queue depths, the oldest ready job's
age, live workers, paused queues, circuit breakers' states and held jobs, fair queues' keys with ready
work, rate limits' budgets, workflows by state. The numbers are ``stats.queue_depths()``'s (those of the dashboard and
``workhorse_status``), read at most once per ``ttl`` seconds, so scrapes from several Prometheus
servers cost one set of queries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.db import DatabaseError
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from django_workhorse import rate_limits
from django_workhorse.models import BreakerState
from django_workhorse.operations import stats
from django_workhorse.operations.breakers import breaker_states
from django_workhorse.operations.fair import fair_queue_states
from django_workhorse.operations.stats import STATES

logger = logging.getLogger(__name__)

CACHE_SECONDS = 5.0


class DatabaseGauges(Collector):
    """A prometheus-client collector of the gauges, cached for ``ttl`` seconds."""

    def __init__(self, ttl: float = CACHE_SECONDS) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._metrics: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if time.monotonic() - self._read_at >= self.ttl:
                try:
                    self._metrics = _read()
                except DatabaseError:  # the counters still answer; the gauges wait for the database
                    logger.exception("Reading the metrics gauges failed")
                    self._metrics = []
                self._read_at = time.monotonic()
            return iter(list(self._metrics))

    def describe(self) -> Iterator[Metric]:
        return iter(())  # registering must not query the database

    def forget(self) -> None:
        """Read the database again at the next scrape."""
        with self._lock:
            self._read_at = -float("inf")


def _read() -> list[Metric]:
    now = timezone.now()
    jobs = GaugeMetricFamily(
        "workhorse_jobs",
        "Jobs by queue and state (waiting, ready, scheduled, running, dead).",
        labels=["queue", "state"],
    )
    oldest = GaugeMetricFamily(
        "workhorse_oldest_ready_age_seconds",
        "How long the oldest ready job of each queue has waited past its run_at (0 when none is ready).",
        labels=["queue"],
    )
    for depth in stats.queue_depths(now=now):
        for state in STATES:
            jobs.add_metric([depth.queue, state], getattr(depth, state))
        age = depth.oldest_ready_age or timedelta(0)
        oldest.add_metric([depth.queue], age.total_seconds())
    workers = GaugeMetricFamily(
        "workhorse_workers_alive", "Registered workers whose heartbeat is within WORKHORSE_WORKER_STALE_AFTER."
    )
    workers.add_metric([], stats.live_worker_count(now=now))
    paused = GaugeMetricFamily(
        "workhorse_queue_paused",
        "1 for a paused queue, 0 for one resumed (queues never paused or resumed are not listed).",
        labels=["queue"],
    )
    for queue, is_paused in stats.queue_pauses():
        paused.add_metric([queue], 1 if is_paused else 0)
    # Labelled by queue only (the queues WORKHORSE_QUEUES declares fair), never by partition key.
    keys = GaugeMetricFamily(
        "workhorse_fair_queue_keys",
        "Partition keys with ready work in each fair queue (its jobs without a key not counted).",
        labels=["queue"],
    )
    for fair_queue in fair_queue_states(now=now):
        keys.add_metric([fair_queue.queue], fair_queue.keys_with_ready_work)
    return [
        jobs, oldest, workers, paused, *_breaker_gauges(now), keys, *_rate_limit_gauges(), _workflow_gauge(now),
        _without_handler_gauge(now),
    ]  # fmt: skip


def _without_handler_gauge(now: datetime) -> Metric:
    # Bounded: the (queue, job type) pairs with the most waiting jobs, at most MAX_WARNING_NAMES of them.
    waiting = GaugeMetricFamily(
        "workhorse_jobs_without_handler",
        "Queued jobs that no live worker serving their queue can run (no handler registered for their type).",
        labels=["queue", "job_type"],
    )
    for found in stats.jobs_without_handler(now=now)[: stats.MAX_WARNING_NAMES]:
        waiting.add_metric([found.queue, found.job_type], found.jobs)
    return waiting


def _workflow_gauge(now: datetime) -> Metric:
    counts = stats.workflow_counts(now=now)
    flows = GaugeMetricFamily(
        "workhorse_workflows",
        f"Workflows by state: live ones (running, blocked), and those that finished within the last "
        f"{counts.minutes} min (succeeded, failed, cancelled; a live one whose cancel is under way too).",
        labels=["state"],
    )
    for state in stats.WORKFLOW_STATES:
        flows.add_metric([state], getattr(counts, state))
    return flows


def _breaker_gauges(now: datetime) -> list[Metric]:
    # Labelled by key: breakers are as many as the project declares (job types) or its per-call
    # keys name (destinations), operator-chosen and bounded; a key gets a row once a job behind it failed.
    state = GaugeMetricFamily(
        "workhorse_breaker_state",
        "Each circuit breaker's stored state: 1 for the state it is in (closed, open, half_open), 0 for the others.",
        labels=["key", "state"],
    )
    held = GaugeMetricFamily(
        "workhorse_breaker_held_jobs", "Queued jobs each circuit breaker holds back.", labels=["key"]
    )
    for breaker in breaker_states(now=now):
        for name in BreakerState.values:
            state.add_metric([breaker.key, name], 1.0 if breaker.state == name else 0.0)
        held.add_metric([breaker.key], breaker.held_jobs)
    return [state, held]


def _rate_limit_gauges() -> list[Metric]:
    # Labelled by limit name only: names are the project's settings (bounded); partitions (accounts,
    # tenants) may be many, so they are summed.
    admitted = GaugeMetricFamily(
        "workhorse_rate_limit_admitted",
        "Attempts started under each rate limit, all partitions summed.",
        labels=["limit"],
    )
    deferred = GaugeMetricFamily(
        "workhorse_rate_limit_deferred",
        "Times a job was held back for each rate limit (a job held again counts again), all partitions summed.",
        labels=["limit"],
    )
    available = GaugeMetricFamily(
        "workhorse_rate_limit_available",
        "Starts available now under each configured rate limit, summed over the partitions that have a budget row.",
        labels=["limit"],
    )
    for total in rate_limits.budget_totals():
        admitted.add_metric([total.name], total.admitted)
        deferred.add_metric([total.name], total.deferred)
        if total.available is not None:
            available.add_metric([total.name], total.available)
    return [admitted, deferred, available]
