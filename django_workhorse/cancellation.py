"""Cancellation: queued jobs stop at once, running ones are asked to stop (cooperatively)."""

from __future__ import annotations

from django.db import router

from django_workhorse import sql
from django_workhorse.exceptions import JobDoesNotExist
from django_workhorse.models import Job, JobStatus
from django_workhorse.operations import check_requested_by
from django_workhorse.storable import check_id


def cancel(job_id: int, *, requested_by: str = "", using: str | None = None) -> JobStatus:
    """Cancel job ``job_id`` and return its status before the request.

    A queued job becomes ``cancelled``. A running job is asked to stop: its handler sees
    ``ctx.cancelled`` within a heartbeat (lease / 3) and should return or call
    ``ctx.raise_if_cancelled()``; the job then ends ``cancelled``. A finished job is left alone.
    Raise ``JobDoesNotExist`` if there is no such job, ``InvalidArgumentError`` for a bad argument.
    """
    check_id(job_id, "job_id")
    status = sql.cancel(using or router.db_for_write(Job), job_id, check_requested_by(requested_by))
    if status is None:
        raise JobDoesNotExist(f"no job has id {job_id}")
    return JobStatus(status)
