"""Duplicates the keys saved, and conflicts, per scope and per minute: read from the metrics' counters.

Replays write nothing to PostgreSQL, so these numbers exist only as the ``workhorse_keyed_requests``
counters of the metrics extra. Two readings of the counters some time apart give the rates; the
dashboard keeps its readings between refreshes (``RecentTotals``), ``workhorse_status`` takes two
a window apart. Across processes (gunicorn, workers) they add up only in multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``); otherwise a process sees its own requests. Prometheus itself gives
the same numbers with the PromQL in docs/observability.md.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

from django_workhorse.observability import instruments
from django_workhorse.operations.stats import MAX_SCOPES_SHOWN, ScopeBindings

# The outcomes of a keyed request that a duplicate gets: no second job.
SAVED = ("replayed", "coalesced", "replaced")
CONFLICT = "conflict"
RECENT_WINDOW_SECONDS = 300.0


@dataclass(frozen=True)
class KeyedTotals:
    """The keyed requests counted up to ``at`` (``time.monotonic()``), by (scope, outcome)."""

    at: float
    counts: dict[tuple[str, str], float]


@dataclass(frozen=True)
class ScopeRate:
    """What the keys of one scope did between two readings of the counters."""

    scope: str
    saved: int  # duplicates that got the first request's job (replayed, coalesced, replaced)
    conflicts: int  # keys reused for different work
    seconds: float  # the time between the two readings

    @property
    def saved_per_minute(self) -> float:
        return self.saved * 60 / self.seconds if self.seconds > 0 else 0.0

    @property
    def conflicts_per_minute(self) -> float:
        return self.conflicts * 60 / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, object]:
        """Return a JSON-ready dict."""
        return {
            "scope": self.scope,
            "saved": self.saved,
            "conflicts": self.conflicts,
            "seconds": round(self.seconds, 3),
            "saved_per_minute": round(self.saved_per_minute, 3),
            "conflicts_per_minute": round(self.conflicts_per_minute, 3),
        }


def read() -> KeyedTotals | None:
    """Read the counters now; None without the metrics extra."""
    counts = instruments.keyed_counts()
    return None if counts is None else KeyedTotals(time.monotonic(), counts)


def between(earlier: KeyedTotals, later: KeyedTotals) -> dict[str, ScopeRate]:
    """The rates of every scope counted by ``later``, over the time since ``earlier``."""
    seconds = later.at - earlier.at
    scopes = sorted({scope for scope, _ in later.counts})

    def delta(scope: str, outcome: str) -> int:
        return int(later.counts.get((scope, outcome), 0.0) - earlier.counts.get((scope, outcome), 0.0))

    return {
        scope: ScopeRate(scope, sum(delta(scope, o) for o in SAVED), delta(scope, CONFLICT), seconds)
        for scope in scopes
    }


class RecentTotals:
    """Readings a long-lived process keeps (the dashboard's), each call giving the rates since the
    oldest reading of the last ``window`` seconds: None on the first call, or after a longer pause."""

    def __init__(self, window: float = RECENT_WINDOW_SECONDS) -> None:
        self.window = window
        self._readings: collections.deque[KeyedTotals] = collections.deque()
        self._lock = threading.Lock()

    def rates(self) -> dict[str, ScopeRate] | None:
        now = read()
        if now is None:
            return None
        with self._lock:
            while self._readings and now.at - self._readings[0].at > self.window:
                self._readings.popleft()
            earlier = self._readings[0] if self._readings else None
            self._readings.append(now)
        return None if earlier is None else between(earlier, now)


@dataclass(frozen=True)
class ScopeDedup:
    """One scope's line on the dashboard and in ``workhorse_status``."""

    scope: str
    live_bindings: int | None  # None: not counted (beyond the scopes with the most bindings)
    rate: ScopeRate | None  # None without the metrics extra or before a second reading

    def as_json(self) -> dict[str, object]:
        """Return a JSON-ready dict."""
        rate = None if self.rate is None else {k: v for k, v in self.rate.as_json().items() if k != "scope"}
        return {"scope": self.scope, "live_bindings": self.live_bindings, "rate": rate}


def by_scope(
    bindings: list[ScopeBindings], rates: dict[str, ScopeRate] | None, *, limit: int = MAX_SCOPES_SHOWN
) -> list[ScopeDedup]:
    """Join the live bindings of each scope (``stats.live_bindings(limit=limit)``) with its rates:
    scopes with bindings first (most first), then those that only had keyed requests."""
    rates = rates or {}
    lines = [ScopeDedup(b.scope, b.live, rates.get(b.scope)) for b in bindings]
    shown = {b.scope for b in bindings}
    # A scope left out of a full listing may have bindings: uncounted rather than zero.
    others = None if len(bindings) >= limit else 0
    lines += [ScopeDedup(scope, others, rate) for scope, rate in sorted(rates.items()) if scope not in shown]
    return lines
