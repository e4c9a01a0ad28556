"""Models of the demo shop."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """An order, placed at most once per rendered order form (``placement_token``)."""

    product = models.CharField(max_length=100)
    quantity = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    placement_token = models.UUIDField(unique=True, editable=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"Order #{self.pk}: {self.quantity} × {self.product}"
