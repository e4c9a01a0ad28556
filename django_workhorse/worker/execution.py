"""Run one claimed job: find its handler, call it, and record the outcome, fenced by the lease."""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from django.db import transaction

from django_workhorse import sql
from django_workhorse.conf import app_settings
from django_workhorse.encryption.jobs import (
    LAST_ERROR,
    PAYLOAD,
    RESULT,
    SEALED_EVENT_DETAILS,
    open_value,
    seal_value,
    shown_error,
)
from django_workhorse.enqueueing.storable import check_json, storable_text
from django_workhorse.exceptions import (
    AttemptTimeoutError,
    DecryptionError,
    HandlerNotRegisteredError,
    JobCancelledError,
    LeaseLostError,
    ResultNotStorableError,
)
from django_workhorse.observability import tracing
from django_workhorse.observability.log_fields import job_fields, printable
from django_workhorse.outcomes.values import Cancel, Fail, HandlerOutcome, Retry, Snooze, dead_letters
from django_workhorse.tasks.registry import Handler, get_handler
from django_workhorse.tasks.retry import RetryPolicy
from django_workhorse.worker import current
from django_workhorse.worker.context import HandlerContext

logger = logging.getLogger(__name__)
MAX_ERROR_CHARS = 4000
MAX_DETAIL_CHARS = 500
# How much of an error's first line a log record about a failed attempt shows.
MAX_LOGGED_ERROR_CHARS = 200
# The retry delay when a job's stored retry policy cannot be read.
FALLBACK_RETRY_DELAY = timedelta(minutes=1)


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, ready to be written by ``sql.outcomes.record_outcomes``."""

    job: sql.claims.ClaimedJob
    status: str  # succeeded, queued (retry or snooze at run_at), dead, cancelled, or lost (nothing to write)
    result_json: str | None = None
    error: str = ""
    run_at: datetime | None = None
    events: tuple[tuple[str, dict[str, Any]], ...] = ()
    exception: BaseException | None = None  # the handler's, kept for eager mode (never stored)
    duration: float | None = None  # seconds the attempt ran, set by the worker (for its metrics)
    # What the attempt came to, one of OUTCOMES (the metrics' outcome label, the span's attribute).
    kind: str = ""

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", _KIND_OF_STATUS[self.status])


# The outcome of an attempt: succeeded; retry (failed, runs again); snoozed (back to queued, no
# attempt consumed); cancelled; failed (dead at once by the handler's decision: Fail, fail_on,
# retry_on); dead (no attempt or time left); lost (the lease was gone); given_back (no handler after
# all, back to queued with no attempt consumed). A bounded label set.
OUTCOMES = ("succeeded", "retry", "snoozed", "cancelled", "failed", "dead", "lost", "given_back")
_KIND_OF_STATUS = {
    "succeeded": "succeeded",
    "queued": "retry",
    "cancelled": "cancelled",
    "dead": "dead",
    "lost": "lost",
}


def execute(job: sql.claims.ClaimedJob, context: HandlerContext, started: Callable[[], None] | None = None) -> Outcome:
    """Run ``job``'s handler and decide the outcome; write nothing. Traced as one consumer span."""
    with tracing.processing(job) as span:
        outcome = _execute(job, context, started)
        tracing.finished(span, outcome)
    return outcome


