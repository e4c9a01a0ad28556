"""The bounds checks that admission's value objects share (``Breaker``, ``RateLimit``): one rule
each, raising the error class the caller names, with the field and the bound."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django_workhorse.enqueueing.storable import BoundError


def check_integer(value: Any, field: str, low: int, high: int, error: BoundError) -> None:
    """Raise ``error`` unless ``value`` is an int (not a bool) in ``low..high``."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise error(field=field, bound=f"an integer in {low}..{high}", value=value)


def check_duration(value: Any, field: str, low: timedelta, high: timedelta, error: BoundError) -> None:
    """Raise ``error`` unless ``value`` is a timedelta in ``low..high``."""
    if not isinstance(value, timedelta) or not low <= value <= high:
        raise error(field=field, bound=f"a timedelta in {low}..{high}", value=value)


def check_boolean(value: Any, field: str, error: BoundError) -> None:
    """Raise ``error`` unless ``value`` is True or False."""
    if not isinstance(value, bool):
        raise error(field=field, bound="True or False", value=value)
