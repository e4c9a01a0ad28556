"""Admin of the demo shop: every model of every scenario, linked to its job where it has one."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from example_project.shop.models import Digest, Invoice, Order, Product, ProviderCharge, WebhookDelivery


def job_link(job_id: int | None) -> str:
    """A link to the job's admin page, or a dash."""
    if job_id is None:
        return "–"
    return format_html('<a href="{}">#{}</a>', reverse("admin:workhorse_job_change", args=[job_id]), job_id)


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["id", "product", "quantity", "created_at", "confirmation_job"]
    readonly_fields = ["placement_token", "created_at", "confirmation_job"]

    @admin.display(description="confirmation job")
    def confirmation_job(self, obj: Order) -> str:
        return job_link(obj.confirmation_job_id)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ["delivery_id", "event_type", "received_count", "received_at", "processed_at", "job"]
    readonly_fields = ["received_at", "job"]
    search_fields = ["delivery_id"]

    @admin.display(description="job")
    def job(self, obj: WebhookDelivery) -> str:
        return job_link(obj.job_id)


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ["id", "amount", "status", "charge_id", "paid_at", "capture_job"]
    list_filter = ["status"]
    readonly_fields = ["created_at", "capture_job"]

    @admin.display(description="capture job")
    def capture_job(self, obj: Invoice) -> str:
        return job_link(obj.capture_job_id)


@admin.register(ProviderCharge)
class ProviderChargeAdmin(admin.ModelAdmin):
    """The fake provider's side: what it charged. Read only, as another company's records would be."""

    list_display = ["charge_id", "amount_cents", "reference", "request_count", "idempotency_key", "created_at"]
    search_fields = ["reference", "idempotency_key"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ["name", "updated_at", "indexed_at", "index_job"]
    readonly_fields = ["indexed_description", "indexed_at", "index_job"]

    @admin.display(description="search index job")
    def index_job(self, obj: Product) -> str:
        return job_link(obj.index_job_id)


@admin.register(Digest)
class DigestAdmin(admin.ModelAdmin):
    list_display = ["recipient", "sent_at", "job"]

    @admin.display(description="job")
    def job(self, obj: Digest) -> str:
        return job_link(obj.job_id)