def _execute(job: sql.claims.ClaimedJob, context: HandlerContext, started: Callable[[], None] | None) -> Outcome:
    if job.deadline is not None and job.deadline <= _now():
        return _failure(job, "DeadlineExceeded: the job's deadline passed before it could start", final=True)
    if started is not None:
        started()
    began = time.monotonic()
    handler: Handler | None = None
    try:
        handler = get_handler(job.job_type)
    except HandlerNotRegisteredError:
        return given_back(job)
    try:
        payload = opened_payload(job)
    except DecryptionError as exc:  # fail closed: this attempt fails, readably, and the worker goes on
        return _failure(job, brief(exc), exception=exc)
    try:
        with current.running(job.id):
            value = handler.call(payload, context)
    except LeaseLostError:
        logger.warning("Lease lost id=%s attempt=%s", job.id, job.attempt, extra=job_fields(job))
        return Outcome(job, "lost")
    except JobCancelledError as exc:
        if exc.job_id is not None and exc.job_id != job.id:  # a job it waited on was cancelled, not this one
            return failure(job, exc, handler)
        return Outcome(job, "cancelled", events=(("cancelled", {}),))
    except HandlerOutcome as decided:
        if isinstance(decided, Snooze) and decided.breaker:
            try:  # Snooze(until=reset, breaker=True): the whole destination waits, not only this job
                context.open_breaker(until=decided.run_at(_now()))
            except Exception as exc:  # no breaker, an instant in the past: this job's failure
                return failure(job, exc, handler)
        return decision(job, decided)
    except BaseException as exc:  # the handler's failure (even sys.exit()) is the job's, not the worker's
        return failure(job, exc, handler)
    if job.timeout is not None and time.monotonic() - began > job.timeout.total_seconds():
        error = f"TimeoutError: the attempt ran longer than its timeout of {job.timeout}"
        return _failure(job, error, exception_class=_class_path(AttemptTimeoutError))
    try:
        result_json = check_json(value, "result", max_bytes=app_settings.MAX_RESULT_BYTES, error=ResultNotStorableError)
        if job.cipher_salt is not None:
            result_json = _sealed_result(job, result_json, app_settings.MAX_RESULT_BYTES)
    except ResultNotStorableError as exc:
        return _failure(job, f"ResultNotStorable: {safe_str(exc)}", exception=exc)
    except Exception as exc:  # a value whose serialization itself misbehaves (a failing __str__, ...)
        error = f"ResultNotStorable: result could not be serialized: {brief(exc)}"
        return _failure(job, error, exception=exc, exception_class=_class_path(ResultNotStorableError))
    return Outcome(job, "succeeded", result_json=result_json, events=(("succeeded", {}),))


def opened_payload(job: sql.claims.ClaimedJob) -> Any:
    """Return ``job``'s payload for its handler: an encrypted job's envelope opened and parsed.

    Raise ``DecryptionError`` (naming the job, the field and the key id) if it does not open.
    """
    if job.cipher_salt is None:
        return job.payload
    envelope = job.payload if isinstance(job.payload, str) else ""  # even a null payload is sealed
    return json.loads(open_value(envelope, field=PAYLOAD, salt=job.cipher_salt, job_id=job.id))


def _sealed_result(job: sql.claims.ClaimedJob, result_json: str, max_bytes: int) -> str:
    """The JSON string of the result's envelope, checked against the result bound (what is stored)."""
    assert job.cipher_salt is not None
    stored = f'"{seal_value(result_json, field=RESULT, salt=job.cipher_salt)}"'  # an envelope needs no escaping
    if len(stored) > max_bytes:
        bound = f"at most {max_bytes} bytes serialized"
        raise ResultNotStorableError(field="result", bound=bound, value=f"{len(stored)} bytes once encrypted")
    return stored


def failure(job: sql.claims.ClaimedJob, exc: BaseException, handler: Handler | None = None) -> Outcome:
    """Return the outcome of an attempt that raised ``exc``: a retry, or dead on its last attempt, or
    dead at once when ``handler``'s ``fail_on``/``retry_on`` say so."""
    if handler is not None and dead_letters(exc, fail_on=handler.fail_on, retry_on=handler.retry_on):
        rule = "fail_on" if isinstance(exc, handler.fail_on) else "retry_on"
        return _failure(
            job, describe(exc), final=True, exception=exc, kind="failed", details={"outcome": "fail", "rule": rule}
        )
    return _failure(job, describe(exc), exception=exc)


