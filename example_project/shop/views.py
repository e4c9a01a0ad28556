"""Views of the demo shop: one page per scenario of docs/example.md.

Every view that enqueues shows what PostgreSQL decided (the ``EnqueueOutcome``) and links to the
job in the admin. Views enqueue inside the transaction that writes their rows, so a job exists
exactly when the change that asked for it was committed.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import RequestDataTooBig
from django.db import transaction
from django.db.models import F
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from django_workhorse import (
    Debounce,
    EnqueueIdempotencyConflictError,
    EnqueueOutcome,
    EnqueueResult,
    Idempotency,
    NonReplaceableReason,
    Throttle,
    Unique,
    enqueue_with_result,
)
from django_workhorse.enqueueing.storable import check_json
from django_workhorse.models import Job
from django_workhorse.workflows.operations import workflow_state
from example_project.shop.forms import (
    DELIVERY_ID_PATTERN,
    CaptureForm,
    DigestForm,
    InvoiceForm,
    OrderForm,
    ProductForm,
    RefundForm,
    WebhookDemoForm,
)
from example_project.shop.fulfilment import fulfilment
from example_project.shop.models import Digest, Invoice, Order, Product, ProviderCharge, WebhookDelivery

SEARCH_INDEX_WINDOW = timedelta(seconds=5)
DIGEST_WINDOW = timedelta(minutes=1)
WEBHOOK_KEY_TTL = timedelta(days=3)  # longer than the provider's redelivery horizon
DELIVERY_ID = re.compile(DELIVERY_ID_PATTERN)  # always fullmatch()
MAX_WEBHOOK_BODY_BYTES = 64 * 1024
FULFILMENT_STEPS = ("charge", "pack", "mail", "close")  # in the order the page lists them
# The outcomes an idempotent enqueue can have, as carried in a redirect's ?outcome=.
IDEMPOTENT_OUTCOMES = {EnqueueOutcome.ACCEPTED.value, EnqueueOutcome.REPLAYED.value}

EXPLANATIONS = {
    EnqueueOutcome.ACCEPTED: "a new job was created.",
    EnqueueOutcome.REPLAYED: "the key already owns a job for this same request: nothing was written, this is that job.",
    EnqueueOutcome.REPLACED: "the waiting job took this request's definition in place (same id) and its "
    "run time moved.",
    EnqueueOutcome.NON_REPLACEABLE: "the job that owns the key can no longer be changed; it was left as it was.",
    EnqueueOutcome.COALESCED: "the request joined the job that owns the key: nothing was written.",
}
REASONS = {
    NonReplaceableReason.NOT_PENDING: "it has started or finished, so it may have read the old data",
    NonReplaceableReason.WINDOW_ELAPSED_PENDING: "its window is over and it waits for a worker; it has not "
    "started, so it will read the current data",
    NonReplaceableReason.INCOMPATIBLE_KEY_MODE: "the key belongs to another keyed mode",
}


def describe(result: EnqueueResult, **extra: Any) -> dict[str, Any]:
    """What the templates show of an enqueue result (``shop/_outcome.html``)."""
    return {
        "outcome": result.outcome.value,
        "explanation": EXPLANATIONS[result.outcome],
        "reason": result.reason.value if result.reason else None,
        "reason_text": REASONS.get(result.reason) if result.reason else None,
        "job_id": result.job_id,
        **extra,
    }


def jobs_by_id(ids: Any) -> dict[int, Job]:
    """The jobs with these ids (``None`` ignored), by id."""
    return Job.objects.in_bulk([i for i in ids if i is not None])


# -- home ---------------------------------------------------------------------------------------


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """The list of scenarios."""
    return render(request, "shop/home.html")


# -- place an order: double-click safe ---------------------------------------------------------


@require_http_methods(["GET", "POST"])
def orders(request: HttpRequest) -> HttpResponse:
    """GET: the order form with a fresh placement token. POST: place the order once per token."""
    if request.method == "GET":
        return _orders_page(request, OrderForm(initial={"token": uuid.uuid4()}))
    form = OrderForm(request.POST)
    if not form.is_valid():
        return _orders_page(request, form, status=400)
    token = form.cleaned_data["token"]
    with transaction.atomic():
        order, _ = Order.objects.get_or_create(
            placement_token=token,
            defaults={"product": form.cleaned_data["product"], "quantity": form.cleaned_data["quantity"]},
        )
        result = enqueue_with_result(
            "shop.send_confirmation",
            {"order_id": order.pk},
            idempotency=Idempotency(key=f"place-order:{token}", scope="shop-orders"),
        )
        Order.objects.filter(pk=order.pk).update(confirmation_job_id=result.job_id)
    if request.GET.get("twice") == "1":
        return _send_again(result)
    query = {"outcome": result.outcome.value}
    if (first := request.GET.get("first")) in IDEMPOTENT_OUTCOMES:
        query["first"] = first
    return redirect(f"{reverse('order-detail', args=[order.pk])}?{urlencode(query)}")


def _send_again(result: EnqueueResult) -> HttpResponse:
    """The "Send it twice" button: have the browser send this same POST again.

    A 307 makes the browser repeat the request, method and body (the same placement token and
    CSRF token), to the URL it names, and only once this request has committed: the repeat is
    certainly a replay. Its redirect carries this first request's outcome along.
    """
    again = f"{reverse('orders')}?{urlencode({'first': result.outcome.value})}"
    return HttpResponse(status=307, headers={"Location": again})


def _orders_page(request: HttpRequest, form: OrderForm, status: int = 200) -> HttpResponse:
    context = {"form": form, "recent_orders": Order.objects.all()[:5]}
    return render(request, "shop/orders.html", context, status=status)


@require_GET
def order_detail(request: HttpRequest, order_id: int) -> HttpResponse:
    """An order, its confirmation job, its fulfilment, and what the request that led here did."""
    order = get_object_or_404(Order, pk=order_id)
    outcome = request.GET.get("outcome")
    first = request.GET.get("first")
    result = first_result = None
    if order.confirmation_job_id and outcome in IDEMPOTENT_OUTCOMES:
        result = describe(EnqueueResult(order.confirmation_job_id, EnqueueOutcome(outcome)))
        if first in IDEMPOTENT_OUTCOMES:
            first_result = describe(EnqueueResult(order.confirmation_job_id, EnqueueOutcome(first)))
    job = jobs_by_id([order.confirmation_job_id]).get(order.confirmation_job_id or 0)
    context = {
        "order": order,
        "result": result,
        "first_result": first_result,
        "job": job,
        "fulfilment": _fulfilment(order, request.GET.get("fulfilment")),
    }
    return render(request, "shop/order_detail.html", context)


def _fulfilment(order: Order, outcome: str | None) -> dict[str, Any] | None:
    """What the order page shows of its fulfilment workflow: its state and each step's job."""
    if order.fulfilment_workflow_id is None:
        return None
    workflow_id = order.fulfilment_workflow_id
    # A step's current job is the newest of its lineage (a redrive's copy, if any).
    steps = {job.step_name: job for job in Job.objects.filter(workflow_id=workflow_id).order_by("id")}
    return {
        "workflow_id": workflow_id,
        "state": workflow_state(workflow_id).status.value,
        "steps": [steps[name] for name in FULFILMENT_STEPS if name in steps],
        "outcome": outcome if outcome in IDEMPOTENT_OUTCOMES else None,
    }


