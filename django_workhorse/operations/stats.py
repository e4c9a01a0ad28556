"""What the operator sees: queue depths, paused queues, throughput, recent failures, failing jobs,
workers, live bindings by scope, and what no worker will run (ORM queries only).

Shared by the admin dashboard and ``manage.py workhorse_status``, so both show the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import router
from django.db.models import Count, DateTimeField, Min, Q, QuerySet, Value
from django.db.models.functions import Left, Length, TruncMinute
from django.utils import timezone

from django_workhorse.conf import app_settings
from django_workhorse.models import Breaker, BreakerState, IdempotencyBinding, Job, JobStatus, QueueState, WorkerRecord
from django_workhorse.models.jobs import TERMINAL_STATUSES
from django_workhorse.sql.workflow_control import workflow_states
from django_workhorse.tasks.registry import can_run, get_handler, registered
from django_workhorse.workflows.operations import workflow_status

THROUGHPUT_MINUTES = 60
# The states a queue's depth counts, as QueueDepth names them.
STATES = ("waiting", "ready", "scheduled", "running", "dead")
# The scopes a listing of live bindings shows at most, those with the most bindings first.
MAX_SCOPES_SHOWN = 50
# How much of an error a listing reads (in SQL) to show its first line.
ERROR_HEAD_CHARS = 2000
# How many names a warning lists (those with the most jobs first); the rest are counted.
MAX_WARNING_NAMES = 20
# How many job types of queued jobs unknown_job_types reads at most (those with the most jobs first).
MAX_JOB_TYPES_CHECKED = 1000


@dataclass(frozen=True)
class QueueDepth:
    """How many jobs of one queue are in each live state, and how long the oldest ready one waited.

    ``waiting``: workflow steps whose parents have not released them yet (no worker claims them)."""

    queue: str
    waiting: int = 0
    ready: int = 0
    scheduled: int = 0
    running: int = 0
    dead: int = 0
    oldest_ready_age: timedelta | None = None

    def as_json(self) -> dict[str, object]:
        """Return a JSON-ready dict (the age in seconds)."""
        age = None if self.oldest_ready_age is None else round(self.oldest_ready_age.total_seconds(), 3)
        return {
            "queue": self.queue,
            "waiting": self.waiting,
            "ready": self.ready,
            "scheduled": self.scheduled,
            "running": self.running,
            "dead": self.dead,
            "oldest_ready_age_seconds": age,
        }


@dataclass(frozen=True)
class Throughput:
    """Jobs finished per minute over the last ``THROUGHPUT_MINUTES`` minutes, oldest minute first."""

    minutes: list[datetime]
    succeeded: list[int]
    failed: list[int]  # dead or cancelled

    @property
    def total(self) -> int:
        return sum(self.succeeded) + sum(self.failed)


@dataclass(frozen=True)
class WorkerStatus:
    """A registered worker and the jobs it holds right now."""

    name: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    running_job_ids: list[int] = field(default_factory=list)
    # A plain worker, a supervisor of child processes, or one of its children (naming its supervisor).
    kind: str = "worker"
    supervisor: str = ""
    # What the process last said it does: running, draining, recycling, replacing, stopping.
    state: str = "running"


def queue_depths(*, using: str | None = None, now: datetime | None = None) -> list[QueueDepth]:
    """Return the depth of every queue that has live or dead jobs, by queue name.

    One statement of four branches, one per status, each answerable from that status's partial
    index (waiting, ready, lease and dead jobs'), so the finished history is never read, however large.
    """
    now = now or timezone.now()
    totals: dict[str, dict[str, Any]] = {}
    for row in queue_depth_rows(using=using, now=now):
        total = totals.setdefault(row["queue"], {**dict.fromkeys(STATES, 0), "oldest": None})
        for state in STATES:
            total[state] += row[state]
        if row["oldest_ready"] is not None:
            total["oldest"] = row["oldest_ready"]
    return [
        QueueDepth(
            queue=queue,
            waiting=total["waiting"],
            ready=total["ready"],
            scheduled=total["scheduled"],
            running=total["running"],
            dead=total["dead"],
            oldest_ready_age=None if total["oldest"] is None else max(now - total["oldest"], timedelta(0)),
        )
        for queue, total in sorted(totals.items())
    ]


def queue_depth_rows(*, using: str | None = None, now: datetime) -> QuerySet[Any]:
    """The statement behind ``queue_depths``: per queue, one row of counts for each status."""
    jobs = _jobs(using).order_by()
    ready, later = Q(run_at__lte=now), Q(run_at__gt=now)
    zero, no_time = Value(0), Value(None, output_field=DateTimeField())

    def branch(status: str, **counts: Any) -> QuerySet[Any]:
        columns = {**dict.fromkeys(STATES, zero), "oldest_ready": no_time}
        rows: QuerySet[Any] = jobs.filter(status=status).values("queue").annotate(**{**columns, **counts})
        return rows

    queued = branch(
        JobStatus.QUEUED,
        ready=Count("id", filter=ready),
        scheduled=Count("id", filter=later),
        oldest_ready=Min("run_at", filter=ready),
    )
    running = branch(JobStatus.RUNNING, running=Count("*"))
    dead = branch(JobStatus.DEAD, dead=Count("*"))
    waiting = branch(JobStatus.WAITING, waiting=Count("*"))
    rows: QuerySet[Any] = queued.union(running, dead, waiting, all=True)
    return rows


def throughput(
    *, using: str | None = None, minutes: int = THROUGHPUT_MINUTES, now: datetime | None = None
) -> Throughput:
    """Return finished jobs per minute (succeeded, and dead or cancelled) over the last ``minutes``."""
    end = (now or timezone.now()).replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(minutes=minutes)
    counts = (
        _jobs(using)
        .filter(status__in=[JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED], finished_at__gte=start)
        .annotate(minute=TruncMinute("finished_at"))
        .values("minute")
        .annotate(
            succeeded=Count("id", filter=Q(status=JobStatus.SUCCEEDED)),
            failed=Count("id", filter=~Q(status=JobStatus.SUCCEEDED)),
        )
    )
    by_minute = {row["minute"]: (row["succeeded"], row["failed"]) for row in counts}
    minutes_list = [start + timedelta(minutes=i) for i in range(minutes)]
    return Throughput(
        minutes=minutes_list,
        succeeded=[by_minute.get(minute, (0, 0))[0] for minute in minutes_list],
        failed=[by_minute.get(minute, (0, 0))[1] for minute in minutes_list],
    )


def error_fields() -> dict[str, Any]:
    """What a listing reads of a job's error: its first ``ERROR_HEAD_CHARS`` characters
    (``error_head``) and its length (``error_chars``, with which an encrypted job's error, cut, is
    still described whole)."""
    return {"error_head": Left("last_error", ERROR_HEAD_CHARS), "error_chars": Length("last_error")}


def recent_failures(*, using: str | None = None, limit: int = 10) -> list[Job]:
    """Return the most recently finished dead jobs, newest first.

    Payload, result and error are not loaded; ``error_head`` holds the error's first
    ``ERROR_HEAD_CHARS`` characters, ``error_chars`` its length.
    """
    dead = _jobs(using).filter(status=JobStatus.DEAD).defer("payload", "result", "last_error")
    return list(dead.annotate(**error_fields()).order_by("-finished_at", "-id")[:limit])


def failing_jobs_by_queue(*, using: str | None = None) -> dict[str, int]:
    """Return, per queue, how many jobs are failing: queued again after a failed attempt
    (``attempt > 0`` and a ``last_error``), waiting for their retry, due or not yet.

    Failing jobs are counted in ``QueueDepth.ready`` or ``QueueDepth.scheduled`` too; a queue with
    none is left out. Only queued jobs are read, never the finished history.
    """
    rows = (
        _jobs(using)
        .filter(status=JobStatus.QUEUED, attempt__gt=0)
        .exclude(last_error="")
        .values("queue")
        .annotate(failing=Count("id"))
        .order_by("queue")
    )
    return {row["queue"]: row["failing"] for row in rows}


@dataclass(frozen=True)
class PausedQueue:
    """A paused queue: since when, by whom, and how many of its jobs wait (queued, due or not)."""

    queue: str
    since: datetime
    by: str
    queued: int

    def as_json(self) -> dict[str, object]:
        """Return a JSON-ready dict (the instant in ISO 8601)."""
        return {"queue": self.queue, "since": self.since.isoformat(), "by": self.by, "queued": self.queued}


def paused_queue_counts(*, using: str | None = None) -> list[PausedQueue]:
    """Return the paused queues by name, each with its queued jobs (read through the ready index)."""
    alias = using or router.db_for_read(QueueState)
    states = list(QueueState.objects.using(alias).filter(paused=True).order_by("queue"))
    if not states:
        return []
    names = [state.queue for state in states]
    rows = _jobs(alias).filter(status=JobStatus.QUEUED, queue__in=names).order_by().values("queue")
    queued = {row["queue"]: row["jobs"] for row in rows.annotate(jobs=Count("id"))}
    return [PausedQueue(s.queue, s.changed_at, s.changed_by, queued.get(s.queue, 0)) for s in states]


def queue_pauses(*, using: str | None = None) -> list[tuple[str, bool]]:
    """Return every queue with a ``QueueState`` row and whether it is paused, by name (one query)."""
    rows = QueueState.objects.using(using or router.db_for_read(QueueState)).order_by("queue")
    return list(rows.values_list("queue", "paused"))


@dataclass(frozen=True)
class NamedCounts:
    """The names a warning lists, each with how many jobs it concerns, and how many more it left out."""

    names: list[tuple[str, int]]
    more: int = 0

    def __bool__(self) -> bool:
        return bool(self.names)

    @property
    def total(self) -> int:
        """How many names there are, listed or not."""
        return len(self.names) + self.more

    def as_json(self) -> dict[str, object]:
        """Return a JSON-ready dict: ``{"names": [{"name", "jobs"}], "more"}``."""
        return {"names": [{"name": name, "jobs": jobs} for name, jobs in self.names], "more": self.more}


def unserved_queues(
    *, using: str | None = None, now: datetime | None = None, limit: int = MAX_WARNING_NAMES
) -> NamedCounts:
    """Return the queues that have ready jobs (due now) and no live worker taking them, with their
    ready jobs, most first: no worker whose heartbeat is within ``WORKHORSE_WORKER_STALE_AFTER``
    lists them in its queues."""
    now = now or timezone.now()
    alias = using or router.db_for_read(WorkerRecord)
    since = now - app_settings.WORKER_STALE_AFTER
    served = {queue for queues in _live_queue_lists(alias, since) for queue in queues}
    ready = _jobs(using).filter(status=JobStatus.QUEUED, run_at__lte=now).exclude(queue__in=served).order_by()
    rows = ready.values("queue").annotate(jobs=Count("id")).order_by("-jobs", "queue")[:limit]
    names = [(row["queue"], row["jobs"]) for row in rows]
    more = ready.values("queue").distinct().count() - len(names) if len(names) == limit else 0
    return NamedCounts(names, more)


def _live_queue_lists(alias: str, since: datetime) -> list[list[str]]:
    records = WorkerRecord.objects.using(alias).filter(heartbeat_at__gte=since)
    return [list(queues) for queues in records.values_list("queues", flat=True) if isinstance(queues, list)]


def unknown_job_types(*, using: str | None = None, limit: int = MAX_WARNING_NAMES) -> NamedCounts:
    """Return the job types of queued jobs that no handler of this process knows, with their queued
    jobs, most first.

    A type is known when a handler is registered for it, or a resolver (the django.tasks backend's,
    when ``TASKS`` configures it) supplies one, as a worker would. This process's code decides: run
    it where the workers' code is. At most ``MAX_JOB_TYPES_CHECKED`` types are read.
    """
    rows = (
        _jobs(using)
        .filter(status=JobStatus.QUEUED)
        .values("job_type")
        .annotate(jobs=Count("id"))
        .order_by("-jobs", "job_type")[:MAX_JOB_TYPES_CHECKED]
    )
    unknown = [(row["job_type"], row["jobs"]) for row in rows if not has_handler(row["job_type"])]
    return NamedCounts(unknown[:limit], max(len(unknown) - limit, 0))


@dataclass(frozen=True)
class WithoutHandler:
    """Queued jobs of one type in one queue that no live worker serving the queue can run."""

    queue: str
    job_type: str
    jobs: int


def jobs_without_handler(
    *, using: str | None = None, now: datetime | None = None, limit: int = MAX_JOB_TYPES_CHECKED
) -> list[WithoutHandler]:
    """Return the queued jobs (due or not) that wait for a handler, by queue and job type, most first:
    live workers serve their queue, and none of them registered their type (decision 0021, "Capability").

    A worker whose row says nothing of its job types (``job_types`` NULL: a worker from before
    capabilities) could run any type; a queue no live worker serves is ``unserved_queues``' warning, not
    this one. At most ``limit`` (queue, type) pairs are read, those with the most jobs first.
    """
    now = now or timezone.now()
    alias = using or router.db_for_read(WorkerRecord)
    live = WorkerRecord.objects.using(alias).filter(heartbeat_at__gte=now - app_settings.WORKER_STALE_AFTER)
    capable: dict[str, list[list[str] | None]] = {}
    for queues, job_types in live.values_list("queues", "job_types"):
        for queue in queues if isinstance(queues, list) else ():
            capable.setdefault(queue, []).append(job_types if isinstance(job_types, list) else None)
    if not capable:
        return []
    rows = (
        _jobs(using)
        .filter(status=JobStatus.QUEUED, queue__in=list(capable))
        .values("queue", "job_type")
        .annotate(jobs=Count("id"))
        .order_by("-jobs", "queue", "job_type")[:limit]
    )
    return [
        WithoutHandler(row["queue"], row["job_type"], row["jobs"])
        for row in rows
        if not any(can_run(job_types, row["job_type"]) for job_types in capable[row["queue"]])
    ]


def no_handler_by_queue(*, using: str | None = None, now: datetime | None = None) -> dict[str, int]:
    """Return the queued jobs of ``jobs_without_handler`` per queue (queues without any are left out)."""
    counts: dict[str, int] = {}
    for found in jobs_without_handler(using=using, now=now):
        counts[found.queue] = counts.get(found.queue, 0) + found.jobs
    return counts


def types_without_handler(*, using: str | None = None, limit: int = MAX_WARNING_NAMES) -> NamedCounts:
    """Return the job types of ``jobs_without_handler``, with their queued jobs over all queues, most first."""
    totals: dict[str, int] = {}
    for found in jobs_without_handler(using=using):
        totals[found.job_type] = totals.get(found.job_type, 0) + found.jobs
    names = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
    return NamedCounts(names[:limit], max(len(names) - limit, 0))


def open_breakers(*, using: str | None = None, limit: int = MAX_WARNING_NAMES) -> NamedCounts:
    """Return the circuit breakers that are not closed (open or half-open), with the jobs each holds,
    most first."""
    alias = using or router.db_for_read(Breaker)
    keys = list(Breaker.objects.using(alias).exclude(state=BreakerState.CLOSED).values_list("key", flat=True))
    if not keys:
        return NamedCounts([])
    rows = (
        _jobs(using)
        .filter(status=JobStatus.QUEUED, held_since__isnull=False, breaker_key__in=keys)
        .values("breaker_key")
        .annotate(jobs=Count("id"))
        .order_by()
    )
    held = {row["breaker_key"]: row["jobs"] for row in rows}
    names = sorted(((key, held.get(key, 0)) for key in keys), key=lambda item: (-item[1], item[0]))
    return NamedCounts(names[:limit], max(len(names) - limit, 0))


def has_handler(job_type: str) -> bool:
    """Return whether a worker running this process's code would find a handler for ``job_type``."""
    if registered(job_type) is not None:
        return True
    try:
        get_handler(job_type)
    except Exception:  # HandlerNotRegisteredError, or a resolver that fails (and would fail the job)
        return False
    return True


@dataclass(frozen=True)
class StatusWarning:
    """Work no worker will run by itself: its kind, a sentence saying so, and the names it concerns
    (with how many jobs each: ``unit`` says which jobs)."""

    kind: str
    message: str
    unit: str
    names: NamedCounts

    def as_json(self) -> dict[str, object]:
        """Return a JSON-ready dict: ``{"kind", "message", "names": [{"name", "jobs"}], "more"}``."""
        return {"kind": self.kind, "message": self.message, **self.names.as_json()}


def status_warnings(
    *, using: str | None = None, now: datetime | None = None, paused: list[PausedQueue] | None = None
) -> list[StatusWarning]:
    """Return the warnings that apply now (none when all is well): ready jobs in queues no live
    worker takes (``unserved_queues``), queued jobs of types no handler of this process knows
    (``unknown_job_types``; import the apps' ``tasks`` modules first, as the worker does), queued
    jobs in paused queues (``paused``: ``paused_queue_counts()``, read here unless given), and
    circuit breakers that hold jobs back (``open_breakers``)."""
    paused = paused_queue_counts(using=using) if paused is None else paused
    waiting = sorted(((p.queue, p.queued) for p in paused if p.queued), key=lambda item: (-item[1], item[0]))
    found = [
        StatusWarning(
            "queue_without_worker",
            "Ready jobs in queues no live worker takes",
            "ready",
            unserved_queues(using=using, now=now),
        ),
        StatusWarning(
            "unknown_job_type",
            "Queued jobs of types no handler in this process knows",
            "queued",
            unknown_job_types(using=using),
        ),
        StatusWarning(
            "job_without_handler",
            "Queued jobs of types no live worker has a handler for (they wait, using no attempt)",
            "queued",
            types_without_handler(using=using),
        ),
        StatusWarning(
            "paused_queue_with_jobs",
            "Queued jobs in paused queues (no worker claims them until the queue is resumed)",
            "queued",
            NamedCounts(waiting[:MAX_WARNING_NAMES], max(len(waiting) - MAX_WARNING_NAMES, 0)),
        ),
        StatusWarning(
            "breaker_open",
            "Circuit breakers open or half-open (their jobs are held)",
            "held",
            open_breakers(using=using),
        ),
    ]
    return [warning for warning in found if warning.names]


def workers(*, using: str | None = None) -> list[WorkerStatus]:
    """Return the registered workers with the ids of the jobs each is running."""
    alias = using or router.db_for_read(WorkerRecord)
    running: dict[str, list[int]] = {}
    for job_id, worker in _jobs(alias).filter(status=JobStatus.RUNNING).order_by("id").values_list("id", "claimed_by"):
        running.setdefault(worker, []).append(job_id)
    return [
        WorkerStatus(
            name=record.name,
            host=record.host,
            pid=record.pid,
            queues=list(record.queues),
            concurrency=record.concurrency,
            started_at=record.started_at,
            heartbeat_at=record.heartbeat_at,
            running_job_ids=running.get(record.name, []),
            kind=record.kind,
            supervisor=record.supervisor,
            state=record.state,
        )
        for record in WorkerRecord.objects.using(alias).order_by("name")
    ]


def live_worker_count(*, using: str | None = None, now: datetime | None = None) -> int:
    """Return how many registered workers sent a heartbeat within ``WORKHORSE_WORKER_STALE_AFTER``."""
    since = (now or timezone.now()) - app_settings.WORKER_STALE_AFTER
    alias = using or router.db_for_read(WorkerRecord)
    return int(WorkerRecord.objects.using(alias).filter(heartbeat_at__gte=since).count())


@dataclass(frozen=True)
class ScopeBindings:
    """How many bindings of one idempotency scope still own their key."""

    scope: str
    live: int


def live_bindings(
    *, using: str | None = None, now: datetime | None = None, limit: int = MAX_SCOPES_SHOWN
) -> list[ScopeBindings]:
    """Return the scopes with live bindings (``IdempotencyBinding.objects.live()``), most first."""
    alias = using or router.db_for_read(IdempotencyBinding)
    rows = (
        IdempotencyBinding.objects.using(alias)
        .live(now)
        .values("scope")
        .annotate(live=Count("pk"))
        .order_by("-live", "scope")[:limit]
    )
    return [ScopeBindings(row["scope"], row["live"]) for row in rows]


@dataclass(frozen=True)
class WorkflowCounts:
    """Workflows by derived state (``workflows.operations.WorkflowStatus``): the live ones (a step
    waiting, queued or running: running or blocked, or cancelled while a running step stops), and
    those that finished within the last ``minutes`` (succeeded, failed or cancelled)."""

    running: int = 0
    blocked: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    minutes: int = THROUGHPUT_MINUTES

    def __bool__(self) -> bool:
        return any(getattr(self, state) for state in WORKFLOW_STATES)

    def as_json(self) -> dict[str, object]:
        """Return a JSON-ready dict: one count per state, and the window of the finished ones."""
        return {**{state: getattr(self, state) for state in WORKFLOW_STATES}, "finished_window_minutes": self.minutes}


WORKFLOW_STATES = ("running", "blocked", "succeeded", "failed", "cancelled")


def workflow_counts(
    *, using: str | None = None, now: datetime | None = None, minutes: int = THROUGHPUT_MINUTES
) -> WorkflowCounts:
    """Return how many workflows are in each state: the live ones, found through the partial indexes
    of live work (waiting, ready and lease), and those whose last step finished within the last
    ``minutes`` (the status command's throughput window; through the finished index). Each state is
    derived from the steps' current jobs by one ``WORKFLOW_STATE`` query."""
    alias = using or router.db_for_read(Job)
    since = (now or timezone.now()) - timedelta(minutes=minutes)
    steps = _jobs(alias).filter(workflow__isnull=False).order_by().values_list("workflow_id", flat=True)
    live_branches = [steps.filter(status=status) for status in (JobStatus.WAITING, JobStatus.QUEUED, JobStatus.RUNNING)]
    live = set(live_branches[0].union(*live_branches[1:]))
    recent = set(steps.filter(status__in=TERMINAL_STATUSES, finished_at__gte=since).distinct()) - live
    found = workflow_states(alias, [*live, *recent])
    counts = dict.fromkeys(WORKFLOW_STATES, 0)
    for steps_of in found.values():
        counts[str(workflow_status(steps_of))] += 1
    return WorkflowCounts(**counts, minutes=minutes)


def _jobs(using: str | None) -> QuerySet[Job]:
    jobs: QuerySet[Job] = Job.objects.using(using or router.db_for_read(Job))
    return jobs
