"""The outcomes a handler raises: ``Snooze``, ``Retry``, ``Cancel`` and ``Fail``, checked when built.

They are raised, not returned (Oban and River return values): a handler's return value is its
result, and raising works from any depth of the handler's own calls. They derive from
``BaseException``, not ``Exception``, for the reason ``asyncio.CancelledError`` does: the handler's
own ``except Exception:`` (a log-and-continue around an API call, a retry helper) must not swallow
a decision by accident. Code that catches ``BaseException`` (or uses a bare ``except:``) still
sees them, and should re-raise them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, ClassVar

from django_workhorse import conf
from django_workhorse.enqueueing.storable import BoundError, check_datetime, check_text
from django_workhorse.exceptions import OutcomeValidationError

DELAY_BOUND = f"a timedelta > 0 and at most {conf.MAX_DELAY}"
UNTIL_BOUND = f"an aware datetime at most {conf.MAX_STORED_DATETIME.isoformat()}"


class HandlerOutcome(BaseException):
    """Base class of the outcomes a handler raises; do not raise directly."""

    # The outcome's name in event details ("snooze", "retry", "cancel", "fail").
    name: ClassVar[str] = ""


class Snooze(HandlerOutcome):
    """Put the job back in its queue until later, consuming no attempt.

    ``Snooze(timedelta(minutes=5))`` or ``Snooze(until=instant)``: exactly one of the two. A job
    snoozes at most ``WORKHORSE_MAX_SNOOZES`` times, and never past its deadline: a snooze beyond
    either makes it dead, with that reason. ``breaker=True`` also opens the job's circuit breaker
    until that instant (a provider's quota reset: every job behind it waits, not just this one; see
    docs/circuit-breakers.md). Raise ``OutcomeValidationError`` for a delay that is not in
    (0, ``MAX_DELAY``], an instant that is naive or after year 9999, or a ``breaker`` that is not a bool.
    """

    name = "snooze"

    def __init__(self, delay: timedelta | None = None, *, until: datetime | None = None, breaker: bool = False) -> None:
        if (delay is None) == (until is None):
            raise OutcomeValidationError(field="delay", bound="given, or until= instead (exactly one of the two)")
        if not isinstance(breaker, bool):
            raise OutcomeValidationError(field="breaker", bound="True or False", value=type(breaker).__name__)
        self.delay = None if delay is None else check_delay(delay, "delay")
        self.until = None if until is None else _check_until(until)
        self.breaker = breaker
        super().__init__(f"snooze for {delay}" if until is None else f"snooze until {until.isoformat()}")

    def run_at(self, now: datetime) -> datetime:
        """Return the instant the job is due again, for a snooze raised at ``now``."""
        return self.until if self.until is not None else now + self.delay  # type: ignore[operator]


class Retry(HandlerOutcome):
    """Fail this attempt and retry after at least ``after`` (an attempt is consumed).

    ``after`` is a floor: the delay is the larger of it and the retry policy's, and the policy's
    ``max_delay`` does not cap it. ``None`` means the policy's delay. On the last attempt, or when
    the retry would start past the deadline, the job is dead as after any failure. Raise
    ``OutcomeValidationError`` for an ``after`` that is not in (0, ``MAX_DELAY``].
    """

    name = "retry"

    def __init__(self, after: timedelta | None = None) -> None:
        self.after = None if after is None else check_delay(after, "after")
        super().__init__("retry with the policy's delay" if after is None else f"retry after {after}")

    @classmethod
    def from_response(cls, response: Any) -> Retry:
        """Return a ``Retry`` after the ``Retry-After`` header of ``response`` (anything with a
        ``.headers`` mapping: requests, httpx, Django); without a usable one, the policy's delay."""
        from django_workhorse.outcomes.retry_after import retry_after

        return cls(after=retry_after(getattr(response, "headers", None)))


class Cancel(HandlerOutcome):
    """End the job as ``cancelled`` now, with ``reason``: no retry, and its key freed as an
    operator's cancel frees it (a ``unique`` or ``debounce`` key at once; an ``idempotency`` key
    keeps its TTL). Raise ``OutcomeValidationError`` for a reason that cannot be stored."""

    name = "cancel"

    def __init__(self, reason: str = "") -> None:
        self.reason = check_reason(reason)
        super().__init__(reason)


class Fail(HandlerOutcome):
    """Make the job dead now (a dead letter, redrivable), whatever attempts remain, with ``reason``.
    Raise ``OutcomeValidationError`` for a reason that cannot be stored."""

    name = "fail"

    def __init__(self, reason: str = "") -> None:
        self.reason = check_reason(reason)
        super().__init__(reason)


def check_delay(value: Any, field: str) -> timedelta:
    """Return ``value`` if it is a timedelta in (0, ``MAX_DELAY``]; else raise ``OutcomeValidationError``."""
    if not isinstance(value, timedelta) or not timedelta(0) < value <= conf.MAX_DELAY:
        raise OutcomeValidationError(field=field, bound=DELAY_BOUND, value=value)
    return value


def _check_until(value: Any) -> datetime:
    check_datetime(value, "until", error=OutcomeValidationError)
    if value > conf.MAX_STORED_DATETIME:
        raise OutcomeValidationError(field="until", bound=UNTIL_BOUND, value=value)
    return value  # type: ignore[no-any-return]


def check_reason(value: Any) -> str:
    """Return ``value`` if it is storable text of at most ``MAX_REASON_CHARS`` characters."""
    return check_text(value, "reason", max_chars=conf.MAX_REASON_CHARS, allow_empty=True, error=OutcomeValidationError)


def exception_classes(value: Any, field: str, error: BoundError) -> tuple[type[BaseException], ...]:
    """Return ``value`` (an exception class, or a tuple or list of them) as a tuple; else raise ``error``."""
    items = (value,) if isinstance(value, type) else value
    if not isinstance(items, (tuple, list)) or not all(
        isinstance(item, type) and issubclass(item, BaseException) for item in items
    ):
        raise error(field=field, bound="exception classes (subclasses of BaseException)", value=value)
    return tuple(items)


def dead_letters(
    exc: BaseException, *, fail_on: tuple[type[BaseException], ...], retry_on: tuple[type[BaseException], ...] | None
) -> bool:
    """Return whether a handler's ``exc`` makes its job dead at once under ``@task(fail_on=, retry_on=)``:
    it matches ``fail_on``, or ``retry_on`` is given and it matches none of those."""
    return isinstance(exc, fail_on) or (retry_on is not None and not isinstance(exc, retry_on))