@require_POST
def fulfil_order(request: HttpRequest, order_id: int) -> HttpResponse:
    """Enqueue the order's fulfilment workflow, once per order however often this is posted."""
    order = get_object_or_404(Order, pk=order_id)
    with transaction.atomic():
        result = fulfilment(order.pk).enqueue()
        Order.objects.filter(pk=order.pk).update(fulfilment_workflow_id=result.workflow_id)
    query = urlencode({"fulfilment": result.outcome.value})
    return redirect(f"{reverse('order-detail', args=[order.pk])}?{query}")


# -- webhook receiver: one job per delivery id ----------------------------------------------------


def receive_webhook(delivery_id: str, body: dict[str, Any]) -> EnqueueResult:
    """Store a delivery and enqueue its handling, both once per delivery id."""
    with transaction.atomic():
        delivery, created = WebhookDelivery.objects.get_or_create(
            delivery_id=delivery_id, defaults={"event_type": str(body.get("type", ""))[:100], "body": body}
        )
        if not created:
            WebhookDelivery.objects.filter(pk=delivery.pk).update(received_count=F("received_count") + 1)
        result = enqueue_with_result(
            "shop.handle_webhook",
            {"delivery_id": delivery_id},  # the handler reads the stored body
            idempotency=Idempotency(key=f"webhook:{delivery_id}", scope="webhooks", ttl=WEBHOOK_KEY_TTL),
        )
        WebhookDelivery.objects.filter(pk=delivery.pk).update(job_id=result.job_id)
    return result


