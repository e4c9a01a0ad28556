"""django-workhorse W1 with a new idempotency key per job inside ``transaction.atomic()``, as in a view."""

from __future__ import annotations

from peer_workhorse import WorkhorseAdapter


class WorkhorseKeyedAtomicAdapter(WorkhorseAdapter):
    name = "workhorse_keyed_atomic"
    atomic = True
    keyed = True
    notes = "django-workhorse, W1 only: a new Idempotency(key) per job, each in transaction.atomic()"


ADAPTER = WorkhorseKeyedAtomicAdapter
