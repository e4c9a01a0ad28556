"""Registered worker processes, their last heartbeat and the jobs they hold."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import OuterRef, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html_join

from django_workhorse.models import Job, JobStatus, WorkerRecord

from .base import ReadOnlyAdmin
from .display import job_anchor


class WorkerAdmin(ReadOnlyAdmin):
    """Registered worker processes, their last heartbeat and the jobs they hold."""

    list_display = ["name", "host", "pid", "queue_list", "concurrency", "heartbeat_at", "heartbeat_age", "jobs"]
    readonly_fields = ["name", "host", "pid", "queues", "concurrency", "started_at", "heartbeat_at", "jobs"]
    ordering = ["name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        running = Job.objects.filter(status=JobStatus.RUNNING, claimed_by=OuterRef("name")).order_by("id")
        return super().get_queryset(request).annotate(running_job_ids=ArraySubquery(running.values("id")))

    @admin.display(description="queues")
    def queue_list(self, obj: WorkerRecord) -> str:
        return ", ".join(obj.queues)

    @admin.display(description="heartbeat age")
    def heartbeat_age(self, obj: WorkerRecord) -> str:
        seconds = max((timezone.now() - obj.heartbeat_at).total_seconds(), 0.0)
        return f"{seconds:.0f} s"

    @admin.display(description="current jobs")
    def jobs(self, obj: Any) -> str:
        return format_html_join(", ", "{}", ((job_anchor(pk),) for pk in obj.running_job_ids))