def decision(job: sql.claims.ClaimedJob, decided: HandlerOutcome) -> Outcome:
    """Return the outcome a handler asked for by raising ``Snooze``, ``Retry``, ``Cancel`` or ``Fail``."""
    if isinstance(decided, Snooze):
        return _snoozed(job, decided)
    if isinstance(decided, Retry):
        details = {"outcome": "retry", "after": None if decided.after is None else decided.after.total_seconds()}
        return _failure(job, describe(decided), exception=decided, floor=decided.after, details=details)
    if isinstance(decided, Cancel):
        reason = storable_text(decided.reason, MAX_ERROR_CHARS)
        return Outcome(job, "cancelled", error=reason, events=(("cancelled", {"outcome": "cancel", "reason": reason}),))
    if isinstance(decided, Fail):
        details = {"outcome": "fail", "reason": storable_text(decided.reason, MAX_DETAIL_CHARS)}
        return _failure(job, describe(decided), final=True, exception=decided, kind="failed", details=details)
    return failure(job, decided)  # a HandlerOutcome of no known kind: a failure like any other


# How long a job whose handler this worker lacks after all is held before a claim sees it again.
NO_HANDLER_HOLD = timedelta(seconds=5)


def given_back(job: sql.claims.ClaimedJob) -> Outcome:
    """Back to queued for ``NO_HANDLER_HOLD``, no attempt (and no snooze) consumed: the claim took a job
    whose handler this worker cannot find after all (a racy edge: a django.tasks task missing from an
    advertised module, a handler unregistered since the worker started), so another worker may run it."""
    logger.warning("No handler for job type=%s id=%s: given back", job.job_type, job.id, extra=job_fields(job))
    held = ("held", {"reason": "no handler", "until": (_now() + NO_HANDLER_HOLD).isoformat()})
    return Outcome(job, "queued", run_at=_now() + NO_HANDLER_HOLD, events=(held,), kind="given_back")


def _snoozed(job: sql.claims.ClaimedJob, snooze: Snooze) -> Outcome:
    """Back to queued at the snooze's instant, no attempt consumed: unless the job has snoozed
    ``WORKHORSE_MAX_SNOOZES`` times already, or the instant is past its deadline (then dead)."""
    limit = app_settings.MAX_SNOOZES
    details: dict[str, Any] = {"outcome": "snooze"}
    if job.snoozes >= limit:
        return _failure(job, f"Snooze: snoozed more than {limit} times", final=True, kind="dead", details=details)
    run_at = snooze.run_at(_now())
    if job.deadline is not None and run_at > job.deadline:
        error = f"Snooze: snoozed until {run_at.isoformat()}, past the job's deadline {job.deadline.isoformat()}"
        return _failure(job, error, final=True, kind="dead", details=details)
    snoozed = ("snoozed", {"until": run_at.isoformat(), "snoozes": job.snoozes + 1})
    return Outcome(job, "queued", run_at=run_at, events=(snoozed,), kind="snoozed")


def unwritable(outcome: Outcome, error: BaseException) -> Outcome:
    """Return a failure to write in place of ``outcome``, which could not be written (``error``)."""
    reason = f"OutcomeNotStorable: the {outcome.status} outcome could not be written: {brief(error)}"
    return _failure(outcome.job, reason, exception=outcome.exception, exception_class=_class_path(type(error)))


def storable(outcome: Outcome) -> Outcome:
    """Return ``outcome`` with its error and event details in a form PostgreSQL can store: an
    encrypted job's error sealed (decision 0024), so an error cannot leak the payload it failed on."""
    job = outcome.job
    events = tuple(
        (storable_text(kind), _sealed_details(job, _storable_details(details))) for kind, details in outcome.events
    )
    error = _sealed_text(job, storable_text(outcome.error, MAX_ERROR_CHARS), LAST_ERROR)
    return replace(outcome, error=error, events=events)


def _sealed_details(job: sql.claims.ClaimedJob, details: dict[str, Any]) -> dict[str, Any]:
    if job.cipher_salt is None:
        return details
    return {
        name: _sealed_text(job, value, f"event.{name}")
        if name in SEALED_EVENT_DETAILS and isinstance(value, str)
        else value
        for name, value in details.items()
    }


