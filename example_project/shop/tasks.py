"""Jobs of the demo shop, run by ``manage.py workhorse_worker``."""

from __future__ import annotations

import logging

from django_workhorse import HandlerContext, register

logger = logging.getLogger(__name__)


@register("shop.send_confirmation")
def send_confirmation(ctx: HandlerContext, payload: dict[str, int]) -> dict[str, int]:
    """Pretend to email the order confirmation; the provider would get ``ctx.idempotency_key``."""
    logger.warning(
        "Sending the confirmation of order %s (Idempotency-Key %s)", payload["order_id"], ctx.idempotency_key
    )
    return {"order_id": payload["order_id"]}
