"""Retry policies: how long a failed attempt waits before the next one."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

RetryKind = Literal["exponential", "fixed"]


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """When to run the next attempt of a failed job.

    ``exponential`` waits ``base * factor ** (attempt - 1)``, capped at ``max_delay``; ``fixed``
    always waits ``base``. ``jitter`` (0..1) spreads each delay randomly by up to that fraction
    downwards, so failed jobs of one outage do not all come back at once. The policy is stored
    with the job and is part of the enqueue fingerprint.
    """

    kind: RetryKind = "exponential"
    base: timedelta = timedelta(seconds=1)
    factor: float = 2.0
    max_delay: timedelta = timedelta(hours=1)
    jitter: float = 0.1

    @classmethod
    def fixed(cls, delay: timedelta, *, jitter: float = 0.0) -> RetryPolicy:
        """Return a policy that waits ``delay`` between attempts."""
        return cls(kind="fixed", base=delay, factor=1.0, max_delay=delay, jitter=jitter)

    def to_json(self) -> dict[str, Any]:
        """Return the normalized, JSON-ready form stored with the job and fingerprinted."""
        return {
            "kind": self.kind,
            "base_ms": _ms(self.base),
            "factor": float(self.factor),
            "max_ms": _ms(self.max_delay),
            "jitter": float(self.jitter),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RetryPolicy:
        """Rebuild a policy from its stored form."""
        return cls(
            kind=data["kind"],
            base=timedelta(milliseconds=data["base_ms"]),
            factor=data["factor"],
            max_delay=timedelta(milliseconds=data["max_ms"]),
            jitter=data["jitter"],
        )

    def delay_for(self, attempt: int, *, rng: random.Random | None = None) -> timedelta:
        """Return how long to wait after failed attempt number ``attempt`` (1-based)."""
        if self.kind == "fixed":
            delay = self.base
        else:
            growth = self.factor ** max(attempt - 1, 0)
            delay = min(self.base * growth, self.max_delay) if growth < 1e9 else self.max_delay
        spread = (rng or random).random() * self.jitter
        return delay * (1.0 - spread)


DEFAULT_RETRY_POLICY = RetryPolicy()


def _ms(value: timedelta) -> int:
    return value // timedelta(milliseconds=1)
