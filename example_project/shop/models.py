"""Models of the demo shop, one or two per scenario (see docs/example.md)."""

from __future__ import annotations

from django.db import models

UNIT_PRICE_CENTS = 1200


class Order(models.Model):
    """An order, placed at most once per rendered order form (``placement_token``)."""

    product = models.CharField(max_length=100)
    quantity = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    placement_token = models.UUIDField(unique=True, editable=False)
    confirmation_job_id = models.BigIntegerField(null=True, blank=True, editable=False)
    # Fulfilment, a workflow of four steps: charge, then pack and mail the receipt, then close.
    fulfilment_workflow_id = models.BigIntegerField(null=True, blank=True, editable=False)
    charge_id = models.CharField(max_length=40, blank=True, help_text="The provider's charge for this order.")
    packed_at = models.DateTimeField(null=True, blank=True)
    receipt_sent_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"Order #{self.pk}: {self.quantity} × {self.product}"

    @property
    def amount_cents(self) -> int:
        """What fulfilment charges: every product of the demo costs 12.00."""
        return self.quantity * UNIT_PRICE_CENTS


class WebhookDelivery(models.Model):
    """A webhook delivery from the payment provider, stored once however often it is redelivered."""

    delivery_id = models.CharField(max_length=100, unique=True)
    event_type = models.CharField(max_length=100, blank=True)
    body = models.JSONField()
    received_count = models.PositiveIntegerField(default=1, help_text="How many times it was delivered.")
    job_id = models.BigIntegerField(null=True, blank=True, editable=False, help_text="The job that handles it.")
    received_at = models.DateTimeField(auto_now_add=True)
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-received_at"]
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"Delivery {self.delivery_id}"


class Invoice(models.Model):
    """An invoice captured by a job that charges the (fake) payment provider."""

    class Status(models.TextChoices):
        OPEN = "open"
        PAID = "paid"

    amount_cents = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    charge_id = models.CharField(max_length=40, blank=True, help_text="The provider's charge that paid it.")
    paid_at = models.DateTimeField(null=True, blank=True)
    capture_job_id = models.BigIntegerField(null=True, blank=True, editable=False)
    holding_pid = models.PositiveIntegerField(
        null=True, blank=True, editable=False, help_text="Demo: the worker process pausing after the charge."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"Invoice #{self.pk}"

    @property
    def amount(self) -> str:
        return f"{self.amount_cents // 100}.{self.amount_cents % 100:02d}"

    @property
    def provider_reference(self) -> str:
        """What the provider stores with the charge to name this invoice (like a charge's metadata)."""
        return f"invoice-{self.pk}"


class ProviderCharge(models.Model):
    """A charge *at the payment provider*: this table stands for the provider's own database.

    Written only by :class:`example_project.shop.payments.FakePaymentProvider`, on a connection
    of its own, never in the shop's transactions.
    """

    charge_id = models.CharField(max_length=40, unique=True)
    idempotency_key = models.CharField(max_length=255, unique=True)
    amount_cents = models.PositiveIntegerField()
    reference = models.CharField(max_length=100, blank=True)
    request_count = models.PositiveIntegerField(default=1, help_text="Requests received with this key.")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.charge_id


class Product(models.Model):
    """A catalog entry; the search index copy (``indexed_*``) is refreshed by a debounced job."""

    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    indexed_description = models.TextField(blank=True, help_text="What the search index has.")
    indexed_at = models.DateTimeField(null=True, blank=True)
    index_job_id = models.BigIntegerField(null=True, blank=True, editable=False, help_text="The last search index job.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Digest(models.Model):
    """A digest email "sent" by the throttled digest job: one row per job."""

    recipient = models.CharField(max_length=50)
    job_id = models.BigIntegerField(unique=True, editable=False)
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-sent_at"]

    def __str__(self) -> str:
        return f"Digest to {self.recipient}"
