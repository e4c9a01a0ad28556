"""HTTP ``Idempotency-Key`` for Django and DRF views: ``@idempotent(scope)``.

A retried request with the same key gets the first response back (``Idempotent-Replayed: true``)
instead of running the view again; the key's record is written in the view's own transaction, on
the effect ledger. See docs/http-idempotency.md.
"""

from __future__ import annotations

from django_workhorse.http.decorator import idempotent
from django_workhorse.http.keys import RequestIdempotency, idempotency_of

__all__ = ["RequestIdempotency", "idempotency_of", "idempotent"]
