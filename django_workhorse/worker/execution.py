"""Run one claimed job: find its handler, call it, and record the outcome, fenced by the lease."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from django_workhorse import sql
from django_workhorse.exceptions import AttemptTimeoutError, JobCancelledError, LeaseLostError
from django_workhorse.fingerprint import canonical_json
from django_workhorse.registry import get_handler
from django_workhorse.retry import RetryPolicy
from django_workhorse.worker.context import HandlerContext

logger = logging.getLogger(__name__)
MAX_ERROR_CHARS = 4000


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, ready to be written by ``sql.record_outcomes``."""

    job: sql.ClaimedJob
    status: str  # succeeded, queued (retry at run_at), dead, cancelled, or lost (nothing to write)
    result_json: str | None = None
    error: str = ""
    run_at: datetime | None = None
    events: tuple[tuple[str, dict[str, Any]], ...] = ()
    exception: BaseException | None = None  # the handler's, kept for eager mode (never stored)


def execute(job: sql.ClaimedJob, context: HandlerContext, started: Callable[[], None] | None = None) -> Outcome:
    """Run ``job``'s handler and decide the outcome; write nothing."""
    if job.deadline is not None and job.deadline <= _now():
        return _failure(job, "DeadlineExceeded: the job's deadline passed before it could start", final=True)
    if started is not None:
        started()
    began = time.monotonic()
    try:
        result_json = canonical_json(get_handler(job.job_type).call(job.payload, context))
    except LeaseLostError:
        logger.warning("Lease lost id=%s attempt=%s", job.id, job.attempt)
        return Outcome(job, "lost")
    except JobCancelledError:
        return Outcome(job, "cancelled", events=(("cancelled", {}),))
    except BaseException as exc:  # the handler's failure (even sys.exit()) is the job's, not the worker's
        return _failure(job, _describe(exc), exception=exc)
    if job.timeout is not None and time.monotonic() - began > job.timeout.total_seconds():
        error = f"TimeoutError: the attempt ran longer than its timeout of {job.timeout}"
        return _failure(job, error, exception_class=_class_path(AttemptTimeoutError))
    return Outcome(job, "succeeded", result_json=result_json, events=(("succeeded", {}),))


def record(alias: str, outcomes: Sequence[Outcome]) -> list[str]:
    """Write ``outcomes`` in one statement, fenced by each lease; return each status ('lost' if not held)."""
    writable = [outcome for outcome in outcomes if outcome.status != "lost"]
    held = sql.record_outcomes(alias, writable) if writable else set()
    statuses = []
    for outcome in outcomes:
        job = outcome.job
        status = outcome.status if job.id in held else "lost"
        if status == "lost" and outcome.status != "lost":
            logger.warning("Lease lost before recording id=%s attempt=%s", job.id, job.attempt)
        logger.info("Finished job id=%s type=%s attempt=%s status=%s", job.id, job.job_type, job.attempt, status)
        statuses.append(status)
    return statuses


def _failure(
    job: sql.ClaimedJob,
    error: str,
    *,
    final: bool = False,
    exception: BaseException | None = None,
    exception_class: str | None = None,
) -> Outcome:
    retry_at = None if final else _retry_at(job)
    details = {"error": error[:500]}
    # The dotted path of what was raised, for the django.tasks backend's TaskError.
    if exception is not None:
        exception_class = exception_class or _class_path(type(exception))
    if exception_class is not None:
        details["exception_class"] = exception_class
    failed = ("failed", details)
    if retry_at is None:
        return Outcome(job, "dead", error=error, events=(failed, ("dead", {})), exception=exception)
    retry = ("retry_scheduled", {"run_at": retry_at.isoformat()})
    return Outcome(job, "queued", error=error, run_at=retry_at, events=(failed, retry), exception=exception)


def _retry_at(job: sql.ClaimedJob) -> datetime | None:
    """Return when to run the next attempt, or None when the job should be dead now."""
    if job.attempt >= job.max_attempts:
        return None
    retry_at = _now() + RetryPolicy.from_json(job.retry_policy).delay_for(job.attempt)
    if job.deadline is not None and retry_at > job.deadline:
        return None
    return retry_at


def _class_path(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _describe(exc: BaseException) -> str:
    summary = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-8))
    text = f"{type(exc).__name__}: {exc}\n{summary}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _now() -> datetime:
    return datetime.now(timezone.utc)