class InvalidDeliveryError(ValueError):
    """A webhook request the receiver refuses, answered 400 with this message."""


def _refused(*, field: str, bound: str, value: Any = None) -> InvalidDeliveryError:
    return InvalidDeliveryError(f"{field} must be {bound}")


def parse_delivery(raw: bytes) -> tuple[str, dict[str, Any]]:
    """Return the delivery id and body of a webhook request, or raise ``InvalidDeliveryError``.

    The body must be a UTF-8 JSON object of at most ``MAX_WEBHOOK_BODY_BYTES`` that PostgreSQL can
    store as it is (no NUL, no lone surrogate, no NaN, nested at most ``MAX_JSON_DEPTH`` deep), with
    a ``delivery_id`` of 1..100 letters, digits or ``_.:-``, matched whole.
    """
    if len(raw) > MAX_WEBHOOK_BODY_BYTES:
        raise InvalidDeliveryError(f"the body must be at most {MAX_WEBHOOK_BODY_BYTES} bytes")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested beyond what Python parses
        raise InvalidDeliveryError('expected a JSON object with a "delivery_id"') from None
    if not isinstance(body, dict):
        raise InvalidDeliveryError('expected a JSON object with a "delivery_id"')
    check_json(body, "body", max_bytes=MAX_WEBHOOK_BODY_BYTES, error=_refused)
    delivery_id = body.get("delivery_id")
    if not isinstance(delivery_id, str) or not DELIVERY_ID.fullmatch(delivery_id):
        raise InvalidDeliveryError("delivery_id must be 1..100 letters, digits or _.:-")
    return delivery_id, body


@csrf_exempt
@require_POST
def provider_webhook(request: HttpRequest) -> JsonResponse:
    """The endpoint the payment provider posts to: ``{"delivery_id": "evt_…", "type": "…"}``.

    Answers 202 for a new delivery and 200 for a redelivery, with the job's id either way, and 400
    for a body ``parse_delivery`` refuses. A real receiver checks the provider's signature first.
    """
    try:
        delivery_id, body = parse_delivery(request.body)
    except RequestDataTooBig:
        return JsonResponse({"error": f"the body must be at most {MAX_WEBHOOK_BODY_BYTES} bytes"}, status=400)
    except InvalidDeliveryError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    result = receive_webhook(delivery_id, body)
    status = 202 if result.outcome == EnqueueOutcome.ACCEPTED else 200
    return JsonResponse(
        {"delivery_id": delivery_id, "job_id": result.job_id, "outcome": result.outcome.value}, status=status
    )


