"""Circuit breakers: each one's state and what it does now, its failures in the window, its latest
transitions and held jobs; a reset behind ``workhorse.reset_breaker``.

A breaker has a row once a job behind it failed (or a handler opened it). The reset closes it and
gives its held jobs back at once (``operations.breakers.reset_breaker``), naming the acting user in
the transition it writes.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_workhorse.models import Breaker, Job, JobStatus
from django_workhorse.operations.breakers import effective_state, failures_in_window, reset_breaker

from .base import ReadOnlyAdmin, actor, has_permission
from .display import cut, instant, instant_field, pretty_json, stacked

# The list shows this many of the latest transitions of each breaker; its page shows all it keeps.
LIST_TRANSITIONS = 2
BREAKER_FIELDS = (
    "key",
    "state",
    "effective",
    "open_until_utc",
    "cooldown",
    "failures",
    "probes",
    "probes_admitted",
    "held",
    "transition_lines",
    "policy_json",
    "changed_at_utc",
)


def _transition_lines(transitions: Any, count: int | None = None, *, cut_to_cell: bool = False) -> SafeString | str:
    """The latest transitions, newest first, one a line: "open → half_open at <UTC> (reason)"."""
    entries = transitions if isinstance(transitions, list) else []
    shown = [entry for entry in reversed(entries) if isinstance(entry, dict)][:count]
    lines = [
        f"{entry.get('from')} → {entry.get('to')} at {str(entry.get('at', ''))[:19].replace('T', ' ')} "
        f"({entry.get('reason')})"
        for entry in shown
    ]
    if cut_to_cell:
        return format_html_join(mark_safe("<br>"), "{}", ((cut(line, width="wide"),) for line in lines)) or "—"
    return format_html_join(mark_safe("<br>"), "{}", ((line,) for line in lines)) or "—"


class BreakerAdmin(ReadOnlyAdmin):
    """Circuit breakers: state, failures in the window, latest transitions, held jobs; reset."""

    list_display = ["breaker", "failures", "held", "last_transitions"]
    list_filter = ["state"]
    search_fields = ["key"]
    search_help_text = "A breaker's key (a job type or a destination)."
    ordering = ["key"]
    list_per_page = 50
    fields = readonly_fields = BREAKER_FIELDS
    actions = ["reset_selected"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """Each breaker with its held jobs counted (workhorse_job_breaker_held_idx), in one query."""
        held = (
            Job.objects.filter(status=JobStatus.QUEUED, held_since__isnull=False, breaker_key=OuterRef("key"))
            .order_by()
            .values("breaker_key")
            .annotate(jobs=Count("id"))
            .values("jobs")
        )
        return super().get_queryset(request).annotate(held_jobs=Coalesce(Subquery(held), 0))

    def has_reset_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "reset_breaker")

    @admin.display(description="breaker (now)", ordering="key")
    def breaker(self, obj: Breaker) -> SafeString:
        return stacked(cut(obj.key, width="wide"), self.doing(obj))

    @admin.display(description="what it does now")
    def doing(self, obj: Breaker) -> str:
        return effective_state(obj.state, obj.open_until, timezone.now())

    effective = doing

    @admin.display(description="failures")
    def failures(self, obj: Breaker) -> str:
        limit = obj.policy.get("failures") if isinstance(obj.policy, dict) else None
        found = failures_in_window(obj, timezone.now())
        return f"{found}/{limit}" if limit is not None else str(found)

    @admin.display(description="held")
    def held(self, obj: Any) -> int:
        return int(getattr(obj, "held_jobs", 0))

    @admin.display(description="latest transitions (UTC)")
    def last_transitions(self, obj: Breaker) -> SafeString | str:
        return _transition_lines(obj.transitions, LIST_TRANSITIONS, cut_to_cell=True)

    @admin.display(description="transitions, newest first (UTC)")
    def transition_lines(self, obj: Breaker) -> SafeString | str:
        return _transition_lines(obj.transitions)

    @admin.display(description="policy")
    def policy_json(self, obj: Breaker) -> str:
        return pretty_json(obj.policy)

    open_until_utc = instant_field("open_until", "open until")
    changed_at_utc = instant_field("changed_at", "changed at")

    @admin.action(description="Reset selected breakers (close them, give their held jobs back)", permissions=["reset"])
    def reset_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        keys = list(queryset.values_list("key", flat=True))
        released = sum(reset_breaker(key, requested_by=actor(request)).released for key in keys)
        self.message_user(
            request,
            f"Reset {len(keys)} breaker(s); {released} held job(s) are back in their queues.",
            messages.SUCCESS,
        )


def held_line(job: Job) -> str:
    """How a job's page says a breaker holds it: "held by breaker K since <instant> UTC"."""
    return f"held by breaker {job.breaker_key} since {instant(job.held_since)} UTC"


def rate_held_line(job: Job) -> str:
    """How a job's page says a rate limit holds it: "held by rate limit N [partition] since <instant> UTC
    until <instant> UTC" (until: its run_at, the slot its budget gave it)."""
    where = job.rate_limit if job.rate_partition is None else f"{job.rate_limit} [{job.rate_partition}]"
    return f"held by rate limit {where} since {instant(job.held_since)} UTC, until {instant(job.run_at)} UTC"
