from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("http/", include("tests.http_urls")),
    path("metrics/", include("django_workhorse.observability.metrics.urls")),
]
