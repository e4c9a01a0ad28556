"""Periodic schedules: their next ticks, last tick and job, state; pause, resume and run now.

Schedules are declared in code; the list shows what the evaluations stored, with the next ticks
this process's code computes (``schedule_overview``). Pause and resume need
``workhorse.pause_schedule``, run now ``workhorse.run_schedule_now``; each records the acting user
in the schedule's events.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_workhorse.exceptions import WorkhorseError
from django_workhorse.models import ScheduleEvent, ScheduleState
from django_workhorse.schedules import overview as schedule_overview
from django_workhorse.schedules.actions import pause_schedules, resume_schedules, run_schedule_now

from .base import ReadOnlyAdmin, actor, has_permission
from .confirmation import Preview, confirm, confirmed_request_id
from .display import INSTANT_FORMAT, cut, instant, instant_field, job_anchor, pretty_json, stacked

# The list shows this many next ticks of each schedule; its page shows ``NEXT_TICKS``.
LIST_TICKS = 3
# The detail page shows the newest events, up to this many.
DETAIL_EVENTS = 200

RUN_NOW = Preview(
    action="run_selected_now",
    title="Run schedules now",
    verb="Run",
    explanation="Each schedule enqueues one job now, as a tick does; paused schedules stay paused. "
    "Submitting this page twice runs each schedule once.",
    noun="schedule",
    columns=("schedule", "task", "expression", "zone", "state", "last job"),
)
SCHEDULE_FIELDS = (
    "name",
    "task",
    "expression",
    "zone",
    "next_ticks_utc",
    "active",
    "paused",
    "evaluated_until_utc",
    "last_tick_utc",
    "last_job",
    "last_skip_utc",
    "last_skip_reason",
    "digest",
    "created",
    "updated",
)


def _utc(value: Any) -> str:
    return "—" if value is None else f"{instant(value)} UTC"


def _tick_lines(state: ScheduleState, count: int | None = None) -> SafeString | str:
    """The next ticks, one a line: in the list, local time (the zone is in its own column) with the
    zone's abbreviation and UTC on hover; on the page, both."""
    if not state.active or state.paused:
        return f"— ({schedule_overview.state_label(state)})"
    declared = schedule_overview.declared_by_name().get(state.name)
    if declared is None:
        return "— (not declared in this code)"
    zone = declared.schedule.timezone
    ticks = schedule_overview.next_ticks(state, declared, timezone.now(), count or schedule_overview.NEXT_TICKS)
    local = [(schedule_overview.local_time(tick, zone), _utc(tick)) for tick in ticks]
    if count is None:
        lines = ((f"{at:{INSTANT_FORMAT} %Z}", utc) for at, utc in local)
        return format_html_join(mark_safe("<br>"), "{} ({})", lines) or "—"
    template = '<span class="workhorse-tick" title="{1} = {2}">{0}</span>'
    cells = ((f"{at:{INSTANT_FORMAT}}", f"{at:{INSTANT_FORMAT} %Z}", utc) for at, utc in local)
    return format_html_join(mark_safe("<br>"), template, cells) or "—"


def _last_job(state: Any) -> SafeString | str:
    if state.last_job_id is None:
        return "—"
    if state.last_job_status is None:
        return f"#{state.last_job_id} (pruned)"
    return format_html("{} ({})", job_anchor(state.last_job_id), state.last_job_status)


