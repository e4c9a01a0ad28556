"""The dashboard in the admin index and side bar: a proxy of jobs whose list is the dashboard."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from .base import ReadOnlyAdmin, has_permission


class DashboardEntryAdmin(ReadOnlyAdmin):
    """Listed beside the other pages for whoever may view jobs; its list is the dashboard."""

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:workhorse_dashboard"))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return has_permission(request, "view_job")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_permission(request, "view_job")
