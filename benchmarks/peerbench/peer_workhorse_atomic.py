"""django-workhorse with every enqueue inside ``transaction.atomic()``, as in a Django view."""

from __future__ import annotations

from peer_workhorse import WorkhorseAdapter


class WorkhorseAtomicAdapter(WorkhorseAdapter):
    name = "workhorse_atomic"
    atomic = True
    notes = "django-workhorse, each W1/W2/W5 call wrapped in transaction.atomic() (BEGIN + statement + COMMIT)"


ADAPTER = WorkhorseAtomicAdapter
