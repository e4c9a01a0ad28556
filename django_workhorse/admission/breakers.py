"""A circuit breaker's policy, and which attempts count for or against it.

Importable before Django's apps are ready (settings and task modules build ``Breaker`` values).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django_workhorse import conf
from django_workhorse.admission.bounds import check_duration, check_integer
from django_workhorse.exceptions import BreakerValidationError

FAILURE, SUCCESS = "failure", "success"
# An attempt that ended before its handler could run tells nothing about the destination.
_NOT_THE_DESTINATIONS = ("DeadlineExceeded:", "Snooze:")
# Outcome kinds (worker.execution.OUTCOMES) that are the handler's decision about the job, not news
# of its destination: a snooze, a Fail or a fail_on/retry_on dead letter, a cancel.
_DECISIONS = frozenset({"snoozed", "failed", "cancelled"})


@dataclass(frozen=True)
class Breaker:
    """Stop running jobs against a destination that keeps failing, and try again after a cooldown.

    ``failures`` failed attempts within ``within`` open the breaker: its jobs stay queued (no
    attempt consumed) for ``cooldown``; then ``probes`` canary jobs run. A canary's success closes
    it; a failure opens it again for twice the previous cooldown, at most ``max_cooldown``
    (default: the larger of ``cooldown`` and 10 minutes).

    Raise ``BreakerValidationError`` naming the field and its bound if a value is out of bounds.
    """

    failures: int = 5
    within: timedelta = timedelta(minutes=1)
    cooldown: timedelta = timedelta(seconds=30)
    probes: int = 1
    max_cooldown: timedelta | None = field(default=None)

    def __post_init__(self) -> None:
        check_integer(
            self.failures, "failures", conf.MIN_BREAKER_FAILURES, conf.MAX_BREAKER_FAILURES, BreakerValidationError
        )
        check_duration(
            self.within, "within", conf.MIN_BREAKER_DURATION, conf.MAX_BREAKER_DURATION, BreakerValidationError
        )
        check_duration(
            self.cooldown, "cooldown", conf.MIN_BREAKER_DURATION, conf.MAX_BREAKER_DURATION, BreakerValidationError
        )
        check_integer(self.probes, "probes", conf.MIN_BREAKER_PROBES, conf.MAX_BREAKER_PROBES, BreakerValidationError)
        if self.max_cooldown is None:
            object.__setattr__(self, "max_cooldown", max(self.cooldown, conf.DEFAULT_MAX_BREAKER_COOLDOWN))
        else:
            check_duration(
                self.max_cooldown, "max_cooldown", self.cooldown, conf.MAX_BREAKER_DURATION, BreakerValidationError
            )

    @property
    def longest_cooldown(self) -> timedelta:
        """``max_cooldown``, resolved (never None after construction)."""
        assert self.max_cooldown is not None
        return self.max_cooldown

    def to_json(self) -> dict[str, Any]:
        """The policy as the breaker's row stores it (durations in seconds)."""
        return {
            "failures": self.failures,
            "within": self.within.total_seconds(),
            "cooldown": self.cooldown.total_seconds(),
            "probes": self.probes,
            "max_cooldown": self.longest_cooldown.total_seconds(),
        }


def verdict(status: str, kind: str, error: str) -> str | None:
    """Return how an attempt written as ``status``, whose outcome was of ``kind``, counts for its
    breaker: ``FAILURE``, ``SUCCESS`` or None (it says nothing about the destination).

    A failure is an attempt that raised or timed out, or raised ``Retry``: requeued with an error
    or dead. Cancelled, lost and unrecorded attempts count for nothing, and so do the handler's
    decisions about the job rather than its destination (``Snooze``, ``Fail``, ``fail_on``, ``Cancel``),
    a snooze past its bound or deadline, and a deadline that passed. The one rule: extend it here.
    """
    if status == "succeeded":
        return SUCCESS
    if kind in _DECISIONS:
        return None
    if status == "dead" or (status == "queued" and error):
        return None if error.startswith(_NOT_THE_DESTINATIONS) else FAILURE
    return None


def check_open_until(until: Any, now: datetime) -> datetime:
    """Return ``until`` if a handler may open its breaker until then: aware, after ``now``, at most
    the largest stored instant. Raise ``BreakerValidationError`` otherwise."""
    bound = f"an aware datetime after now and at most {conf.MAX_STORED_DATETIME.isoformat()}"
    if not isinstance(until, datetime) or until.tzinfo is None or until.utcoffset() is None:
        raise BreakerValidationError(field="until", bound=bound, value=until)
    if not now < until <= conf.MAX_STORED_DATETIME:
        raise BreakerValidationError(field="until", bound=bound, value=until)
    return until


# Jobs that name a breaker key (per call) whose task declares no breaker run behind this one.
DEFAULT_BREAKER = Breaker()