def _sealed_text(job: sql.claims.ClaimedJob, text: str, field: str) -> str:
    """``text`` sealed for ``field`` of an encrypted ``job``; a clear job's (or an empty) text as it is."""
    if job.cipher_salt is None or not text:
        return text
    try:
        return seal_value(text, field=field, salt=job.cipher_salt)
    except Exception as exc:  # no key to seal with here: say so, and never store the text in clear
        return f"EncryptionError: the {field} of this encrypted job could not be sealed ({type(exc).__name__})"


def record(alias: str, outcomes: Sequence[Outcome]) -> list[str]:
    """Write ``outcomes`` in one statement, fenced by each lease; return each status ('lost' if not held)."""
    writable = [storable(outcome) for outcome in outcomes if outcome.status != "lost"]
    held = _write(alias, writable) if writable else set()
    statuses = []
    for outcome in outcomes:
        job = outcome.job
        status = outcome.status if job.id in held else "lost"
        if status == "lost" and outcome.status != "lost":
            logger.warning("Lease lost before recording id=%s attempt=%s", job.id, job.attempt, extra=job_fields(job))
        _log_finished(outcome, status)
        statuses.append(status)
    return statuses


# The outcomes that can leave a job cancelled: a cancel, and a retry or snooze that meets a
# cancellation requested meanwhile (sql.outcomes turns it into one).
_MAY_END_CANCELLED = frozenset({"cancelled", "queued"})


def _write(alias: str, writable: Sequence[Outcome]) -> set[int]:
    """Record ``writable``; a batch with a workflow step also releases the children it satisfies,
    and cancels the waiting descendants of a step that ended cancelled, in the same transaction."""
    steps = [outcome for outcome in writable if outcome.job.workflow_id is not None]
    if not steps:
        return sql.outcomes.record_outcomes(alias, writable)
    if not any(outcome.status in _MAY_END_CANCELLED for outcome in steps):
        # Nothing can end cancelled: the releasing statement alone, no transaction round trips.
        return sql.outcomes.record_outcomes_releasing(alias, writable)[0]
    with transaction.atomic(using=alias):
        held, cancelled = sql.outcomes.record_outcomes_releasing(alias, writable)
        if cancelled:
            sql.workflow_control.cascade_cancel(alias, cancelled, requested_by="")
    return held


def _log_finished(outcome: Outcome, status: str) -> None:
    """Log how an attempt ended: a retry as a WARNING, a dead job as an ERROR, the rest as INFO."""
    job = outcome.job
    fields = {**job_fields(job), "status": status}
    if outcome.kind == "given_back":
        return  # logged when it was given back
    if status == "queued" and outcome.run_at is not None:
        error = error_head(shown_error(outcome.error, job.cipher_salt, outcome.exception))
        logger.warning(
            "Job failed, will retry id=%s type=%s attempt=%s/%s next run_at=%s error=%s",
            job.id,
            job.job_type,
            job.attempt,
            job.max_attempts,
            outcome.run_at.isoformat(),
            error,
            extra={**fields, "run_at": outcome.run_at.isoformat(), "error": error},
        )
    elif status == "dead":
        error = error_head(shown_error(outcome.error, job.cipher_salt, outcome.exception))
        logger.error(
            "Job failed, dead id=%s type=%s attempt=%s/%s no more attempts error=%s"
            if outcome.kind != "failed"
            else "Job failed, dead id=%s type=%s attempt=%s/%s at the handler's decision error=%s",
            job.id,
            job.job_type,
            job.attempt,
            job.max_attempts,
            error,
            extra={**fields, "error": error},
        )
    else:
        logger.info(
            "Finished job id=%s type=%s attempt=%s status=%s",
            job.id,
            job.job_type,
            job.attempt,
            status,
            extra=fields,
        )


