"""Admin of the demo shop."""

from __future__ import annotations

from django.contrib import admin

from example_project.shop.models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    """Orders, newest first."""

    list_display = ["id", "product", "quantity", "created_at"]
    readonly_fields = ["placement_token", "created_at"]
