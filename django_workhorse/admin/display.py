"""How the admin shows stored values: JSON pretty-printed and cut, errors summed up, event details, job links,
instants (one format, to the second, in UTC), long text cut to a cell, retry policies in words.

The lists fit a laptop's window with the admin's side bar open: a long value is cut to its cell
(``cut``, its whole text on hover), and instants read ``2024-06-11 14:03:22``, which wraps between
date and time when the column is narrow.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.contrib import admin
from django.core.serializers.json import DjangoJSONEncoder
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from django_workhorse.encryption import described_head
from django_workhorse.encryption.jobs import is_sealed_text
from django_workhorse.models import Job
from django_workhorse.tasks.retry import RetryPolicy

# Payloads and results are shown pretty-printed up to this many characters, then cut.
JSON_DISPLAY_CHARS = 20_000
# A job's checkpoints are shown pretty-printed up to this many characters each.
CHECKPOINT_DISPLAY_CHARS = 2000
ERROR_SUMMARY_CHARS = 120
# One format for every instant the admin shows: to the second, in UTC.
INSTANT_FORMAT = "%Y-%m-%d %H:%M:%S"
# A cut cell's text is cut here too, so a huge value never reaches the page (its hover text included).
CUT_CHARS = 500
# Event details are shown cut to this many characters each.
EVENT_DETAIL_CHARS = 2000


def pretty_json(value: Any, limit: int = JSON_DISPLAY_CHARS) -> str:
    """Return ``value`` as indented JSON, cut after ``limit`` characters (templates escape it)."""
    try:
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)
    except RecursionError:  # indenting recurses in Python; compact encoding nests deeper
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… ({len(text) - limit:,} more characters not shown)"


def error_summary(error: str) -> str:
    """The first line of an error, cut to a table cell."""
    first = next((line for line in error.splitlines() if line.strip()), "")
    return Truncator(first).chars(ERROR_SUMMARY_CHARS)


def error_head(job: Job) -> str:
    """The start of a job's error as a list loaded it (``error_head``), else the whole error; an
    encrypted job's sealed error described ("encrypted (N bytes, key K)"), to every user."""
    head = getattr(job, "error_head", None)
    error = job.last_error if head is None else str(head)
    if job.cipher_salt is None or not is_sealed_text(error):
        return error
    return described_head(error, getattr(job, "error_chars", None) or len(error))


def event_details(details: Any) -> list[tuple[str, str]]:
    """An event's details as (name, value) text, each value cut; any stored JSON is shown."""
    if not isinstance(details, dict):
        return [("", Truncator(pretty_json(details, EVENT_DETAIL_CHARS)).chars(EVENT_DETAIL_CHARS))]
    return [
        (Truncator(str(name)).chars(EVENT_DETAIL_CHARS), Truncator(str(value)).chars(EVENT_DETAIL_CHARS))
        for name, value in details.items()
    ]


def job_anchor(job_id: int) -> SafeString:
    """A link ``#<id>`` to a job's page."""
    return format_html('<a href="{}">#{}</a>', reverse("admin:workhorse_job_change", args=[job_id]), job_id)


def instant(value: datetime | None) -> str:
    """``value`` in UTC, to the second (``2024-06-11 14:03:22``); ``—`` for none."""
    return "—" if value is None else f"{value.astimezone(dt_timezone.utc):{INSTANT_FORMAT}}"


def instant_cell(value: datetime | None) -> SafeString | str:
    """An instant for a list's cell: ``instant`` in a ``<time>``, labelled UTC on hover."""
    if value is None:
        return "—"
    text = instant(value)
    day, time = text.split(" ")
    return format_html(
        '<time datetime="{}T{}Z" title="{} UTC"><span>{}</span> <span>{}</span></time>', day, time, text, day, time
    )


def instant_field(field: str, description: str) -> Any:
    """A read-only field for a detail page: the instant in ``field``, ``instant`` and "UTC"."""

    @admin.display(description=description, ordering=field)
    def show(model_admin: Any, obj: Any) -> str:
        value = getattr(obj, field)
        return "—" if value is None else f"{instant(value)} UTC"

    return show


def cut(text: str, *, width: str = "") -> SafeString:
    """``text`` cut to its cell with an ellipsis, the whole of it on hover (CSS does the cutting:
    ``workhorse-cut``, and a ``width`` class of the list style such as ``narrow`` or ``wide``)."""
    shown = Truncator(text).chars(CUT_CHARS)
    classes = f"workhorse-cut {width}".strip()
    return format_html('<span class="{}" title="{}">{}</span>', classes, shown, shown)


def stacked(main: SafeString | str, under: SafeString | str) -> SafeString:
    """Two values in one cell: ``main``, and ``under`` below it in the quiet colour."""
    return format_html('{}<br><span class="workhorse-under">{}</span>', main, under)


def error_line(error: str) -> SafeString | str:
    """A list's cell for an error: its first line cut to the cell, the whole line on hover."""
    first = next((line.strip() for line in error.splitlines() if line.strip()), "")
    return cut(first, width="wide") if first else "—"


def duration_words(value: timedelta) -> str:
    """A delay as an operator says it: ``500 ms``, ``1 s``, ``1.5 min``, ``1 h``, ``2 d``."""
    seconds = value.total_seconds()
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size:
            return f"{seconds / size:.4g} {unit}"
    return f"{seconds * 1000:.4g} ms"


def retry_policy_words(stored: Any) -> str:
    """A job's stored retry policy in words, such as "exponential backoff from 1 s, ×2, up to 1 h,
    jitter up to 10 %"; the stored JSON as text if it is not a policy this code reads."""
    try:
        policy = RetryPolicy.from_json(stored)
    except (KeyError, TypeError, ValueError, OverflowError):
        return pretty_json(stored, EVENT_DETAIL_CHARS)
    jitter = f", jitter up to {policy.jitter * 100:.3g} %" if policy.jitter else ", no jitter"
    if policy.kind == "fixed":
        return f"fixed: {duration_words(policy.base)} between attempts{jitter}"
    return (
        f"exponential backoff from {duration_words(policy.base)}, ×{policy.factor:g}, "
        f"up to {duration_words(policy.max_delay)}{jitter}"
    )
