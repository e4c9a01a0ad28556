"""Dead letters: jobs whose last attempt failed stay immutable; redrive runs them again as new jobs."""

from __future__ import annotations

import logging

from django.db import router

from django_workhorse import conf, sql
from django_workhorse.conf import app_settings
from django_workhorse.exceptions import JobDoesNotExist, JobNotDeadError, RedriveConflictError
from django_workhorse.models import Job
from django_workhorse.operations import check_requested_by
from django_workhorse.storable import check_id, check_text
from django_workhorse.types import JobId

logger = logging.getLogger(__name__)


def redrive(
    job_id: int, *, request_id: str, requested_by: str = "", reason: str = "", using: str | None = None
) -> JobId:
    """Run dead job ``job_id`` again as a new job and return the new job's id.

    The new job copies the type, queue, payload, priority, tags, attempt budget, retry policy and
    timeout; its deadline is cleared and checkpoints are not copied. The lineage is recorded. A
    repeat with the same ``request_id`` returns the same new job; one with a different
    ``requested_by`` or ``reason`` raises ``RedriveConflictError``. Raise ``JobDoesNotExist`` or
    ``JobNotDeadError`` when there is no dead job ``job_id``, ``InvalidArgumentError`` for a bad argument.
    """
    check_id(job_id, "job_id")
    check_text(request_id, "request_id", max_chars=conf.MAX_REQUEST_ID_CHARS)
    check_requested_by(requested_by)
    check_text(reason, "reason", max_chars=conf.MAX_REASON_CHARS, allow_empty=True)
    alias = using or router.db_for_write(Job)
    row = sql.redrive(
        alias,
        source_id=job_id,
        request_id=request_id,
        requested_by=requested_by,
        reason=reason,
        channel=app_settings.NOTIFY_CHANNEL,
    )
    if row is None:  # not dead, missing, or redriven by a transaction our snapshot could not see
        row = sql.find_redrive(alias, source_id=job_id, request_id=request_id)
    if row is None:
        status = Job.objects.using(alias).filter(pk=job_id).values_list("status", flat=True).first()
        if status is None:
            raise JobDoesNotExist(f"no job has id {job_id}")
        raise JobNotDeadError(job_id, status)
    created, new_job_id, stored_by, stored_reason = row
    if created:
        logger.info("Redrove job id=%s as id=%s request_id=%s", job_id, new_job_id, request_id)
        return new_job_id
    differs = [
        name for name, a, b in (("requested_by", stored_by, requested_by), ("reason", stored_reason, reason)) if a != b
    ]
    if differs:
        raise RedriveConflictError(
            source_id=job_id, request_id=request_id, new_job_id=new_job_id, conflicting_fields=differs
        )
    return new_job_id
