"""Dead letters: the jobs whose last attempt failed, with their error; redrive in bulk."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import URLPattern
from django.utils.safestring import SafeString

from django_workhorse.models import Job, JobStatus

from .base import has_permission
from .display import instant_cell
from .jobs import JobAdmin, TagFilter


class DeadJobAdmin(JobAdmin):
    """Dead letters: jobs whose last attempt failed, with their error; redrive in bulk."""

    list_display = ["id", "job", "attempts", "died_at", "last_error_line"]
    list_filter = [("queue", admin.AllValuesFieldListFilter), ("job_type", admin.AllValuesFieldListFilter), TagFilter]
    change_list_template = "admin/workhorse/change_list.html"  # not the jobs' dashboard button
    actions = ["redrive_jobs"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).filter(status=JobStatus.DEAD)

    def get_urls(self) -> list[URLPattern]:
        return admin.ModelAdmin.get_urls(self)  # not the jobs' dashboard a second time

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_permission(request, "view_job") or super().has_view_permission(request, obj)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "view_job") or super().has_module_permission(request)

    @admin.display(description="died at", ordering="finished_at")
    def died_at(self, obj: Job) -> SafeString | str:
        return instant_cell(obj.finished_at)
