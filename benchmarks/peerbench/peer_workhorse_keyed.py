"""django-workhorse W1 with a new idempotency key per job, in autocommit: a keyed first request."""

from __future__ import annotations

from peer_workhorse import WorkhorseAdapter


class WorkhorseKeyedAdapter(WorkhorseAdapter):
    name = "workhorse_keyed"
    keyed = True
    notes = "django-workhorse, W1 only: every job with a new Idempotency(key) (binding + job in one call)"


ADAPTER = WorkhorseKeyedAdapter
