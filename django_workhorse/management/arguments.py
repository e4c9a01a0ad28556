"""Argument types shared by the management commands: each raises ``ArgumentTypeError`` naming its bound."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

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


def file_in_existing_folder(text: str) -> Path:
    """Parse a file path whose folder exists (the file itself may not yet)."""
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError("must be a file path, not a folder")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"its folder {str(path.parent)!r} does not exist")
    return path
