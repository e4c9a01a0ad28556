"""Operator view and actions of circuit breakers: their states, and a reset.

The admin page, ``workhorse_status`` and the metrics gauge read ``breaker_states``; the admin's
reset action calls ``reset_breaker``. See docs/circuit-breakers.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

from django.db import router
from django.db.models import Count
from django.utils import timezone

from django_workhorse import conf, sql
from django_workhorse.admission import recording
from django_workhorse.enqueueing.storable import check_text
from django_workhorse.exceptions import BreakerValidationError
from django_workhorse.models import Breaker as BreakerRow
from django_workhorse.models import BreakerState, Job, JobStatus
from django_workhorse.operations.actions import check_requested_by

logger = logging.getLogger(__name__)
HALF_OPEN = "half-open"


@dataclass(frozen=True)
class BreakerStatus:
    """One breaker as an operator sees it."""

    key: str
    state: str  # closed, open or half_open, as stored
    effective: str  # "closed", "open until <instant>", "half-open" (also once an open one's cooldown passed)
    open_until: datetime | None
    failures_in_window: int
    held_jobs: int
    transitions: list[dict[str, Any]]
    changed_at: datetime

    def as_json(self) -> dict[str, object]:
        """Return a JSON-ready dict (instants in ISO 8601)."""
        return {
            "key": self.key,
            "state": self.state,
            "effective": self.effective,
            "open_until": self.open_until.isoformat() if self.open_until else None,
            "failures_in_window": self.failures_in_window,
            "held_jobs": self.held_jobs,
            "transitions": self.transitions,
            "changed_at": self.changed_at.isoformat(),
        }


def effective_state(state: str, open_until: datetime | None, now: datetime) -> str:
    """Return what a breaker does now: "closed", "open until <UTC instant>" or "half-open" (an open
    breaker whose cooldown passed admits its canaries at the next claim)."""
    if state == BreakerState.OPEN and open_until is not None and open_until > now:
        return f"open until {open_until.astimezone(dt_timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
    if state in (BreakerState.OPEN, BreakerState.HALF_OPEN):
        return HALF_OPEN
    return str(BreakerState.CLOSED)


def failures_in_window(row: BreakerRow, now: datetime) -> int:
    """How many of the row's recent failures fall within its policy's ``within`` of ``now``."""
    within = row.policy.get("within") if isinstance(row.policy, dict) else None
    failures = row.recent_failures if isinstance(row.recent_failures, list) else []
    if not isinstance(within, (int, float)):
        return len(failures)
    since = now.timestamp() - within
    return sum(1 for at in failures if isinstance(at, (int, float)) and at >= since)


def held_counts(keys: list[str], *, using: str | None = None) -> dict[str, int]:
    """The queued jobs each breaker holds, by key (through workhorse_job_breaker_held_idx)."""
    alias = using or router.db_for_read(Job)
    rows = (
        Job.objects.using(alias)
        .filter(status=JobStatus.QUEUED, held_since__isnull=False, breaker_key__in=keys)
        .values("breaker_key")
        .annotate(held=Count("id"))
        .order_by()
    )
    return {row["breaker_key"]: row["held"] for row in rows}


def breaker_states(*, using: str | None = None, now: datetime | None = None) -> list[BreakerStatus]:
    """Return every breaker with a row (one exists once a job behind it failed), by key."""
    now = now or timezone.now()
    alias = using or router.db_for_read(BreakerRow)
    rows = list(BreakerRow.objects.using(alias).order_by("key"))
    held = held_counts([row.key for row in rows], using=using)
    return [status_of(row, now, held.get(row.key, 0)) for row in rows]


def status_of(row: BreakerRow, now: datetime, held: int) -> BreakerStatus:
    """Return ``row`` as a BreakerStatus, ``held`` being its held jobs."""
    transitions = row.transitions if isinstance(row.transitions, list) else []
    return BreakerStatus(
        key=row.key,
        state=row.state,
        effective=effective_state(row.state, row.open_until, now),
        open_until=row.open_until,
        failures_in_window=failures_in_window(row, now),
        held_jobs=held,
        transitions=transitions,
        changed_at=row.changed_at,
    )


@dataclass(frozen=True)
class BreakerReset:
    """What a reset did: the state the breaker was in (None: it had no row) and the jobs given back."""

    previous: str | None
    released: int


def reset_breaker(key: str, *, requested_by: str = "", using: str | None = None) -> BreakerReset:
    """Close breaker ``key`` now and give its held jobs back to the queue at once.

    Its failure window is emptied; the transition names who asked. Raise ``BreakerValidationError``
    for a key that cannot be one (empty, over 256 bytes, unstorable text) and
    ``InvalidArgumentError`` for a bad ``requested_by``.
    """
    check_text(key, "key", max_bytes=conf.MAX_BREAKER_KEY_BYTES, error=BreakerValidationError)
    by = check_requested_by(requested_by)
    alias = using or router.db_for_write(BreakerRow)
    reason = f"reset by {by}" if by else "reset by an operator"
    previous, released = sql.breakers.reset_breaker(alias, key=key, reason=reason)
    if previous is not None and previous != BreakerState.CLOSED:
        recording.report([sql.breakers.Transition(key, previous, BreakerState.CLOSED, reason, released)])
    return BreakerReset(previous, released)
