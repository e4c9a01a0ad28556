"""The two states the admin derives rather than stores: a failing job, a stale worker.

A *failing* job is a queued one waiting for a retry: it ran (``attempt > 0``) and its last attempt
left an error. A *stale* worker sent its last heartbeat longer ago than
``WORKHORSE_WORKER_STALE_AFTER``: it stopped or lost the database, and maintenance removes its record.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Q
from django.utils import timezone

from django_workhorse.conf import app_settings
from django_workhorse.models import Job, JobStatus

FAILING = "failing"
ALIVE, STALE = "alive", "stale"


def failing_q() -> Q:
    """Queued jobs waiting for a retry: they ran, and their last attempt left an error."""
    return Q(status=JobStatus.QUEUED, attempt__gt=0) & ~Q(last_error="")


def is_failing(job: Job) -> bool:
    """Whether ``job`` is failing (``failing_q``); a list's row reads its error's start, ``error_head``."""
    error = getattr(job, "error_head", None)
    if error is None:
        error = job.last_error
    return job.status == JobStatus.QUEUED and job.attempt > 0 and bool(error)


def failing_by_queue() -> list[tuple[str, int]]:
    """How many jobs are failing in each queue that has some, most first."""
    rows = Job.objects.filter(failing_q()).values("queue").annotate(count=Count("id")).order_by("-count", "queue")
    return [(row["queue"], row["count"]) for row in rows]


def worker_state(heartbeat_at: datetime, now: datetime | None = None) -> str:
    """``stale`` for a worker whose last heartbeat is older than ``WORKHORSE_WORKER_STALE_AFTER``, else ``alive``."""
    return STALE if (now or timezone.now()) - heartbeat_at > app_settings.WORKER_STALE_AFTER else ALIVE
