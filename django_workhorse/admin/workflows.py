"""Workflows (decision 0022 §6): browse them with their derived state, see each one's graph drawn
as SVG on its page, cancel them and redrive their dead steps, each action with its permission.

A list's page derives the state of its workflows in one query (``WORKFLOW_STATE``). A workflow's
page draws its steps where ``workflows.layout`` puts them, each box coloured by its current job's
status and linking to that job; an edge a parent's death satisfies (``allow_failure``) is dashed.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from django_workhorse.exceptions import WorkhorseError
from django_workhorse.models import Job, JobStatus, Workflow
from django_workhorse.operations.actions import redrive
from django_workhorse.workflows.layout import layout
from django_workhorse.workflows.operations import (
    WorkflowState,
    cancel_workflow,
    workflow_graph,
    workflow_states,
)

from .base import ReadOnlyAdmin, YesNoFilter, actor, has_permission, parse_id
from .display import cut, instant_cell, instant_field, stacked

LIVE_STATUSES = (JobStatus.WAITING, JobStatus.QUEUED, JobStatus.RUNNING)
# A box shows this much of its step's name; the whole name is its hover text.
BOX_LABEL_CHARS = 26


class LiveFilter(YesNoFilter):
    """Workflows with a step waiting, queued or running."""

    title = "live"
    parameter_name = "live"
    two_choices = (("yes", "Live (a step waiting, queued or running)"), ("no", "Finished"))

    def condition(self) -> Any:
        return Exists(Job.objects.filter(workflow=OuterRef("pk"), status__in=LIVE_STATUSES))


def redrive_request_id(workflow_id: int, step: str, job_id: int) -> str:
    """The request id of the admin's redrive of a dead step: the same for a double submit, so the
    step is redriven once (the step's name goes in as a digest, so the id stays within its bound)."""
    digest = hashlib.sha256(step.encode()).hexdigest()[:16]
    return f"admin:workflow:{workflow_id}:step:{digest}:job:{job_id}"


def dead_steps(workflow_ids: list[int]) -> QuerySet[Job]:
    """The current jobs (the latest of each step's lineage) of these workflows that are dead."""
    later = Job.objects.filter(workflow=OuterRef("workflow"), step_name=OuterRef("step_name"), pk__gt=OuterRef("pk"))
    return Job.objects.filter(workflow__in=workflow_ids, status=JobStatus.DEAD).exclude(Exists(later)).order_by("id")


class WorkflowAdmin(ReadOnlyAdmin):
    """Workflows: browse, filter by live, see the graph; cancel and redrive dead steps with their permissions."""

    list_display = ["id", "workflow", "key", "step_count", "created", "state"]
    list_display_links = ["id", "workflow"]
    list_filter = [LiveFilter]
    search_fields = ["name"]
    search_help_text = "A workflow id or name."
    ordering = ["-id"]
    list_per_page = 50
    show_full_result_count = False
    fields = readonly_fields = ("name", "state_line", "key_line", "graph_digest", "step_count", "created_at_utc")
    change_form_template = "admin/workhorse/workflow_detail.html"
    actions = ["cancel_workflows", "redrive_dead_steps"]

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)
        states = workflow_states([row.pk for row in rows]) if rows else {}
        for row in rows:
            row.workflow_state = states.get(row.pk)
        return changelist

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "cancel_job")

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "redrive_job")

    def search_matches(self, term: str) -> Q:
        """A name containing ``term``, or the workflow ``term`` spells the id of."""
        matches = Q(name__icontains=term)
        if (workflow_id := parse_id(term)) is not None:
            matches |= Q(pk=workflow_id)
        return matches

    @admin.display(description="workflow", ordering="name")
    def workflow(self, obj: Workflow) -> SafeString:
        return cut(obj.name, width="wide")

    @admin.display(description="key [digest]")
    def key(self, obj: Workflow) -> SafeString | str:
        if obj.key_preview is None:
            return "—"
        return stacked(cut(obj.key_preview), f"[{obj.key_digest}]")

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Workflow) -> SafeString | str:
        return instant_cell(obj.created_at)

    @admin.display(description="state")
    def state(self, obj: Any) -> SafeString | str:
        found: WorkflowState | None = getattr(obj, "workflow_state", None)
        return "—" if found is None else _state_words(found)

    # -- a workflow's page --------------------------------------------------------------------

    @admin.display(description="state")
    def state_line(self, obj: Workflow) -> SafeString | str:
        found = workflow_states([obj.pk]).get(obj.pk)
        return "—" if found is None else _state_words(found)

    @admin.display(description="key")
    def key_line(self, obj: Workflow) -> str:
        return "none" if obj.key_preview is None else f"{obj.scope}: {obj.key_preview} [{obj.key_digest}]"

    @admin.display(description="graph digest")
    def graph_digest(self, obj: Workflow) -> str:
        return bytes(obj.fingerprint).hex()[:12]

    created_at_utc = instant_field("created_at", "created at")

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        flow = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if flow is not None:
            context.update(graph_context(flow.pk))
            context.update(
                can_cancel=self.has_cancel_permission(request),
                can_redrive=self.has_redrive_permission(request),
                changelist_url=reverse("admin:workhorse_workflow_changelist"),
            )
        return super().change_view(request, object_id, form_url, context)

    # -- actions ------------------------------------------------------------------------------

    @admin.action(description="Cancel selected workflows", permissions=["cancel"])
    def cancel_workflows(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        changed = [cancel_workflow(pk, requested_by=actor(request)) for pk in queryset.values_list("pk", flat=True)]
        self.message_user(
            request,
            f"Cancelled or asked to stop {sum(changed)} step(s) of {sum(1 for n in changed if n)} workflow(s); "
            f"{sum(1 for n in changed if not n)} had nothing left to cancel.",
            messages.SUCCESS,
        )

    @admin.action(description="Redrive dead steps of selected workflows", permissions=["redrive"])
    def redrive_dead_steps(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        created = []
        for job in dead_steps(list(queryset.values_list("pk", flat=True))):
            assert job.workflow_id is not None and job.step_name is not None  # a workflow's step
            request_id = redrive_request_id(job.workflow_id, job.step_name, job.pk)
            try:
                created.append((job.pk, redrive(job.pk, request_id=request_id, requested_by=actor(request))))
            except WorkhorseError as exc:
                self.message_user(request, f"Job {job.pk}: {exc}", messages.ERROR)
        summary = ", ".join(f"{old} → {new}" for old, new in created)
        self.message_user(request, f"Redrove {len(created)} dead step(s): {summary or 'none'}.", messages.SUCCESS)


def graph_context(workflow_id: int) -> dict[str, Any]:
    """What the template draws: the layout's size and arrows, and each box with its step's job and status."""
    graph = workflow_graph(workflow_id)
    drawn = layout([step.name for step in graph.steps], graph.edges)
    steps = {step.name: step for step in graph.steps}
    boxes = [
        {
            "box": box,
            "step": steps[box.step],
            "label": Truncator(box.step).chars(BOX_LABEL_CHARS),
            "url": reverse("admin:workhorse_job_change", args=[steps[box.step].job_id]),
        }
        for box in drawn.boxes
    ]
    return {
        "graph": drawn,
        "boxes": boxes,
        "live_steps": sum(1 for step in graph.steps if step.status in LIVE_STATUSES),
        "dead_steps": sum(1 for step in graph.steps if step.status == JobStatus.DEAD),
    }


def _state_words(found: WorkflowState) -> SafeString:
    steps = found.steps
    done = steps.succeeded + steps.dead + steps.cancelled
    total = done + steps.waiting + steps.queued + steps.running
    return format_html(
        '<span class="workhorse-flow-{}">{}</span> ({}/{} done)', found.status, found.status, done, total
    )
