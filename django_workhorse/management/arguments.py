"""Argument types shared by the management commands: each raises ``ArgumentTypeError`` naming its bound."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from django_workhorse import conf


def job_id(text: str) -> int:
    """Parse a job id: a positive integer within PostgreSQL's bigint."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a job id (a positive integer)") from None
    if not 1 <= value <= conf.MAX_ID:
        raise argparse.ArgumentTypeError("must be a job id (a positive integer)")
    return value


def seconds(low: float, high: float) -> Callable[[str], float]:
    """Return a parser of a number of seconds within ``low..high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a number of seconds in {low:g}..{high:g}")
        return value

    return parse