@require_http_methods(["GET", "POST"])
def webhooks(request: HttpRequest) -> HttpResponse:
    """GET: the demo form. POST: deliver the same event once or twice, through ``receive_webhook``."""
    results: list[dict[str, Any]] = []
    delivery = None
    status = 200
    if request.method == "POST":
        form = WebhookDemoForm(request.POST)
        if not form.is_valid():
            status = 400
        else:
            delivery_id = form.cleaned_data["delivery_id"]
            body = {"delivery_id": delivery_id, "type": form.cleaned_data["event_type"]}
            for number in range(1, form.cleaned_data["times"] + 1):
                results.append(describe(receive_webhook(delivery_id, body), number=number))
            delivery = WebhookDelivery.objects.get(delivery_id=delivery_id)
            form = WebhookDemoForm(initial={"delivery_id": delivery_id, "event_type": body["type"], "times": 1})
    else:
        form = WebhookDemoForm(initial={"delivery_id": f"evt_{uuid.uuid4().hex[:12]}"})
    deliveries = list(WebhookDelivery.objects.all()[:10])
    jobs = jobs_by_id(d.job_id for d in deliveries)
    for d in deliveries:
        d.job = jobs.get(d.job_id or 0)  # type: ignore[attr-defined]
    context = {
        "form": form,
        "results": results,
        "delivery": delivery,
        "deliveries": deliveries,
        "endpoint": request.build_absolute_uri(reverse("provider-webhook")),
    }
    return render(request, "shop/webhooks.html", context, status=status)


# -- invoice capture through the fake payment provider --------------------------------------------


@require_http_methods(["GET", "POST"])
def invoices(request: HttpRequest) -> HttpResponse:
    """GET: the invoices and a form. POST: create an invoice and go to it."""
    form = InvoiceForm(request.POST) if request.method == "POST" else InvoiceForm()
    if request.method == "POST" and form.is_valid():
        amount: Decimal = form.cleaned_data["amount"]
        invoice = Invoice.objects.create(amount_cents=int(amount * 100))
        return redirect("invoice-detail", invoice.pk)
    context = {"form": form, "invoices": Invoice.objects.all()[:10]}
    return render(request, "shop/invoices.html", context, status=400 if form.is_bound else 200)


@require_GET
def invoice_detail(request: HttpRequest, invoice_id: int) -> HttpResponse:
    invoice = get_object_or_404(Invoice, pk=invoice_id)
    outcome = request.GET.get("outcome")
    result = None
    if invoice.capture_job_id and outcome in IDEMPOTENT_OUTCOMES:
        result = describe(EnqueueResult(invoice.capture_job_id, EnqueueOutcome(outcome)))
    return _invoice_page(request, invoice, CaptureForm(), result=result)


@require_POST
def capture_invoice(request: HttpRequest, invoice_id: int) -> HttpResponse:
    """Enqueue the capture of an invoice, once per invoice (a repeat is replayed)."""
    invoice = get_object_or_404(Invoice, pk=invoice_id)
    form = CaptureForm(request.POST)
    if not form.is_valid():
        return _invoice_page(request, invoice, form, status=400)
    try:
        with transaction.atomic():
            result = enqueue_with_result(
                "shop.capture_invoice",
                {"invoice_id": invoice.pk, "simulate": form.cleaned_data["simulate"]},
                max_attempts=5,
                idempotency=Idempotency(key=f"capture:{invoice.pk}", scope="invoice-capture"),
            )
            Invoice.objects.filter(pk=invoice.pk).update(capture_job_id=result.job_id)
    except EnqueueIdempotencyConflictError as exc:
        return _invoice_page(request, invoice, form, conflict=exc, status=409)
    query = urlencode({"outcome": result.outcome.value})
    return redirect(f"{reverse('invoice-detail', args=[invoice.pk])}?{query}")


def _invoice_page(
    request: HttpRequest,
    invoice: Invoice,
    form: CaptureForm,
    *,
    result: dict[str, Any] | None = None,
    conflict: EnqueueIdempotencyConflictError | None = None,
    status: int = 200,
) -> HttpResponse:
    context = {
        "invoice": invoice,
        "form": form,
        "result": result,
        "conflict": conflict,
        "job": jobs_by_id([invoice.capture_job_id]).get(invoice.capture_job_id or 0),
        "charges": ProviderCharge.objects.filter(reference=invoice.provider_reference),
    }
    return render(request, "shop/invoice_detail.html", context, status=status)


# -- debounced search index update ----------------------------------------------------------------


@require_GET
def search_index(request: HttpRequest) -> HttpResponse:
    return _search_page(request)


