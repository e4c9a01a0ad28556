"""Write the outcomes of finished attempts: all in one statement, else one by one, so that an
outcome PostgreSQL refuses fails only its own job.

Every write is fenced by the job's lease, so writing again an outcome that did commit changes
nothing; an outcome that cannot be written at all is left unrecorded, and its lease lapses.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import connections

from django_workhorse.observability.log_fields import job_fields
from django_workhorse.worker.execution import Outcome, record, unwritable

logger = logging.getLogger(__name__)


def write_outcomes(alias: str, outcomes: Sequence[Outcome]) -> list[str]:
    """Write ``outcomes``; return each one's status (``unrecorded`` when nothing could be written)."""
    try:
        return record(alias, outcomes)
    except Exception:
        # A persistent connection may have died while idle, or PostgreSQL refused one outcome:
        # write them one by one (on a fresh connection), so only the guilty job is affected.
        logger.exception("Recording outcomes failed count=%s; recording them one by one", len(outcomes))
        close_connection(alias)
    return [_write_one(alias, outcome) for outcome in outcomes]


def _write_one(alias: str, outcome: Outcome) -> str:
    try:
        return record(alias, [outcome])[0]
    except Exception as exc:
        logger.exception(
            "Recording the outcome failed id=%s; recording a failure instead",
            outcome.job.id,
            extra=job_fields(outcome.job),
        )
        close_connection(alias)
        replacement = unwritable(outcome, exc)
    try:
        return record(alias, [replacement])[0]
    except Exception:
        # Not even a failure can be written: stop holding the job, so its lease lapses and a
        # worker reclaims it (dead with "lease expired" if that was its last attempt).
        logger.exception(
            "Recording a failure failed too id=%s; its lease will lapse", outcome.job.id, extra=job_fields(outcome.job)
        )
        close_connection(alias)
        return "unrecorded"


def close_connection(alias: str) -> None:
    """Close ``alias``'s connection after an error, so the next statement opens a fresh one."""
    try:
        connections[alias].close()
    except Exception:
        logger.exception("Closing a broken connection failed")
