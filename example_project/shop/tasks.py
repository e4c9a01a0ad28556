"""Jobs of the demo shop, run by ``manage.py workhorse_worker`` (``make run`` starts one).

Every handler reads the current rows by id rather than trusting the payload, and makes its own
writes safe to repeat: a job runs at least once, and can run again after a crash.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from django_workhorse import HandlerContext, register
from example_project.shop.models import Digest, Invoice, Order, Product, WebhookDelivery
from example_project.shop.payments import provider

logger = logging.getLogger(__name__)

# How long a capture with ``simulate="hold"`` pauses after the charge, on its first attempt.
HOLD_SECONDS = 60.0


@register("shop.send_confirmation")
def send_confirmation(ctx: HandlerContext, payload: dict[str, int]) -> dict[str, int]:
    """Pretend to email the order confirmation; a mail API would get ``ctx.idempotency_key``."""
    logger.info("Sending the confirmation of order %s (Idempotency-Key %s)", payload["order_id"], ctx.idempotency_key)
    return {"order_id": payload["order_id"]}


@register("shop.handle_webhook")
def handle_webhook(ctx: HandlerContext, payload: dict[str, str]) -> dict[str, str]:
    """Process a stored webhook delivery (here: just mark it processed)."""
    delivery = WebhookDelivery.objects.get(delivery_id=payload["delivery_id"])
    logger.info("Handling webhook delivery %s (%s)", delivery.delivery_id, delivery.event_type or "no type")
    WebhookDelivery.objects.filter(pk=delivery.pk, processed_at=None).update(processed_at=timezone.now())
    return {"delivery_id": delivery.delivery_id}


@register("shop.capture_invoice")
def capture_invoice(ctx: HandlerContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Charge the invoice at the payment provider, then mark it paid.

    The provider gets an idempotency key that is the same on every attempt of this job, so an
    attempt that runs again after a crash gets the first charge back instead of a second one.

    ``payload["simulate"]`` (demo only) stages the lost acknowledgement, on the first attempt:
    ``"fail"`` raises after the charge (the job is retried), ``"hold"`` pauses after the charge
    for ``HOLD_SECONDS`` so that the worker can be killed there (``kill -9``).
    """
    invoice = Invoice.objects.get(pk=payload["invoice_id"])
    charge = provider.charge(
        invoice.amount_cents,
        idempotency_key=f"{ctx.idempotency_key}:charge",
        reference=invoice.provider_reference,
    )
    logger.info(
        "Invoice %s: charge %s (%s) on attempt %s",
        invoice.pk,
        charge.charge_id,
        "replayed by the provider" if charge.replayed else "new",
        ctx.attempt,
    )
    simulate = payload.get("simulate", "")
    if ctx.attempt == 1 and simulate == "fail":
        raise RuntimeError("simulated crash after the provider charged the card")
    if ctx.attempt == 1 and simulate == "hold":
        _hold_after_charge(ctx, invoice)
    with transaction.atomic():
        # Conditional, so a repeated run changes nothing once the invoice is paid.
        Invoice.objects.filter(pk=invoice.pk, status=Invoice.Status.OPEN).update(
            status=Invoice.Status.PAID, charge_id=charge.charge_id, paid_at=timezone.now()
        )
        Invoice.objects.filter(pk=invoice.pk).update(holding_pid=None)
    return {"charge_id": charge.charge_id, "provider_replayed": charge.replayed}


def _hold_after_charge(ctx: HandlerContext, invoice: Invoice) -> None:
    """Tell the world (through the invoice row) that this process holds after the charge; wait."""
    Invoice.objects.filter(pk=invoice.pk).update(holding_pid=os.getpid())
    logger.warning(
        "Invoice %s is charged; holding for %s s. Kill this worker now to lose the acknowledgement: kill -9 %s",
        invoice.pk,
        HOLD_SECONDS,
        os.getpid(),
    )
    deadline = time.monotonic() + HOLD_SECONDS
    tick = threading.Event()
    while time.monotonic() < deadline:
        ctx.raise_if_cancelled()  # the worker is stopping: leave the job to the next attempt
        tick.wait(0.1)


