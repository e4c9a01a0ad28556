"""A job a worker holds (leased, maybe running), and how long its attempt has run."""

from __future__ import annotations

import time
from dataclasses import dataclass

from django_workhorse import sql
from django_workhorse.worker.context import HandlerContext


@dataclass
class HeldJob:
    """A job this worker holds, and whether its handler started."""

    job: sql.claims.ClaimedJob
    context: HandlerContext
    started_at: float | None = None
    ended: bool = False  # the handler returned; its outcome is on its way to the database

    @property
    def started(self) -> bool:
        return self.started_at is not None

    def wait_for_start(self) -> None:
        """Wait until the instant its rate limit admitted it at, if its claim admitted it ahead
        (at most ``admission.rate_limits.ADMIT_AHEAD``, counted from when the claim returned)."""
        if (delay := self.job.claimed_at + self.job.start_in - time.perf_counter()) > 0:
            time.sleep(delay)

    def mark_started(self) -> None:
        self.started_at = time.monotonic()

    def overtime(self, grace: float) -> float:
        """Seconds past its timeout (plus ``grace``) this attempt has run; <= 0 while within it."""
        if self.started_at is None or self.job.timeout is None:
            return 0.0
        return time.monotonic() - self.started_at - self.job.timeout.total_seconds() - grace
