"""Fair queues (decision 0021, "Fair share"): which queues a worker claims in fair share, and
where its next claim of each starts.

A queue is fair when ``WORKHORSE_QUEUES`` says ``{"fair": True}`` for it. A worker splits its
queues once, when it starts. Its claims read a fair queue's partition keys in key order from just
after the last key its previous claim of that queue took (a cursor), round the ring of keys. The
queue's jobs without a partition key are one more key, but finding them walks the queue's keyed
ready jobs, so a worker looks for them while it finds some, else once per ``UNKEYED_RECHECK``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django_workhorse.conf import app_settings

# The keys a WORKHORSE_QUEUES entry may have (checks.py refuses others).
QUEUE_OPTIONS = frozenset({"fair"})
# Where a cursor starts: before every key (a partition key is never empty).
FIRST_KEY = ""
# How long a worker that found no unkeyed job in a fair queue waits before it looks again, in seconds.
UNKEYED_RECHECK = 1.0


class ClaimedJob(Protocol):
    """What the cursors read of a claimed job (``sql.claims.ClaimedJob``)."""

    @property
    def queue(self) -> str: ...
    @property
    def partition_key(self) -> str | None: ...


def is_fair(queue: str) -> bool:
    """Whether ``WORKHORSE_QUEUES`` declares ``queue`` fair."""
    queues: Any = app_settings.QUEUES
    options = queues.get(queue) if isinstance(queues, dict) else None
    return isinstance(options, dict) and options.get("fair") is True


def split_queues(queues: Sequence[str]) -> tuple[list[str], list[str]]:
    """``queues`` as (claimed in claim order, claimed in fair share), each in the order given."""
    return [q for q in queues if not is_fair(q)], [q for q in queues if is_fair(q)]


def next_cursor(after: str, keys: Iterable[str | None]) -> str:
    """Where the next claim of a fair queue starts, given the partition keys its last claim took.

    That claim read the keys after ``after`` first, then wrapped round to the first key: the last
    key it took is the largest of those at or before ``after`` if it wrapped, else the largest.
    """
    taken = {key for key in keys if key is not None}
    wrapped = [key for key in taken if key <= after]
    if wrapped:
        return max(wrapped)
    return max(taken, default=after)


@dataclass
class _Position:
    after: str = FIRST_KEY
    unkeyed_due: float = 0.0  # time.monotonic() at which to look for unkeyed jobs again


class FairCursors:
    """One worker's place in each of its fair queues, for ``sql.claims.claim(fair_queues=...)``."""

    def __init__(self, queues: Sequence[str]) -> None:
        self._positions = {queue: _Position() for queue in queues}

    def __bool__(self) -> bool:
        return bool(self._positions)

    def reads(self) -> list[tuple[str, str, bool]]:
        """``(queue, after, look for unkeyed jobs)`` for the next claim."""
        now = time.monotonic()
        return [(queue, at.after, at.unkeyed_due <= now) for queue, at in self._positions.items()]

    def advance(self, reads: Sequence[tuple[str, str, bool]], jobs: Sequence[ClaimedJob]) -> None:
        """Move past what the claim that made ``reads`` took."""
        for queue, after, unkeyed in reads:
            mine = [job.partition_key for job in jobs if job.queue == queue]
            at = self._positions[queue]
            at.after = next_cursor(after, mine)
            if unkeyed and None not in mine:
                at.unkeyed_due = time.monotonic() + UNKEYED_RECHECK
