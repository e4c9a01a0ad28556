"""A fake payment provider that honours ``Idempotency-Key``, as real payment APIs do.

The provider stands for an external system. It keeps its charges in its own table
(:class:`~example_project.shop.models.ProviderCharge`) and writes them on a database connection
of its own, in autocommit: a charge is committed the moment the provider answers, whatever
happens to the job that asked for it afterwards, exactly like an HTTP call to a real provider.

Its contract, the one to check with any real provider:

- A charge request with a new idempotency key creates a charge.
- A repeat with the same key and the same amount creates nothing and returns the first charge
  (``Charge.replayed`` is true). Concurrent repeats wait for the first one and get its charge.
- A repeat with the same key and another amount is refused with :class:`IdempotencyKeyReusedError`.
- Keys are kept forever (a real provider forgets them after a while, often 24 hours).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections
from psycopg import sql

from example_project.shop.models import ProviderCharge


class PaymentProviderError(Exception):
    """The provider refused a request."""


class IdempotencyKeyReusedError(PaymentProviderError):
    """The idempotency key was used before for a request with other parameters."""


@dataclass(frozen=True)
class Charge:
    """The provider's answer to a charge request."""

    charge_id: str
    amount_cents: int
    replayed: bool


class FakePaymentProvider:
    """Charges "cards" into the ``ProviderCharge`` table, once per idempotency key.

    ``using`` names the Django database alias whose server and database hold that table; the
    provider opens its own connection to it for every request, as a client opens an HTTP request.
    """

    def __init__(self, using: str = "default") -> None:
        self.using = using

    def charge(self, amount_cents: int, *, idempotency_key: str, reference: str = "") -> Charge:
        """Charge ``amount_cents`` once per ``idempotency_key``; return the charge (new or first)."""
        if not idempotency_key:
            raise PaymentProviderError("an Idempotency-Key is required")
        new_id = f"ch_{uuid.uuid4().hex[:20]}"
        table = sql.Identifier(ProviderCharge._meta.db_table)
        # One statement: the unique index on idempotency_key decides between racing requests.
        # A repeat only counts the request (and waits while a concurrent first request commits).
        statement = sql.SQL(
            "INSERT INTO {table} AS c (charge_id, idempotency_key, amount_cents, reference, request_count, created_at)"
            " VALUES (%s, %s, %s, %s, 1, now())"
            " ON CONFLICT (idempotency_key) DO UPDATE SET request_count = c.request_count + 1"
            " RETURNING c.charge_id, c.amount_cents"
        ).format(table=table)
        with self._connect() as conn:
            row = conn.execute(statement, (new_id, idempotency_key, amount_cents, reference)).fetchone()
        assert row is not None
        charge_id, stored_amount = row
        if stored_amount != amount_cents:
            raise IdempotencyKeyReusedError(
                f"this Idempotency-Key was used for a charge of {stored_amount} cents, not {amount_cents}"
            )
        return Charge(charge_id=charge_id, amount_cents=stored_amount, replayed=charge_id != new_id)

    def _connect(self) -> psycopg.Connection[Any]:
        """A new autocommit session to the provider's database, outside Django's connections."""
        params = connections[self.using].get_connection_params()
        for name in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(name, None)
        return psycopg.connect(**params, autocommit=True)


provider = FakePaymentProvider()
