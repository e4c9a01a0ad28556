"""The fields a log record about one job carries as ``extra``, for JSON log formatters, how a
record names many jobs (``job_ids``: the first few and a count), and how text from the database is
shown on a terminal or in a log line (``printable``).

Every worker and enqueue record about a job has ``job_id``, ``job_type``, ``queue`` and
``attempt`` (0 for an enqueue) as attributes of the ``LogRecord``, besides its message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_workhorse.sql.claims import ClaimedJob


def job_fields(job: ClaimedJob) -> dict[str, Any]:
    """The ``extra`` of a record about a claimed job's attempt."""
    return {"job_id": job.id, "job_type": job.job_type, "queue": job.queue, "attempt": job.attempt}


def enqueued_fields(job_id: int, job_type: str, queue: str) -> dict[str, Any]:
    """The ``extra`` of a record about an enqueue (no attempt has run: 0)."""
    return {"job_id": job_id, "job_type": job_type, "queue": queue, "attempt": 0}


# How many new jobs' ids an evaluation's line names; the rest are counted.
SHOWN_JOB_IDS = 10


def job_ids(ids: list[int]) -> str:
    """Return ": 1, 2, 3" for a few job ids, ": 1, 2, ..., 10 and 1,491 more" for many ("" for none)."""
    if not ids:
        return ""
    shown = ", ".join(map(str, ids[:SHOWN_JOB_IDS]))
    rest = len(ids) - SHOWN_JOB_IDS
    return f": {shown}" if rest <= 0 else f": {shown} and {rest:,} more"


def printable(value: object) -> str:
    """Return ``str(value)`` with each character a terminal would act on, or that does not show
    (control characters, ESC, DEL, C1, bidi overrides, line separators), as its Python escape:
    ``"a\x1b[2Jb"`` prints as ``a\x1b[2Jb``."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
