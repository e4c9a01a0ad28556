"""Operator actions: cancel, run now, release keys, redrive dead jobs, purge queued jobs.

The twin of ``sql/actions.py``: the admin's actions and the management commands call these and
nothing else. Every action checks its arguments before any SQL (``InvalidArgumentError``) and
records who asked (``requested_by``) in the affected jobs' events; purge, which deletes the jobs
and their history, cannot, so the admin records it in Django's admin log.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import router, transaction
from django.db.models import QuerySet

from django_workhorse import conf, sql
from django_workhorse.conf import app_settings
from django_workhorse.enqueueing.storable import check_id, check_ids, check_text
from django_workhorse.enqueueing.validation import check_queue
from django_workhorse.exceptions import InvalidArgumentError, JobDoesNotExist, JobNotDeadError, RedriveConflictError
from django_workhorse.models import EffectRecord, IdempotencyBinding, Job, JobStatus, Redrive
from django_workhorse.observability import instruments
from django_workhorse.types import JobId

logger = logging.getLogger(__name__)
PURGE_CHUNK = 1000


def cancel(job_id: int, *, requested_by: str = "", using: str | None = None) -> JobStatus:
    """Cancel job ``job_id`` and return its status before the request.

    A queued job, or a workflow step still waiting for its parents, becomes ``cancelled``. A running
    job is asked to stop: its handler sees ``ctx.cancelled`` within a heartbeat (lease / 3) and
    should return or call ``ctx.raise_if_cancelled()``; the job then ends ``cancelled``. A finished
    job is left alone. A workflow step cancelled cancels its waiting descendants too, in the same
    transaction. Raise ``JobDoesNotExist`` if there is no such job, ``InvalidArgumentError`` for a
    bad argument.
    """
    check_id(job_id, "job_id")
    requested_by = check_requested_by(requested_by)
    alias = _alias(using)
    with transaction.atomic(using=alias):
        found = sql.actions.cancel(alias, job_id, requested_by)
        if found is None:
            raise JobDoesNotExist(f"no job has id {job_id}")
        status, workflow_id = found
        if workflow_id is not None and status in (JobStatus.QUEUED, JobStatus.WAITING):
            sql.workflow_control.cascade_cancel(alias, [job_id], requested_by)
    return JobStatus(status)


def run_now(job_ids: Sequence[int], *, requested_by: str = "", using: str | None = None) -> list[int]:
    """Make the given queued, scheduled jobs due now and wake the workers; return the ids moved.

    Raise ``InvalidArgumentError`` unless ``job_ids`` is a sequence of ints (a string is not).
    """
    ids = check_ids(job_ids, "job_ids")
    return sql.actions.run_now(_alias(using), ids, check_requested_by(requested_by), app_settings.NOTIFY_CHANNEL)


def release_bindings(binding_ids: Sequence[int], *, requested_by: str = "", using: str | None = None) -> list[int]:
    """Delete the given bindings, so their keys are free at once; return the ids of the jobs they named.

    The jobs themselves are untouched; the next request with a released key creates a new job.
    Raise ``InvalidArgumentError`` unless ``binding_ids`` is a sequence of ints.
    """
    ids = check_ids(binding_ids, "binding_ids")
    alias = using or router.db_for_write(IdempotencyBinding)
    return sql.actions.release_bindings(alias, ids, check_requested_by(requested_by))


def release_effects(entry_ids: Sequence[int], *, using: str | None = None) -> list[int]:
    """Delete the given ledger entries (``once()`` effects, ``@idempotent`` records); return the ids deleted.

    A released key runs again: the next ``once()`` with it runs the effect, the next request with it
    runs the view. Raise ``InvalidArgumentError`` unless ``entry_ids`` is a sequence of ints.
    """
    ids = check_ids(entry_ids, "entry_ids")
    alias = using or router.db_for_write(EffectRecord)
    return sql.effects.release_effects(alias, ids)


# -- redrive -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedrivePlan:
    """What :func:`redrive` would do for a request: create a job, or return the one it created."""

    new_job_id: JobId | None  # the job an earlier request with this id created; None: a new one


def redrive(
    job_id: int, *, request_id: str, requested_by: str = "", reason: str = "", using: str | None = None
) -> JobId:
    """Run dead job ``job_id`` again as a new job and return the new job's id.

    The new job copies the type, queue, payload, priority, tags, attempt budget, retry policy and
    timeout, and what admits it at claim (its circuit breaker, rate limit and partition, fair share
    key): it spends the same budgets as its source. Its deadline is cleared and checkpoints are not
    copied. The lineage is recorded. A
    repeat with the same ``request_id`` returns the same new job; one with a different
    ``requested_by`` or ``reason`` raises ``RedriveConflictError``. Raise ``JobDoesNotExist`` or
    ``JobNotDeadError`` when there is no dead job ``job_id``, ``InvalidArgumentError`` for a bad argument.
    """
    _check_redrive(job_id, request_id, requested_by, reason)
    alias = _alias(using)
    with transaction.atomic(using=alias):
        sql.actions.lock_redrive_source(alias, job_id)  # redrives of one job take turns
        row = sql.actions.redrive(
            alias,
            source_id=job_id,
            request_id=request_id,
            requested_by=requested_by,
            reason=reason,
            channel=app_settings.NOTIFY_CHANNEL,
        )
    if row is None:  # not dead, missing, or redriven by a transaction our snapshot could not see
        row = sql.actions.find_redrive(alias, source_id=job_id, request_id=request_id)
    if row is None:
        raise _not_redrivable(alias, job_id)
    created, new_job_id, stored_by, stored_reason, queue = row
    if created:
        assert queue is not None  # REDRIVE returns the new job's queue with it
        logger.info("Redrove job id=%s as id=%s request_id=%s", job_id, new_job_id, request_id)
        instruments.redriven(queue)
        return new_job_id
    _check_same_redrive(job_id, request_id, new_job_id, (stored_by, stored_reason), (requested_by, reason))
    return new_job_id


def plan_redrive(
    job_id: int, *, request_id: str, requested_by: str = "", reason: str = "", using: str | None = None
) -> RedrivePlan:
    """Say what :func:`redrive` would do with these arguments, writing nothing (for dry runs).

    Raise what :func:`redrive` would raise: ``JobDoesNotExist``, ``JobNotDeadError``,
    ``RedriveConflictError`` or ``InvalidArgumentError``.
    """
    _check_redrive(job_id, request_id, requested_by, reason)
    alias = _alias(using)
    earlier = (
        Redrive.objects.using(alias)
        .filter(source_id=job_id, request_id=request_id)
        .values_list("new_job_id", "requested_by", "reason")
        .first()
    )
    if earlier is None:
        source = Job.objects.using(alias).filter(pk=job_id, status=JobStatus.DEAD).values("workflow_id", "step_name")
        found = source.first()
        if found is None or (found["workflow_id"] is not None and _latest_of_step(alias, **found) != job_id):
            raise _not_redrivable(alias, job_id)
        return RedrivePlan(new_job_id=None)
    new_job_id, stored_by, stored_reason = earlier
    _check_same_redrive(job_id, request_id, new_job_id, (stored_by, stored_reason), (requested_by, reason))
    return RedrivePlan(new_job_id=new_job_id)


def _check_redrive(job_id: Any, request_id: Any, requested_by: Any, reason: Any) -> None:
    check_id(job_id, "job_id")
    check_text(request_id, "request_id", max_chars=conf.MAX_REQUEST_ID_CHARS)
    check_requested_by(requested_by)
    check_text(reason, "reason", max_chars=conf.MAX_REASON_CHARS, allow_empty=True)


def _check_same_redrive(
    job_id: int, request_id: str, new_job_id: int, stored: tuple[str, str], requested: tuple[str, str]
) -> None:
    """A request id used again must come from the same requester with the same reason."""
    differs = [name for name, a, b in zip(("requested_by", "reason"), stored, requested, strict=True) if a != b]
    if differs:
        raise RedriveConflictError(
            source_id=job_id, request_id=request_id, new_job_id=new_job_id, conflicting_fields=differs
        )


def _not_redrivable(alias: str, job_id: int) -> Exception:
    found = Job.objects.using(alias).filter(pk=job_id).values_list("status", "workflow_id", "step_name").first()
    if found is None:
        return JobDoesNotExist(f"no job has id {job_id}")
    status, workflow_id, step_name = found
    if status != JobStatus.DEAD:
        return JobNotDeadError(job_id, status)
    latest = _latest_of_step(alias, workflow_id, step_name)
    return InvalidArgumentError(
        field="job_id", bound=f"the latest job of its workflow step {step_name!r} (job {latest})", value=job_id
    )


def _latest_of_step(alias: str, workflow_id: int, step_name: str) -> int | None:
    """The current job of a workflow step: the latest of its lineage (a redrive's copy joins it)."""
    jobs = Job.objects.using(alias).filter(workflow_id=workflow_id, step_name=step_name)
    latest: int | None = jobs.order_by("-pk").values_list("pk", flat=True).first()
    return latest


# -- purge -------------------------------------------------------------------------------------------


def purgeable(
    *, queue: str | None = None, job_ids: Sequence[int] | None = None, using: str | None = None
) -> QuerySet[Job]:
    """The queued jobs :func:`purge` would delete now (for previews and dry runs)."""
    queue, ids = _check_purge(queue, job_ids)
    # A queued workflow step is never purged: its edges would go with it, and its children would
    # wait for ever (cancel it instead, which cancels them too).
    jobs: QuerySet[Job] = Job.objects.using(_alias(using)).filter(status=JobStatus.QUEUED, workflow__isnull=True)
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    return jobs if ids is None else jobs.filter(pk__in=ids)


def purge(
    *,
    queue: str | None = None,
    job_ids: Sequence[int] | None = None,
    using: str | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Delete queued jobs of ``queue`` (or the given ids, or both filters) and release their keys at once.

    Running and finished jobs, and workflow steps, are never purged. Jobs go in chunks of 1,000, one statement each;
    ``on_progress(count)`` is called after each. Return how many jobs were deleted. Raise
    ``InvalidArgumentError`` if neither ``queue`` nor ``job_ids`` is given (so nothing is purged by
    accident) or for a bad one (``job_ids`` is a sequence of ints, never a string).
    """
    alias = _alias(using)
    jobs = purgeable(queue=queue, job_ids=job_ids, using=alias).order_by("pk")
    ids = iter(jobs.values_list("pk", flat=True).iterator(chunk_size=PURGE_CHUNK))
    purged = 0
    while chunk := list(itertools.islice(ids, PURGE_CHUNK)):
        purged += sql.housekeeping.purge_queued(alias, queue=queue, job_ids=chunk)
        if on_progress is not None:
            on_progress(len(chunk))
    logger.info("Purged queued jobs count=%s queue=%s", purged, queue)
    return purged


def _check_purge(queue: Any, job_ids: Any) -> tuple[str | None, list[int] | None]:
    if queue is None and job_ids is None:
        raise InvalidArgumentError(field="queue, job_ids", bound="given (at least one of them)")
    if queue is not None:
        check_queue(queue, error=InvalidArgumentError)
    return queue, None if job_ids is None else check_ids(job_ids, "job_ids")


# -- shared ------------------------------------------------------------------------------------------


def check_requested_by(value: Any) -> str:
    """Check who asked for an operator action: storable text of at most 200 characters ("" allowed)."""
    return check_text(value, "requested_by", max_chars=conf.MAX_REQUESTED_BY_CHARS, allow_empty=True)


def _alias(using: str | None) -> str:
    return using or router.db_for_write(Job)
