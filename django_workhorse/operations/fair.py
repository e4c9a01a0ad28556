"""Operator view of fair queues: per queue declared fair, how many partition keys have ready work
and which keys hold the most of it. ``workhorse_status``, the dashboard and the metrics gauge read
``fair_queue_states``. See docs/fair-queues.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import router
from django.db.models import Count
from django.utils import timezone

from django_workhorse.admission.fair import is_fair
from django_workhorse.conf import app_settings
from django_workhorse.models import Job, JobStatus

# How many of a fair queue's keys the status shows, those with the most ready jobs.
TOP_KEYS = 5


@dataclass(frozen=True)
class FairQueueStatus:
    """One fair queue as an operator sees it: its ready work by partition key."""

    queue: str
    keys_with_ready_work: int
    unkeyed_ready: int  # ready jobs without a partition key (one more key to the claim)
    top_keys: list[tuple[str, int]]  # (key, ready jobs), most first, at most TOP_KEYS

    def as_json(self) -> dict[str, object]:
        """Return a JSON-ready dict."""
        return {
            "queue": self.queue,
            "keys_with_ready_work": self.keys_with_ready_work,
            "unkeyed_ready": self.unkeyed_ready,
            "top_keys": [{"key": key, "ready": ready} for key, ready in self.top_keys],
        }


def fair_queues() -> list[str]:
    """The queues ``WORKHORSE_QUEUES`` declares fair, by name."""
    queues: Any = app_settings.QUEUES
    return sorted(queue for queue in queues if is_fair(queue)) if isinstance(queues, dict) else []


def fair_queue_states(*, using: str | None = None, now: datetime | None = None) -> list[FairQueueStatus]:
    """Each fair queue's ready work by key, read through workhorse_job_fair_ready_idx."""
    alias = using or router.db_for_read(Job)
    now = now or timezone.now()
    states = []
    for queue in fair_queues():
        ready = Job.objects.using(alias).filter(queue=queue, status=JobStatus.QUEUED, run_at__lte=now)
        keyed = ready.filter(partition_key__isnull=False)
        counts = keyed.values("partition_key").annotate(ready=Count("id")).order_by("-ready", "partition_key")
        states.append(
            FairQueueStatus(
                queue=queue,
                keys_with_ready_work=keyed.aggregate(keys=Count("partition_key", distinct=True))["keys"],
                unkeyed_ready=ready.filter(partition_key__isnull=True).count(),
                top_keys=[(row["partition_key"], row["ready"]) for row in counts[:TOP_KEYS]],
            )
        )
    return states
