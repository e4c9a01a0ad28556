"""The preview page of a changing action and the request id that makes submitting it run once."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from django.contrib import admin
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from django_workhorse.models import Job

from .display import error_head, error_summary


def confirmed_request_id(request: HttpRequest) -> str | None:
    """The request id of a submitted confirmation page, or None before confirmation."""
    if request.POST.get("confirmed") != "yes":
        return None
    try:
        return uuid.UUID(request.POST.get("request_id", "")).hex
    except ValueError:
        raise PermissionDenied("the confirmation carries no valid request id") from None


def confirm(
    model_admin: admin.ModelAdmin,  # type: ignore[type-arg]
    request: HttpRequest,
    *,
    action: str,
    title: str,
    verb: str,
    jobs: Sequence[Job],
    skipped: int,
    explanation: str,
) -> HttpResponse:
    """Show the preview of an action; submitting it runs the action with a fresh request id."""
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.model._meta,
        "action": action,
        "verb": verb,
        "jobs": [(job, error_summary(error_head(job))) for job in jobs],
        "skipped": skipped,
        "explanation": explanation,
        "request_id": uuid.uuid4().hex,
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across", "0"),
    }
    return TemplateResponse(request, "admin/workhorse/confirm_action.html", context)
