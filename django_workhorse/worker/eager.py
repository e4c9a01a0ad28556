"""Eager mode: run accepted jobs synchronously, in the caller's thread and transaction (for tests).

Enqueue is unchanged (rows are written, keys deduplicate exactly as in production); only the
worker is replaced by a direct call through the worker's own claim, execute and record steps.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType

from django.db import router
from django.db.models import QuerySet
from django.db.models.functions import Now

from django_workhorse import sql
from django_workhorse.admission import rate_limits
from django_workhorse.admission import recording as breakers
from django_workhorse.conf import app_settings
from django_workhorse.models import Job, JobStatus
from django_workhorse.outcomes.values import HandlerOutcome
from django_workhorse.types import EnqueueOutcome, EnqueueResult, JobId
from django_workhorse.worker.context import HandlerContext
from django_workhorse.worker.execution import execute, record

EAGER_WORKER = "eager"
# Nothing reclaims an eager job: it runs to the end before enqueue returns.
EAGER_LEASE = timedelta(hours=1)
# run_jobs stops after this many attempts, in case handlers keep enqueueing each other.
MAX_EAGER_RUNS = 10_000


@dataclass(frozen=True)
class _Mode:
    active: bool
    propagate: bool


_mode: contextvars.ContextVar[_Mode | None] = contextvars.ContextVar("workhorse_eager", default=None)


class EagerMode(contextlib.ContextDecorator):
    """Context manager and decorator returned by :func:`eager`."""

    def __init__(self, *, active: bool, propagate: bool) -> None:
        self._mode = _Mode(active, propagate)
        self._tokens: list[contextvars.Token[_Mode | None]] = []

    def __enter__(self) -> EagerMode:
        self._tokens.append(_mode.set(self._mode))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _mode.reset(self._tokens.pop())


def eager(*, propagate: bool = True, active: bool = True) -> EagerMode:
    """Run jobs synchronously while the block (or decorated function) runs; dedup stays on.

    Each accepted job that is due now runs right after enqueue, in the caller's thread and
    transaction. With ``propagate`` a handler's exception is recorded on the job (a retry or
    dead, as a worker would) and then re-raised; an outcome it raises (``Snooze``, ``Retry``,
    ``Cancel``, ``Fail``) is recorded and never re-raised. ``eager(active=False)`` turns
    ``WORKHORSE_EAGER`` off inside the block.
    """
    return EagerMode(active=active, propagate=propagate)


def _current() -> _Mode:
    mode = _mode.get()
    return mode if mode is not None else _Mode(app_settings.EAGER, app_settings.EAGER_PROPAGATES)


def is_active() -> bool:
    """Return whether enqueue runs accepted jobs eagerly here (context manager or setting)."""
    return _current().active


def run_accepted(alias: str, results: Iterable[EnqueueResult]) -> None:
    """Run each newly accepted job that is due now (called by enqueue in eager mode)."""
    propagate = _current().propagate
    for result in results:
        if result.outcome is EnqueueOutcome.ACCEPTED:
            run_job(result.job_id, using=alias, propagate=propagate)


def run_workflow(alias: str, workflow_id: int) -> None:
    """Run an accepted workflow's steps in id order, each once its parents released it, until none is
    ready (called by a workflow's enqueue in eager mode). A step that is not due now waits for
    :func:`run_jobs`, as a delayed job does."""
    steps = Job.objects.using(alias).filter(workflow_id=workflow_id)
    _run_until_none(alias, steps, ("id",), scheduled=False, propagate=_current().propagate)


def run_job(
    job_id: JobId, *, using: str | None = None, scheduled: bool = False, propagate: bool | None = None
) -> str | None:
    """Run one queued job now, as a worker would; return how the attempt ended, or None.

    None means the job was not claimable: not queued, not due (unless ``scheduled``), or its
    concurrency key has no free slot. Raise the handler's exception after recording it when
    ``propagate`` (default: ``WORKHORSE_EAGER_PROPAGATES``).
    """
    alias = using or router.db_for_write(Job)
    job = sql.claims.claim_job(
        alias, job_id=job_id, lease=EAGER_LEASE, worker=EAGER_WORKER, scheduled=scheduled,
        rate_limits=rate_limits.claim_parameter(),
    )  # fmt: skip
    if job is None:
        return None
    breakers.claimed([job])
    rate_limits.claimed([job])
    context = HandlerContext(job, alias=alias, on_heartbeat=lambda: None)
    outcome = execute(job, context)
    status = record(alias, [outcome])[0]
    if not context.opened_breaker:
        breakers.record_attempts(alias, [(job, status, outcome.kind, outcome.error)])
    # An outcome the handler raised (Snooze, Retry, Cancel, Fail) is its decision, recorded: not re-raised.
    if isinstance(outcome.exception, HandlerOutcome):
        return status
    if outcome.exception is not None and (app_settings.EAGER_PROPAGATES if propagate is None else propagate):
        raise outcome.exception
    return status


def run_jobs(
    *,
    queues: Sequence[str] | None = None,
    include_scheduled: bool = False,
    using: str | None = None,
    propagate: bool | None = None,
) -> list[JobId]:
    """Run queued jobs synchronously in priority order until none is left; return the ids run.

    Jobs that handlers enqueue meanwhile run too. ``include_scheduled`` also runs jobs whose
    run_at is in the future (delays, debounce windows, retries), now.
    """
    alias = using or router.db_for_write(Job)
    jobs = Job.objects.using(alias).all()
    if queues is not None:
        jobs = jobs.filter(queue__in=list(queues))
    return _run_until_none(alias, jobs, ("-priority", "run_at", "id"), scheduled=include_scheduled, propagate=propagate)


def _run_until_none(
    alias: str, jobs: QuerySet[Job], order: tuple[str, ...], *, scheduled: bool, propagate: bool | None
) -> list[JobId]:
    """Run the queued jobs among ``jobs``, next first by ``order``, until none is left; return the ids run."""
    ran: list[JobId] = []
    skipped: set[JobId] = set()
    while len(ran) < MAX_EAGER_RUNS:
        queued = jobs.filter(status=JobStatus.QUEUED).exclude(pk__in=skipped)
        if not scheduled:
            queued = queued.filter(run_at__lte=Now())
        job_id: JobId | None = queued.order_by(*order).values_list("id", flat=True).first()
        if job_id is None:
            return ran
        if run_job(job_id, using=alias, scheduled=scheduled, propagate=propagate) is None:
            skipped.add(job_id)  # not claimable now (its concurrency key is saturated)
        else:
            ran.append(job_id)
    return ran
