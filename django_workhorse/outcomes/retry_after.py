"""``retry_after(headers)``: the delay an HTTP ``Retry-After`` header asks for, or None.

RFC 9110 §10.2.3: delta-seconds (``120``) or an HTTP-date (``Wed, 21 Oct 2026 07:28:00 GMT``).
Anything else (absent, empty, negative, fractional, garbage, a date in the past) is None: the
retry policy's delay. A longer delay than ``MAX_DELAY`` is cut to it. Never raises.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from django_workhorse import conf

HEADER = "retry-after"
# delta-seconds is 1*DIGIT (ASCII digits only: str.isdigit accepts other scripts' digits too).
_DELTA_SECONDS = re.compile(r"[0-9]+")
# More digits than this is more seconds than MAX_DELAY whatever they are (and int() of thousands
# of digits is refused by Python).
_MAX_DELTA_DIGITS = len(str(int(conf.MAX_DELAY.total_seconds())))


def retry_after(headers: Any, *, now: datetime | None = None) -> timedelta | None:
    """Return the delay the ``Retry-After`` header of ``headers`` asks for, or None without a usable one.

    ``headers`` is any mapping of header names to values (the name is matched case-insensitively);
    ``now`` (aware, default: the current time) is what an HTTP-date is measured from. The delay is
    positive and at most ``MAX_DELAY``; never raises.
    """
    try:
        value = _header(headers)
        return None if value is None else _delay(value, now or datetime.now(timezone.utc))
    except Exception:  # a broken mapping or a value that defeats the parsers: the policy's delay
        return None


def _header(headers: Any) -> str | None:
    if headers is None:
        return None
    value = headers.get("Retry-After")
    if value is None:
        value = next((v for name, v in headers.items() if isinstance(name, str) and name.lower() == HEADER), None)
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value.strip() if isinstance(value, str) else None


def _delay(value: str, now: datetime) -> timedelta | None:
    if _DELTA_SECONDS.fullmatch(value):
        digits = value.lstrip("0") or "0"
        if len(digits) > _MAX_DELTA_DIGITS:
            return conf.MAX_DELAY
        return _bounded(timedelta(seconds=int(digits)))
    when = parsedate_to_datetime(value)  # ValueError or TypeError for what is not a date
    if when.tzinfo is None:  # "-0000": UTC, by RFC 5322
        when = when.replace(tzinfo=timezone.utc)
    return _bounded(when - now)


def _bounded(delay: timedelta) -> timedelta | None:
    if delay <= timedelta(0):
        return None
    return min(delay, conf.MAX_DELAY)
