"""The shop's JSON API: a retried request with the same ``Idempotency-Key`` gets the first answer.

``POST /api/orders/`` places an order; ``POST /api/invoices/<id>/capture/`` starts the capture of
an invoice. Both are ``@idempotent``: the record of the client's key is written in the view's
transaction, with the order and the job. ``example_project/api_client.py`` is a client that loses
a response (a simulated timeout) and retries with the same key.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_workhorse import EnqueueIdempotencyConflictError, Idempotency, enqueue_with_result
from django_workhorse.http import idempotent
from example_project.shop.forms import PRODUCTS
from example_project.shop.models import Invoice, Order

MAX_QUANTITY = 10
# A retry that arrives while its first request still runs waits this long for its answer (then 409).
IN_FLIGHT_WAIT = timedelta(seconds=5)


def _order_request(request: HttpRequest) -> tuple[dict[str, Any] | None, JsonResponse | None]:
    """The order the body asks for, or the 400 that says why not (stored too: same body, same 400)."""
    try:
        data = json.loads(request.body)
    except ValueError:
        return None, JsonResponse({"error": "the body must be JSON"}, status=400)
    product, quantity = (data.get("product"), data.get("quantity", 1)) if isinstance(data, dict) else (None, None)
    if product not in PRODUCTS:
        return None, JsonResponse({"error": f"product must be one of {', '.join(PRODUCTS)}"}, status=400)
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 1 <= quantity <= MAX_QUANTITY:
        return None, JsonResponse({"error": f"quantity must be an integer in 1..{MAX_QUANTITY}"}, status=400)
    return {"product": product, "quantity": quantity}, None


@csrf_exempt  # an API for clients that send no CSRF token; the key is what makes a retry safe
@require_POST
@idempotent("shop-api-orders", anonymous=True, wait=IN_FLIGHT_WAIT)
def api_orders(request: HttpRequest) -> JsonResponse:
    """Place an order and enqueue its confirmation, once per client request.

    The order's placement token and the job's key both come from the client's key, so even a run of
    the view after its record expired finds the same order and the same job.
    """
    wanted, refused = _order_request(request)
    if refused is not None:
        return refused
    assert wanted is not None
    token = uuid.UUID(hashlib.sha256(request.idempotency.job_key("order").encode()).hexdigest()[:32])
    order, _ = Order.objects.get_or_create(placement_token=token, defaults=wanted)
    result = enqueue_with_result(
        "shop.send_confirmation",
        {"order_id": order.pk},
        idempotency=request.idempotency.job_idempotency("confirmation"),
    )
    Order.objects.filter(pk=order.pk).update(confirmation_job_id=result.job_id)
    response = JsonResponse(
        {"order": order.pk, "product": order.product, "quantity": order.quantity, "confirmation_job": result.job_id},
        status=201,
    )
    response["Location"] = reverse("order-detail", args=[order.pk])
    return response


@csrf_exempt
@require_POST
@idempotent("shop-api-captures", anonymous=True, wait=IN_FLIGHT_WAIT)
def api_capture_invoice(request: HttpRequest, invoice_id: int) -> JsonResponse:
    """Start the capture of an invoice: 202 with its job. The capture itself is once per invoice
    whatever the client sends (the job's key is the invoice's); the client's key makes the answer
    the same on a retry."""
    invoice = get_object_or_404(Invoice, pk=invoice_id)
    try:
        result = enqueue_with_result(
            "shop.capture_invoice",
            {"invoice_id": invoice.pk, "simulate": ""},
            max_attempts=5,
            idempotency=Idempotency(key=f"capture:{invoice.pk}", scope="invoice-capture"),
        )
    except EnqueueIdempotencyConflictError as exc:
        # Started from the invoice page with a simulated failure: another request for the same key.
        # A 409 is not stored, so the client can retry once that capture is done with.
        return JsonResponse(
            {"error": "this invoice's capture was started with other options", "job": exc.job_id}, status=409
        )
    Invoice.objects.filter(pk=invoice.pk).update(capture_job_id=result.job_id)
    response = JsonResponse(
        {"invoice": invoice.pk, "capture_job": result.job_id, "outcome": result.outcome.value}, status=202
    )
    response["Location"] = reverse("invoice-detail", args=[invoice.pk])
    return response