def error_head(error: str) -> str:
    """Return the first line of ``error``, its control characters escaped as in Python, cut to
    ``MAX_LOGGED_ERROR_CHARS`` (ending in "..." when cut): what a log line shows of an error."""
    lines = error.strip().splitlines()
    line = printable(lines[0] if lines else "")
    if len(line) <= MAX_LOGGED_ERROR_CHARS:
        return line
    return line[: MAX_LOGGED_ERROR_CHARS - 3] + "..."


def _failure(
    job: sql.claims.ClaimedJob,
    error: str,
    *,
    final: bool = False,
    exception: BaseException | None = None,
    exception_class: str | None = None,
    floor: timedelta | None = None,
    kind: str = "",
    details: dict[str, Any] | None = None,
) -> Outcome:
    retry_at = None if final else _retry_at(job, floor)
    error = storable_text(error, MAX_ERROR_CHARS)
    extra = details or {}
    details = {
        "error": error[:MAX_DETAIL_CHARS],
        **extra,
    }  # a prefix of last_error (the django.tasks backend matches it)
    # The dotted path of what was raised, for the django.tasks backend's TaskError.
    if exception is not None:
        exception_class = exception_class or _class_path(type(exception))
    if exception_class is not None:
        details["exception_class"] = exception_class
    failed = ("failed", details)
    if retry_at is None:
        return Outcome(job, "dead", error=error, events=(failed, ("dead", {})), exception=exception, kind=kind)
    retry = ("retry_scheduled", {"run_at": retry_at.isoformat(), **extra})
    return Outcome(job, "queued", error=error, run_at=retry_at, events=(failed, retry), exception=exception)


def _retry_at(job: sql.claims.ClaimedJob, floor: timedelta | None = None) -> datetime | None:
    """Return when to run the next attempt, or None when the job should be dead now. ``floor`` (a
    handler's ``Retry(after=)``) is the least delay, which the policy's ``max_delay`` does not cap."""
    if job.attempt >= job.max_attempts:
        return None
    try:
        delay = RetryPolicy.from_json(job.retry_policy).delay_for(job.attempt)
    except Exception:  # a stored policy this version cannot read must not lose the failure
        logger.exception(
            "Unreadable retry policy id=%s; retrying in %s", job.id, FALLBACK_RETRY_DELAY, extra=job_fields(job)
        )
        delay = FALLBACK_RETRY_DELAY
    if floor is not None:
        delay = max(delay, floor)
    retry_at = _now() + delay
    if job.deadline is not None and retry_at > job.deadline:
        return None
    return retry_at


def _class_path(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def describe(exc: BaseException) -> str:
    """Return ``exc``'s type, message and a traceback summary as storable text, whatever ``exc`` is."""
    try:
        summary = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-8))
    except BaseException:  # formatting calls the exception's own code, which may fail
        summary = ""
    return storable_text(f"{brief(exc)}\n{summary}", MAX_ERROR_CHARS)


def brief(exc: BaseException) -> str:
    """Return ``Type: message`` for ``exc``, even when its ``__str__`` fails or returns no text."""
    return storable_text(f"{type(exc).__name__}: {safe_str(exc)}", MAX_DETAIL_CHARS)


def safe_str(value: object) -> str:
    """Return ``str(value)``; if that fails (or is not text), its ``repr``, else a placeholder."""
    for render in (str, repr):
        try:
            text = render(value)
        except BaseException:  # the object's own __str__/__repr__: anything may come out of it
            continue
        if isinstance(text, str):
            return storable_text(str.__str__(text))
    return f"<unprintable {type(value).__name__}>"


def _storable_details(details: dict[str, Any]) -> dict[str, Any]:
    return {storable_text(str(key)): _storable_value(value) for key, value in details.items()}


def _storable_value(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return _storable_details(value)
    if isinstance(value, (list, tuple)):
        return [_storable_value(item) for item in value]
    return value


def _now() -> datetime:
    return datetime.now(timezone.utc)
