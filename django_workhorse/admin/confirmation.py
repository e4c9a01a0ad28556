"""The preview page of a changing action and the request id that makes submitting it run once."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.contrib import admin
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from django_workhorse.models import Job

from .display import error_head, error_summary, job_anchor


def confirmed_request_id(request: HttpRequest) -> str | None:
    """The request id of a submitted confirmation page, or None before confirmation."""
    if request.POST.get("confirmed") != "yes":
        return None
    try:
        return uuid.UUID(request.POST.get("request_id", "")).hex
    except ValueError:
        raise PermissionDenied("the confirmation carries no valid request id") from None


# What a preview shows of each job an action applies to (``job_rows``).
JOB_COLUMNS = ("job", "type", "queue", "status", "attempts", "last error")


@dataclass(frozen=True)
class Preview:
    """The words of an action's preview page: what the action is called, does, and applies to."""

    action: str
    title: str
    verb: str
    explanation: str
    noun: str = "job"
    columns: Sequence[str] = JOB_COLUMNS


def job_rows(jobs: Sequence[Job]) -> list[tuple[object, ...]]:
    """The jobs an action applies to, as rows of its preview (``JOB_COLUMNS``)."""
    return [
        (
            job_anchor(job.pk),
            job.job_type,
            job.queue,
            job.status,
            f"{job.attempt}/{job.max_attempts}",
            error_summary(error_head(job)),
        )
        for job in jobs
    ]


def confirm(
    model_admin: admin.ModelAdmin,  # type: ignore[type-arg]
    request: HttpRequest,
    preview: Preview,
    *,
    rows: Sequence[Sequence[object]],
    skipped: int = 0,
) -> HttpResponse:
    """Show the preview of an action: the rows it applies to, one ``preview.noun`` each, and how many
    selected ones it leaves out.

    Submitting the page runs the action again with ``confirmed`` and a fresh request id; the table's
    cells are escaped unless they are safe HTML (links).
    """
    context = {
        **model_admin.admin_site.each_context(request),
        "title": preview.title,
        "opts": model_admin.model._meta,
        "action": preview.action,
        "verb": preview.verb,
        "noun": preview.noun,
        "columns": preview.columns,
        "rows": rows,
        "skipped": skipped,
        "explanation": preview.explanation,
        "request_id": uuid.uuid4().hex,
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across", "0"),
    }
    return TemplateResponse(request, "admin/workhorse/confirm_action.html", context)
