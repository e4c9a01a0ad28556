"""Queues: every queue that has jobs or a pause record, with its queued and running jobs and
whether it is paused (since when, by whom); pause and resume.

Pause needs ``workhorse.pause_queue``, resume ``workhorse.resume_queue``; a user without one sees
no such button, and a request without it is refused. Both call the service
(``operations.queues``) and record the acting user. A pause touches no job: running jobs run on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from django_workhorse.exceptions import InvalidArgumentError
from django_workhorse.models import QueueState
from django_workhorse.operations import stats
from django_workhorse.operations.queues import pause_queue, resume_queue

from .base import ReadOnlyAdmin, actor, has_permission


@dataclass(frozen=True)
class QueueRow:
    """One line of the Queues page."""

    queue: str
    queued: int
    running: int
    paused: bool
    since: datetime | None
    by: str


def queue_rows(now: datetime | None = None) -> list[QueueRow]:
    """Every queue that has queued, running or dead jobs, or a pause record, by name."""
    depths = {depth.queue: depth for depth in stats.queue_depths(now=now or timezone.now())}
    states = {state.queue: state for state in QueueState.objects.all()}
    rows = []
    for name in sorted({*depths, *states}):
        depth, state = depths.get(name), states.get(name)
        queued = 0 if depth is None else depth.ready + depth.scheduled
        running = 0 if depth is None else depth.running
        rows.append(
            QueueRow(
                queue=name,
                queued=queued,
                running=running,
                paused=state is not None and state.paused,
                since=None if state is None else state.changed_at,
                by="" if state is None else state.changed_by,
            )
        )
    return rows


class QueueAdmin(ReadOnlyAdmin):
    """The Queues page: depths and pauses of every queue; pause and resume buttons by permission."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_permission(request, "view_queuestate") or has_permission(request, "view_job")

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "pause_queue")

    def has_resume_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "resume_queue")

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self._act(request)
        context = {
            **self.admin_site.each_context(request),
            **(extra_context or {}),
            "title": "Queues",
            "opts": self.model._meta,
            "rows": queue_rows(),
            "can_pause": self.has_pause_permission(request),
            "can_resume": self.has_resume_permission(request),
        }
        return TemplateResponse(request, "admin/workhorse/queue_list.html", context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return HttpResponseRedirect(self._list_url())  # the list says all there is of a queue

    def _act(self, request: HttpRequest) -> HttpResponse:
        action, queue = request.POST.get("action"), request.POST.get("queue", "")
        if action == "pause" and self.has_pause_permission(request):
            switch, done, already = pause_queue, "is paused: no worker claims its jobs", "was paused already"
        elif action == "resume" and self.has_resume_permission(request):
            switch, done, already = resume_queue, "is resumed: workers claim its jobs again", "was not paused"
        else:
            raise PermissionDenied
        try:
            change = switch(queue, by=actor(request))
        except InvalidArgumentError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.message_user(request, f"Queue {queue} {done if change.changed else already}.", messages.SUCCESS)
        return HttpResponseRedirect(self._list_url())

    def _list_url(self) -> str:
        return reverse(f"{self.admin_site.name}:workhorse_queuestate_changelist")
