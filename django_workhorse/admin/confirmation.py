"""The preview page of a changing action and the request id that makes submitting it run once."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from django.contrib import admin
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse


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
    noun: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    explanation: str,
    skipped: int = 0,
) -> HttpResponse:
    """Show the preview of an action: what it applies to, one ``noun`` a row, and what it left out.

    Submitting the page runs the action again with ``confirmed`` and a fresh request id; the table's
    cells are escaped unless they are safe HTML (links).
    """
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.model._meta,
        "action": action,
        "verb": verb,
        "noun": noun,
        "columns": columns,
        "rows": rows,
        "skipped": skipped,
        "explanation": explanation,
        "request_id": uuid.uuid4().hex,
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across", "0"),
    }
    return TemplateResponse(request, "admin/workhorse/confirm_action.html", context)
