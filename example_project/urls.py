"""URLs of the demo project: the shop and the admin."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", include("example_project.shop.urls")),
    path("admin/", admin.site.urls),
]