@require_POST
def edit_product(request: HttpRequest, product_id: int) -> HttpResponse:
    """Save a product and debounce its search index update: a burst of edits gives one job."""
    product = get_object_or_404(Product, pk=product_id)
    form = ProductForm(request.POST, instance=product)
    if not form.is_valid():
        return _search_page(request, forms={product.pk: form}, status=400)
    payload = {"product_id": product.pk}
    with transaction.atomic():
        form.save()
        result = enqueue_with_result(
            "shop.update_search_index",
            payload,
            debounce=Debounce(key=f"search-index:{product.pk}", window=SEARCH_INDEX_WINDOW, scope="search"),
        )
        follow_up = None
        if result.outcome == EnqueueOutcome.NON_REPLACEABLE and result.reason == NonReplaceableReason.NOT_PENDING:
            # The job may already have read the product: make sure one more run picks this edit up.
            follow_up = enqueue_with_result(
                "shop.update_search_index",
                payload,
                unique=Unique(key=f"search-index-follow-up:{product.pk}", scope="search"),
            )
        Product.objects.filter(pk=product.pk).update(index_job_id=(follow_up or result).job_id)
    shown = describe(result, product=product, follow_up=describe(follow_up) if follow_up else None)
    return _search_page(request, result=shown)


def _search_page(
    request: HttpRequest,
    *,
    forms: dict[int, ProductForm] | None = None,
    result: dict[str, Any] | None = None,
    status: int = 200,
) -> HttpResponse:
    products = list(Product.objects.all())
    jobs = jobs_by_id(p.index_job_id for p in products)
    now = timezone.now()
    rows = []
    for product in products:
        job = jobs.get(product.index_job_id or 0)
        rows.append(
            {
                "product": product,
                "form": (forms or {}).get(product.pk) or ProductForm(instance=product),
                "job": job,
                "runs_in": (job.run_at - now).total_seconds() if job and job.status == "queued" else None,
                "stale": product.indexed_description != product.description,
            }
        )
    context = {"rows": rows, "result": result, "window": SEARCH_INDEX_WINDOW.total_seconds()}
    return render(request, "shop/search_index.html", context, status=status)


# -- throttled digest -----------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
def digest(request: HttpRequest) -> HttpResponse:
    """Send a digest at most once a minute per user: repeats within the minute are coalesced."""
    result = None
    form = DigestForm(request.POST) if request.method == "POST" else DigestForm()
    if request.method == "POST" and form.is_valid():
        user = form.cleaned_data["user"]
        enqueued = enqueue_with_result(
            "shop.send_digest",
            {"user": user},
            throttle=Throttle(key=f"digest:{user}", window=DIGEST_WINDOW, scope="digests"),
        )
        job = Job.objects.get(pk=enqueued.job_id)
        result = describe(enqueued, user=user, window_ends=job.created_at + DIGEST_WINDOW)
    context = {"form": form, "result": result, "digests": Digest.objects.all()[:10]}
    return render(request, "shop/digest.html", context, status=400 if form.is_bound and not form.is_valid() else 200)


# -- conflict: the same key with a changed payload ---------------------------------------------


@require_http_methods(["GET", "POST"])
def conflict(request: HttpRequest) -> HttpResponse:
    """Request a refund once per order; another amount under the same key is a conflict."""
    result = None
    error = None
    form = RefundForm(request.POST) if request.method == "POST" else RefundForm()
    if request.method == "POST" and form.is_valid():
        order = form.cleaned_data["order"]
        try:
            enqueued = enqueue_with_result(
                "shop.refund_order",
                {"order_id": order.pk, "amount_cents": form.cleaned_data["amount"] * 100},
                idempotency=Idempotency(key=f"refund:order:{order.pk}", scope="refunds"),
            )
        except EnqueueIdempotencyConflictError as exc:
            error = exc
        else:
            result = describe(enqueued, order=order)
    status = 409 if error else 400 if form.is_bound and not form.is_valid() else 200
    context = {"form": form, "result": result, "conflict": error, "has_orders": Order.objects.exists()}
    return render(request, "shop/conflict.html", context, status=status)