class ScheduleAdmin(ReadOnlyAdmin):
    """Schedules: next ticks, last tick and job, paused/active; pause, resume and run now."""

    list_display = ["schedule", "timing", "next_ticks", "last_job", "last_skip"]
    list_filter = ["paused", "active"]
    search_fields = ["name", "task"]
    search_help_text = "A schedule's name or task."
    ordering = ["name"]
    list_per_page = 50
    fields = SCHEDULE_FIELDS
    readonly_fields = SCHEDULE_FIELDS
    change_form_template = "admin/workhorse/schedule_detail.html"
    actions = ["pause_selected", "resume_selected", "run_selected_now"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """Each schedule with its last job's status, in the list's one query."""
        return schedule_overview.with_last_job_status(super().get_queryset(request))

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "pause_schedule")

    def has_run_now_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "run_schedule_now")

    @admin.display(description="expression")
    def expression(self, obj: ScheduleState) -> str:
        declared = schedule_overview.declared_by_name().get(obj.name)
        return schedule_overview.expression(obj, declared)[0] or "—"

    @admin.display(description="zone")
    def zone(self, obj: ScheduleState) -> str:
        declared = schedule_overview.declared_by_name().get(obj.name)
        return schedule_overview.expression(obj, declared)[1] or "—"

    @admin.display(description="schedule (task)", ordering="name")
    def schedule(self, obj: ScheduleState) -> SafeString:
        return stacked(cut(obj.name, width="wide"), cut(obj.task, width="wide"))

    @admin.display(description="timing (zone)")
    def timing(self, obj: ScheduleState) -> SafeString:
        return stacked(cut(self.expression(obj), width="narrow"), cut(self.zone(obj), width="narrow"))

    @admin.display(description=f"next {LIST_TICKS} ticks (local)")
    def next_ticks(self, obj: ScheduleState) -> SafeString | str:
        return _tick_lines(obj, LIST_TICKS)

    @admin.display(description="next ticks (local, UTC)")
    def next_ticks_utc(self, obj: ScheduleState) -> SafeString | str:
        return _tick_lines(obj)

    @admin.display(description="state")
    def state(self, obj: ScheduleState) -> str:
        return schedule_overview.state_label(obj)

    evaluated_until_utc = instant_field("evaluated_until", "evaluated until")
    last_tick_utc = instant_field("last_tick_at", "last tick")
    last_skip_utc = instant_field("last_skip_at", "last skip at")
    created = instant_field("created_at", "created at")
    updated = instant_field("updated_at", "updated at")

    @admin.display(description="last job")
    def last_job(self, obj: ScheduleState) -> SafeString | str:
        return _last_job(obj)

    @admin.display(description="last skip")
    def last_skip(self, obj: ScheduleState) -> SafeString | str:
        if obj.last_skip_at is None:
            return "—"
        return stacked(cut(obj.last_skip_reason, width="wide"), _utc(obj.last_skip_at))

    # -- actions ------------------------------------------------------------------------------

    @admin.action(description="Pause selected schedules", permissions=["pause"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        names = list(queryset.values_list("name", flat=True))
        paused = pause_schedules(names, requested_by=actor(request))
        self.message_user(
            request,
            f"Paused {len(paused)} schedule(s); {len(names) - len(paused)} were paused already.",
            messages.SUCCESS,
        )

    @admin.action(description="Resume selected schedules", permissions=["pause"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        names = list(queryset.values_list("name", flat=True))
        resumed = resume_schedules(names, requested_by=actor(request))
        self.message_user(
            request,
            f"Resumed {len(resumed)} schedule(s); {len(names) - len(resumed)} were not paused. "
            "Ticks of the paused time are not caught up.",
            messages.SUCCESS,
        )

    @admin.action(description="Run selected schedules now…", permissions=["run_now"])
    def run_selected_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        declared = schedule_overview.declared_by_name()
        selected = list(queryset.order_by("name"))
        runnable = [state for state in selected if state.active and state.name in declared]
        request_id = confirmed_request_id(request)
        if request_id is None:
            rows = [self._run_now_row(state) for state in runnable]
            return confirm(self, request, RUN_NOW, rows=rows, skipped=len(selected) - len(runnable))
        ran = []
        for state in runnable:
            try:
                result = run_schedule_now(state.name, request_id=f"admin:{request_id}", requested_by=actor(request))
            except WorkhorseError as exc:
                self.message_user(request, f"Schedule {state.name}: {exc}", messages.ERROR)
                continue
            ran.append(format_html("{} → {}", state.name, job_anchor(result.job_id)))
        summary = format_html_join(", ", "{}", ((line,) for line in ran)) or "none"
        self.message_user(request, format_html("Ran {} schedule(s) now: {}.", len(ran), summary), messages.SUCCESS)
        return None

    def _run_now_row(self, state: Any) -> tuple[object, ...]:
        return (
            state.name,
            state.task,
            self.expression(state),
            self.zone(state),
            schedule_overview.state_label(state),
            _last_job(state),
        )

    # -- detail page --------------------------------------------------------------------------

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        state = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if state is not None:
            context.update(
                definition_json=pretty_json(state.definition),
                events=list(ScheduleEvent.objects.filter(schedule=state).order_by("-id")[:DETAIL_EVENTS]),
            )
        return super().change_view(request, object_id, form_url, context)
