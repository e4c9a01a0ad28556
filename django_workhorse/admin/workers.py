"""Registered worker processes, their last heartbeat and the jobs they hold."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import OuterRef, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from django_workhorse.models import Job, JobStatus, WorkerRecord

from .base import ReadOnlyAdmin
from .display import cut, instant_cell, instant_field, job_anchor, stacked
from .states import ALIVE, worker_state


class WorkerAdmin(ReadOnlyAdmin):
    """Registered worker processes, their last heartbeat and the jobs they hold."""

    list_display = ["worker", "pid", "process", "queue_list", "concurrency", "heartbeat", "activity", "jobs"]
    fields = readonly_fields = (
        "name",
        "host",
        "pid",
        "process",
        "queues",
        "concurrency",
        "started",
        "last_heartbeat",
        "activity",
        "jobs",
    )
    ordering = ["name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        running = Job.objects.filter(status=JobStatus.RUNNING, claimed_by=OuterRef("name")).order_by("id")
        return super().get_queryset(request).annotate(running_job_ids=ArraySubquery(running.values("id")))

    started = instant_field("started_at", "started at")
    last_heartbeat = instant_field("heartbeat_at", "last heartbeat")

    @admin.display(description="worker (host)", ordering="name")
    def worker(self, obj: WorkerRecord) -> SafeString:
        return stacked(cut(obj.name, width="wide"), cut(obj.host, width="wide"))

    @admin.display(description="queues")
    def queue_list(self, obj: WorkerRecord) -> SafeString:
        return cut(", ".join(obj.queues))

    @admin.display(description="last heartbeat", ordering="heartbeat_at")
    def heartbeat(self, obj: WorkerRecord) -> SafeString:
        seconds = max((timezone.now() - obj.heartbeat_at).total_seconds(), 0.0)
        return stacked(instant_cell(obj.heartbeat_at), f"{seconds:.0f} s ago")

    @admin.display(description="process")
    def process(self, obj: WorkerRecord) -> SafeString | str:
        if obj.kind == "child":
            return stacked("child", cut(f"of {obj.supervisor}", width="wide"))
        return str(obj.kind)

    # Not named ``state``: the registry row has a column of that name (what the process last said),
    # and the admin shows a model field before a method of the same name.
    @admin.display(description="state")
    def activity(self, obj: WorkerRecord) -> SafeString | str:
        # Alive or stale by its heartbeat; while alive, what it last said it does (draining, ...).
        liveness = worker_state(obj.heartbeat_at)
        return stacked(liveness, obj.state) if liveness == ALIVE else liveness

    @admin.display(description="current jobs")
    def jobs(self, obj: Any) -> str:
        return format_html_join(", ", "{}", ((job_anchor(pk),) for pk in obj.running_job_ids))
