"""Argument types shared by the management commands: each raises ``ArgumentTypeError`` naming its bound."""

from __future__ import annotations

import argparse

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