@register("shop.update_search_index")
def update_search_index(payload: dict[str, int]) -> dict[str, Any]:
    """Copy the product's *current* description into the (pretend) search index."""
    product = Product.objects.get(pk=payload["product_id"])
    Product.objects.filter(pk=product.pk).update(indexed_description=product.description, indexed_at=timezone.now())
    logger.info("Reindexed product %s", product.pk)
    return {"product_id": product.pk, "indexed_chars": len(product.description)}


@register("shop.reindex_stale_products")
def reindex_stale_products(ctx: HandlerContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Catch up the search index for products edited since their last indexing (a periodic job).

    ``ctx.scheduled_for`` is the tick this run is for; a repeated run finds nothing stale left.
    """
    stale = Product.objects.exclude(indexed_description=models.F("description"))
    count = 0
    for product in stale.only("id", "description"):
        Product.objects.filter(pk=product.pk).update(indexed_description=product.description, indexed_at=timezone.now())
        count += 1
    tick = ctx.scheduled_for.isoformat() if ctx.scheduled_for else None
    logger.info("Reindexed %s stale product(s) for the tick %s", count, tick)
    return {"reindexed": count, "tick": tick}


@register("shop.send_digest")
def send_digest(ctx: HandlerContext, payload: dict[str, str]) -> dict[str, str]:
    """Pretend to email a digest; the row is unique per job, so a repeated run records it once."""
    Digest.objects.get_or_create(job_id=ctx.job_id, defaults={"recipient": payload["user"]})
    logger.info("Sent a digest to %s", payload["user"])
    return {"user": payload["user"]}


@register("shop.refund_order")
def refund_order(ctx: HandlerContext, payload: dict[str, int]) -> dict[str, int]:
    """Pretend to refund an order (the conflict demo only needs the job to exist)."""
    logger.info("Refunding %s cents on order %s", payload["amount_cents"], payload["order_id"])
    return payload


# -- order fulfilment, a workflow (example_project/shop/fulfilment.py) ----------------------------


@register("shop.charge_order")
def charge_order(ctx: HandlerContext, payload: dict[str, int]) -> dict[str, Any]:
    """Charge the order once: the provider gets the step's key, the same on every attempt."""
    order = Order.objects.get(pk=payload["order_id"])
    charge = provider.charge(order.amount_cents, idempotency_key=ctx.idempotency_key, reference=f"order-{order.pk}")
    Order.objects.filter(pk=order.pk, charge_id="").update(charge_id=charge.charge_id)
    logger.info("Order %s: charge %s (Idempotency-Key %s)", order.pk, charge.charge_id, ctx.idempotency_key)
    return {"charge_id": charge.charge_id, "amount_cents": order.amount_cents}


@register("shop.pack_order")
def pack_order(ctx: HandlerContext, payload: dict[str, int]) -> dict[str, int]:
    """Pretend to pack the parcel; runs only after the charge succeeded."""
    Order.objects.filter(pk=payload["order_id"], packed_at=None).update(packed_at=timezone.now())
    return {"order_id": payload["order_id"]}


@register("shop.mail_receipt")
def mail_receipt(ctx: HandlerContext, payload: dict[str, int]) -> dict[str, str]:
    """Pretend to mail the receipt, naming the charge that the ``charge`` step returned."""
    charge_id = ctx.result_of("charge")["charge_id"]
    logger.info("Mailing the receipt of order %s for charge %s", payload["order_id"], charge_id)
    Order.objects.filter(pk=payload["order_id"], receipt_sent_at=None).update(receipt_sent_at=timezone.now())
    return {"charge_id": charge_id}


@register("shop.close_order")
def close_order(ctx: HandlerContext, payload: dict[str, int]) -> dict[str, Any]:
    """Close the order once the parcel is packed and the receipt mailed (its two parents)."""
    Order.objects.filter(pk=payload["order_id"], closed_at=None).update(closed_at=timezone.now())
    return {"order_id": payload["order_id"], "after": sorted(ctx.parent_results)}
