"""How the admin shows stored values: JSON pretty-printed and cut, errors summed up, event details, job links."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from django_workhorse.models import Job

# Payloads and results are shown pretty-printed up to this many characters, then cut.
JSON_DISPLAY_CHARS = 20_000
ERROR_SUMMARY_CHARS = 120
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
    """The start of a job's error as a list loaded it (``error_head``), else the whole error."""
    head = getattr(job, "error_head", None)
    return job.last_error if head is None else str(head)


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
