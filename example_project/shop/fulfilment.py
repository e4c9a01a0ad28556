"""Order fulfilment, a workflow: charge the card, then pack the parcel and mail the receipt, then
close the order (docs/example.md, "Fulfil an order").

The workflow is keyed by the order, so a second press of "Fulfil" (or a retried request) gets the
same workflow and the same jobs back. Each step's ``ctx.idempotency_key`` is derived from that key
and the step's name: the payment provider sees one key for the charge, ever.
"""

from __future__ import annotations

from django_workhorse import EnqueueRequest, Idempotency
from django_workhorse.workflows import Workflow

FULFILMENT_SCOPE = "shop-fulfilment"


def fulfilment(order_id: int) -> Workflow:
    """The fulfilment workflow of one order: charge → pack + mail → close."""
    wf = Workflow("fulfil", idempotency=Idempotency(key=f"fulfil:{order_id}", scope=FULFILMENT_SCOPE))
    payload = {"order_id": order_id}
    charge = wf.add("charge", EnqueueRequest("shop.charge_order", payload))
    pack = wf.add("pack", EnqueueRequest("shop.pack_order", payload), after=[charge])
    mail = wf.add("mail", EnqueueRequest("shop.mail_receipt", payload), after=[charge])
    wf.add("close", EnqueueRequest("shop.close_order", payload), after=[pack, mail])
    return wf
