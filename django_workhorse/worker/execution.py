"""Run one claimed job: find its handler, call it, and record the outcome, fenced by the lease."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone

from django_workhorse import sql
from django_workhorse.exceptions import LeaseLostError
from django_workhorse.fingerprint import canonical_json
from django_workhorse.registry import get_handler
from django_workhorse.retry import RetryPolicy
from django_workhorse.worker.context import HandlerContext

logger = logging.getLogger(__name__)
MAX_ERROR_CHARS = 4000


def run_job(
    job: sql.ClaimedJob, *, alias: str, context: HandlerContext, started: Callable[[], None] | None = None
) -> str:
    """Run ``job`` and record its outcome; return the status written ('lost' if the lease was gone)."""
    now = _now()
    if job.deadline is not None and job.deadline <= now:
        return _fail(alias, job, "DeadlineExceeded: the job's deadline passed before it could start", final=True)
    if started is not None:
        started()
    began = time.monotonic()
    try:
        result = get_handler(job.job_type).call(job.payload, context)
        result_json = canonical_json(result)
    except LeaseLostError:
        logger.warning("Lease lost id=%s attempt=%s", job.id, job.attempt)
        return "lost"
    except Exception as exc:  # the handler's failure is the job's, not the worker's
        return _fail(alias, job, _describe(exc))
    if job.timeout is not None and time.monotonic() - began > job.timeout.total_seconds():
        return _fail(alias, job, f"TimeoutError: the attempt ran longer than its timeout of {job.timeout}")
    return _record(alias, job, "succeeded", result=result_json, events=[("succeeded", {})])


def _fail(alias: str, job: sql.ClaimedJob, error: str, *, final: bool = False) -> str:
    retry_at = None if final else _retry_at(job)
    failed = ("failed", {"error": error[:500]})
    if retry_at is None:
        return _record(alias, job, "dead", error=error, events=[failed, ("dead", {})])
    return _record(
        alias, job, "queued", error=error, run_at=retry_at, events=[failed, ("retry_scheduled", {"run_at": retry_at})]
    )


def _record(alias: str, job: sql.ClaimedJob, status: str, **values: object) -> str:
    if not sql.finish(alias, job, status=status, **values):  # type: ignore[arg-type]
        logger.warning("Lease lost before recording id=%s attempt=%s status=%s", job.id, job.attempt, status)
        return "lost"
    logger.info("Finished job id=%s type=%s attempt=%s status=%s", job.id, job.job_type, job.attempt, status)
    return status


def _retry_at(job: sql.ClaimedJob) -> datetime | None:
    """Return when to run the next attempt, or None when the job should be dead now."""
    if job.attempt >= job.max_attempts:
        return None
    retry_at = _now() + RetryPolicy.from_json(job.retry_policy).delay_for(job.attempt)
    if job.deadline is not None and retry_at > job.deadline:
        return None
    return retry_at


def _describe(exc: BaseException) -> str:
    summary = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-8))
    text = f"{type(exc).__name__}: {exc}\n{summary}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _now() -> datetime:
    return datetime.now(timezone.utc)
