"""Views of the demo shop: place an order once, however often the form is sent."""

from __future__ import annotations

import uuid
from urllib.parse import urlencode

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from django_workhorse import Idempotency, enqueue_with_result
from example_project.shop.forms import OrderForm
from example_project.shop.models import Order

OUTCOMES = {"accepted", "replayed"}


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """Show the order form with a fresh placement token."""
    return _home(request, OrderForm(initial={"token": uuid.uuid4()}))


@require_POST
def place_order(request: HttpRequest) -> HttpResponse:
    """Create the order and enqueue its confirmation, both at most once per token."""
    form = OrderForm(request.POST)
    if not form.is_valid():
        return _home(request, form, status=400)
    token = form.cleaned_data["token"]
    with transaction.atomic():
        order, _ = Order.objects.get_or_create(
            placement_token=token,
            defaults={
                "product": form.cleaned_data["product"],
                "quantity": form.cleaned_data["quantity"],
            },
        )
        result = enqueue_with_result(
            "shop.send_confirmation",
            {"order_id": order.id},
            idempotency=Idempotency(key=f"place-order:{token}", scope="shop-orders"),
        )
    query = urlencode({"job": result.job_id, "outcome": result.outcome.value})
    return redirect(f"{reverse('order-detail', args=[order.id])}?{query}")


@require_GET
def order_detail(request: HttpRequest, order_id: int) -> HttpResponse:
    """Show an order and what the last enqueue for it did."""
    order = get_object_or_404(Order, pk=order_id)
    outcome = request.GET.get("outcome")
    job_id = request.GET.get("job", "")
    context = {
        "order": order,
        "job_id": job_id if job_id.isdigit() else None,
        "outcome": outcome if outcome in OUTCOMES else None,
    }
    return render(request, "shop/order_detail.html", context)


def _home(request: HttpRequest, form: OrderForm, status: int = 200) -> HttpResponse:
    context = {"form": form, "recent_orders": Order.objects.all()[:5]}
    return render(request, "shop/home.html", context, status=status)
