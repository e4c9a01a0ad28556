"""``manage.py workhorse_status``: warnings (work no worker will run, paused queues with jobs, open
circuit breakers), queue depths, paused queues, throughput, workers, schedules, circuit breakers, fair queues,
rate limits (per limit and partition), workflows by state and idempotency keys by scope, as tables or JSON.

Names come from code, settings and the database (queues, job types, scopes, schedules, workers' hosts): every
table cell goes through ``printable``, so a name cannot move the cursor or recolour the terminal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import router
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules

from django_workhorse import rate_limits
from django_workhorse.checks import schedule_problems_reported_elsewhere
from django_workhorse.models import Job
from django_workhorse.observability import instruments, keyed_rates
from django_workhorse.observability.keyed_rates import ScopeDedup, ScopeRate
from django_workhorse.observability.log_fields import printable
from django_workhorse.observability.metrics import multiprocess_dir
from django_workhorse.operations.breakers import BreakerStatus, breaker_states
from django_workhorse.operations.fair import TOP_KEYS, FairQueueStatus, fair_queue_states
from django_workhorse.operations.stats import (
    PausedQueue,
    QueueDepth,
    StatusWarning,
    Throughput,
    WorkerStatus,
    WorkflowCounts,
    failing_jobs_by_queue,
    live_bindings,
    no_handler_by_queue,
    paused_queue_counts,
    queue_depths,
    status_warnings,
    throughput,
    workers,
    workflow_counts,
)
from django_workhorse.schedules.evaluation import left_out_schedules
from django_workhorse.schedules.overview import ScheduleOverview, overview
from django_workhorse.schedules.sources import ScheduleProblem
from django_workhorse.sql.rate_limits import Budget

MAX_RATE_WINDOW_SECONDS = 300


def human_age(age: timedelta | None) -> str:
    """Return ``age`` as "3.2 s", "4 min", "2.5 h" or "3.0 d" ("-" for none)."""
    if age is None:
        return "-"
    seconds = max(age.total_seconds(), 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, right: Sequence[int] = ()) -> list[str]:
    """Return the lines of a plain-text table, each cell ``printable``; columns in ``right`` are right-aligned."""
    cells = [[printable(cell) for cell in row] for row in rows]
    widths = [max([len(header)] + [len(row[i]) for row in cells]) for i, header in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        padded = (v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True)))
        return "  ".join(padded).rstrip()

    return [line(headers), line(["-" * width for width in widths]), *(line(row) for row in cells)]


def utc_time(value: datetime | None) -> str:
    """Return ``value`` as "2026-06-01 12:00:00" in UTC ("-" for none)."""
    return "-" if value is None else f"{value.astimezone(dt_timezone.utc):%Y-%m-%d %H:%M:%S}"


def warning_line(warning: StatusWarning) -> str:
    """Return ``warning`` as one line of text, each name ``printable``, the rest counted."""
    listed = ", ".join(f"{printable(name)} ({jobs} {warning.unit})" for name, jobs in warning.names.names)
    more = f" and {warning.names.more} more" if warning.names.more else ""
    return f"{warning.message} ({warning.names.total}): {listed}{more}"


def worker_json(worker: WorkerStatus, now: datetime) -> dict[str, object]:
    """Return a JSON-ready dict of ``worker`` (times in ISO 8601, the heartbeat age in seconds)."""
    return {
        "name": worker.name,
        "host": worker.host,
        "pid": worker.pid,
        "queues": worker.queues,
        "concurrency": worker.concurrency,
        "kind": worker.kind,
        "supervisor": worker.supervisor,
        "state": worker.state,
        "started_at": worker.started_at.isoformat(),
        "heartbeat_at": worker.heartbeat_at.isoformat(),
        "heartbeat_age_seconds": round(max((now - worker.heartbeat_at).total_seconds(), 0.0), 3),
        "running_job_ids": worker.running_job_ids,
    }


class Command(BaseCommand):
    help = (
        "Show warnings (ready jobs no live worker takes, job types no handler knows, queued jobs in paused "
        "queues, open circuit breakers), queue depths with the failing jobs (waiting for a retry) and the oldest "
        "ready job's age, the paused queues, throughput over the last hour, workflows by state, the workers, the schedules, the "
        "circuit breakers, the rate limits' budgets and, per idempotency scope, the live bindings and what the keys saved."
    )

    def check(self, *args: Any, **kwargs: Any) -> None:
        with schedule_problems_reported_elsewhere():  # shown with the schedules
            super().check(*args, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json", action="store_true", dest="as_json", help="Print one JSON object instead of tables."
        )
        parser.add_argument("--database", default=None, help="Database alias (default: the router's choice).")
        parser.add_argument(
            "--rate-window",
            default="0",
            help="Read the keyed-request counters this many seconds apart (0..300; 0: not at all) to show the "
            "duplicates saved and conflicts per minute. Needs the metrics extra and PROMETHEUS_MULTIPROC_DIR "
            "shared with the processes that enqueue.",
        )

    def handle(self, *args: Any, as_json: bool, database: str | None, rate_window: str, **options: Any) -> None:
        window = _rate_window(rate_window)
        first = keyed_rates.read() if window and _counters_shared() else None
        now = timezone.now()
        # Handlers register on import: load every installed app's tasks module, as the worker does,
        # to know which job types have one.
        autodiscover_modules("tasks")
        paused = paused_queue_counts(using=database)
        warnings = status_warnings(using=database, now=now, paused=paused)
        depths = queue_depths(using=database, now=now)
        failing = failing_jobs_by_queue(using=database)
        no_handler = no_handler_by_queue(using=database, now=now)
        finished = throughput(using=database, now=now)
        flows = workflow_counts(using=database, now=now)
        registered = workers(using=database)
        schedules = overview(using=database, now=now)
        breakers = breaker_states(using=database, now=now)
        fair = fair_queue_states(using=database, now=now)
        budgets = rate_limits.budgets(using=database)
        left_out = left_out_schedules()
        rates = None
        if first is not None:
            time.sleep(max(first.at + window - time.monotonic(), 0.0))  # the rest of the window
            second = keyed_rates.read()
            rates = None if second is None else keyed_rates.between(first, second)
        scopes = keyed_rates.by_scope(live_bindings(using=database, now=now), rates)
        if as_json:
            self._write_json(
                warnings, depths, paused, failing, no_handler, finished, registered, schedules, left_out, scopes, now,
                breakers, fair, budgets, flows,
            )  # fmt: skip
            return
        self._write_warnings(warnings)
        self.stdout.write("")
        self._write_queues(depths, failing, no_handler, database)
        self.stdout.write("")
        if paused:
            self._write_paused(paused)
            self.stdout.write("")
        self._write_throughput(finished)
        self.stdout.write("")
        if flows:  # only for projects that run workflows
            self._write_workflows(flows)
            self.stdout.write("")
        self._write_workers(registered, now)
        self.stdout.write("")
        self._write_schedules(schedules, left_out)
        self.stdout.write("")
        if breakers:  # like the paused queues: only for projects that have some
            self._write_breakers(breakers)
            self.stdout.write("")
        if fair:  # only for projects that declare fair queues
            self._write_fair(fair)
        if budgets:  # likewise: only once a job or an acquire spent a rate limit
            self._write_rate_limits(budgets)
            self.stdout.write("")
        self._write_scopes(scopes, window, rates)

    def _write_json(
        self,
        warnings: list[StatusWarning],
        depths: list[QueueDepth],
        paused: list[PausedQueue],
        failing: dict[str, int],
        no_handler: dict[str, int],
        finished: Throughput,
        registered: list[WorkerStatus],
        schedules: list[ScheduleOverview],
        left_out: list[ScheduleProblem],
        scopes: list[ScopeDedup],
        now: datetime,
        breakers: list[BreakerStatus],
        fair: list[FairQueueStatus],
        budgets: list[Budget],
        flows: WorkflowCounts,
    ) -> None:
        report = {
            "warnings": [warning.as_json() for warning in warnings],
            "queues": [
                {
                    **depth.as_json(),
                    "failing": failing.get(depth.queue, 0),
                    "no_handler": no_handler.get(depth.queue, 0),
                }
                for depth in depths
            ],
            "paused_queues": [queue.as_json() for queue in paused],
            "throughput": {
                "minutes": len(finished.minutes),
                "succeeded": sum(finished.succeeded),
                "failed": sum(finished.failed),
            },
            "workers": [worker_json(worker, now) for worker in registered],
            "schedules": [schedule.as_json() for schedule in schedules],
            "schedules_left_out": [
                {"name": p.name, "check": p.check_id, "origin": p.origin, "problem": p.message} for p in left_out
            ],
            "scopes": [line.as_json() for line in scopes],
            "breakers": [breaker.as_json() for breaker in breakers],
            "fair_queues": [queue.as_json() for queue in fair],
            "rate_limits": [budget.as_json() for budget in budgets],
            "workflows": flows.as_json(),
        }
        self.stdout.write(json.dumps(report, indent=2))

    def _write_breakers(self, breakers: list[BreakerStatus]) -> None:
        self.stdout.write("Circuit breakers")
        rows = [
            [b.key, b.effective, b.failures_in_window, b.held_jobs, _last_transition(b), utc_time(b.changed_at)]
            for b in breakers
        ]
        headers = ["breaker", "now", "failures in window", "held jobs", "last transition", "changed (UTC)"]
        for line in format_table(headers, rows, right=[2, 3]):
            self.stdout.write(line)

    def _write_fair(self, fair: list[FairQueueStatus]) -> None:
        self.stdout.write(f"Fair queues (ready work by partition key; the {TOP_KEYS} largest keys)")
        rows = [
            [
                f.queue,
                f.keys_with_ready_work,
                f.unkeyed_ready,
                ", ".join(f"{key} ({n})" for key, n in f.top_keys) or "-",
            ]
            for f in fair
        ]
        for line in format_table(["queue", "keys with ready work", "unkeyed ready", "top keys"], rows, right=[1, 2]):
            self.stdout.write(line)

    def _write_rate_limits(self, budgets: list[Budget]) -> None:
        self.stdout.write("Rate limits")
        rows = [
            [b.name, b.partition or "—", b.admitted, b.deferred, "unlimited" if b.available is None else b.available]
            for b in budgets
        ]
        headers = ["limit", "partition", "admitted", "deferred", "available now"]
        for line in format_table(headers, rows, right=[2, 3, 4]):
            self.stdout.write(line)
        if len(budgets) >= rate_limits.MAX_LISTED_BUDGETS:
            self.stdout.write(f"(the first {rate_limits.MAX_LISTED_BUDGETS} budgets by name and partition)")

    def _write_warnings(self, warnings: list[StatusWarning]) -> None:
        self.stdout.write("Warnings")
        for line in [warning_line(warning) for warning in warnings] or ["None."]:
            self.stdout.write(line)

    def _write_queues(
        self, depths: list[QueueDepth], failing: dict[str, int], no_handler: dict[str, int], database: str | None
    ) -> None:
        self.stdout.write("Queues")
        if not depths:
            alias = database or router.db_for_read(Job)
            anything = Job.objects.using(alias).exists()
            self.stdout.write("No queued, running or dead jobs." if anything else "No jobs.")
            return
        rows = [
            [d.queue, d.waiting, d.ready, d.scheduled, failing.get(d.queue, 0), no_handler.get(d.queue, 0)]
            + [d.running, d.dead, human_age(d.oldest_ready_age)]
            for d in depths
        ]
        headers = ["queue", "waiting", "ready", "scheduled", "failing", "no handler", "running", "dead", "oldest ready"]
        for line in format_table(headers, rows, right=range(1, 9)):
            self.stdout.write(line)

    def _write_paused(self, paused: list[PausedQueue]) -> None:
        self.stdout.write("Paused queues (times in UTC)")
        rows = [[p.queue, utc_time(p.since), p.by or "-", p.queued] for p in paused]
        for line in format_table(["queue", "paused since", "by", "queued"], rows, right=[3]):
            self.stdout.write(line)

    def _write_throughput(self, finished: Throughput) -> None:
        minutes = len(finished.minutes)
        succeeded, failed = sum(finished.succeeded), sum(finished.failed)
        self.stdout.write(f"Throughput (last {minutes} min)")
        self.stdout.write(
            f"{finished.total} finished: {succeeded} succeeded, {failed} failed (dead or cancelled); "
            f"{finished.total / minutes:.2f} jobs/min"
        )

    def _write_workflows(self, flows: WorkflowCounts) -> None:
        self.stdout.write("Workflows")
        self.stdout.write(
            f"{flows.running} running, {flows.blocked} blocked (a dead step holds the rest back); "
            f"finished in the last {flows.minutes} min: {flows.succeeded} succeeded, {flows.failed} failed, "
            f"{flows.cancelled} cancelled"
        )

    def _write_workers(self, registered: list[WorkerStatus], now: datetime) -> None:
        self.stdout.write("Workers")
        if not registered:
            self.stdout.write("No workers registered.")
            return
        rows = [
            [
                w.name,
                w.host,
                w.pid,
                w.kind,
                w.state,
                ",".join(w.queues),
                f"{human_age(now - w.heartbeat_at)} ago",
                ", ".join(map(str, w.running_job_ids)) or "-",
            ]
            for w in registered
        ]
        headers = ["name", "host", "pid", "kind", "state", "queues", "last heartbeat", "running jobs"]
        for line in format_table(headers, rows, right=[2, 6]):
            self.stdout.write(line)

    def _write_schedules(self, schedules: list[ScheduleOverview], left_out: list[ScheduleProblem]) -> None:
        self.stdout.write("Schedules (times in UTC)")
        if not schedules:
            self.stdout.write("No schedules evaluated yet.")
        else:
            self._write_schedule_table(schedules)
        if left_out:
            self.stdout.write(
                f"Left out of the evaluations ({len(left_out)}; as this process's code and settings declare them):"
            )
            rows = [[p.name, p.check_id, f"{p.origin}: {p.message}"] for p in left_out]
            for line in format_table(["name", "check", "problem"], rows):
                self.stdout.write(line)

    def _write_schedule_table(self, schedules: list[ScheduleOverview]) -> None:
        rows = [
            [
                s.name,
                s.expression or "-",
                s.timezone or "-",
                utc_time(s.next_ticks[0] if s.next_ticks else None),
                utc_time(s.last_tick_at),
                _job(s),
                s.state if s.declared_here or not s.active else f"{s.state}, not declared here",
            ]
            for s in schedules
        ]
        headers = ["name", "expression", "zone", "next tick", "last tick", "last job", "state"]
        for line in format_table(headers, rows):
            self.stdout.write(line)

    def _write_scopes(self, scopes: list[ScopeDedup], window: float, rates: dict[str, ScopeRate] | None) -> None:
        self.stdout.write("Idempotency keys by scope")
        if rates is None:
            headers, rows = ["scope", "live bindings"], [[line.scope, _count(line.live_bindings)] for line in scopes]
            empty, footer = "No live bindings.", _why_no_rates(window)
        else:
            headers = ["scope", "live bindings", "saved", "saved/min", "conflicts", "conflicts/min"]
            rows = [[line.scope, _count(line.live_bindings), *_rate_cells(line.rate)] for line in scopes]
            empty = "No live bindings and no keyed requests."
            footer = (
                f"Duplicates saved (replayed, coalesced, replaced) and conflicts over {window:g} s, "
                "as every process of PROMETHEUS_MULTIPROC_DIR counted them."
            )
        for line in format_table(headers, rows, right=range(1, len(headers))) if rows else [empty]:
            self.stdout.write(line)
        self.stdout.write(footer)


def _last_transition(breaker: BreakerStatus) -> str:
    if not breaker.transitions:
        return "-"
    last = breaker.transitions[-1]
    return f"{last.get('from')} -> {last.get('to')}: {last.get('reason')}"


def _rate_window(value: str) -> float:
    try:
        window = float(value)
    except ValueError:
        window = -1.0
    if not 0 <= window <= MAX_RATE_WINDOW_SECONDS:
        raise CommandError(f"--rate-window must be a number of seconds in 0..{MAX_RATE_WINDOW_SECONDS}, not {value!r}")
    return window


def _counters_shared() -> bool:
    return instruments.recording() and multiprocess_dir() is not None


def _why_no_rates(window: float) -> str:
    if not instruments.recording():
        return "Duplicates saved and conflicts per minute need the metrics extra (django-workhorse[metrics])."
    if multiprocess_dir() is None:
        return (
            "Duplicates saved and conflicts per minute need PROMETHEUS_MULTIPROC_DIR, shared with the processes "
            "that enqueue (this command's own process counts nothing)."
        )
    return "Add --rate-window SECONDS to read the duplicates saved and conflicts per minute."


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _rate_cells(rate: ScopeRate | None) -> list[str]:
    if rate is None:
        return ["-"] * 4
    return [str(rate.saved), f"{rate.saved_per_minute:.1f}", str(rate.conflicts), f"{rate.conflicts_per_minute:.1f}"]


def _job(schedule: ScheduleOverview) -> str:
    if schedule.last_job_id is None:
        return "-"
    return f"{schedule.last_job_id} ({schedule.last_job_status or 'pruned'})"
