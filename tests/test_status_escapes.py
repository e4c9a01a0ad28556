"""``workhorse_status`` never writes a name's terminal escape sequences to the terminal: queues,
scopes, schedules and workers are names from code, settings and the database, shown escaped."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from django_workhorse import Idempotency, enqueue, enqueue_due_schedules, register
from django_workhorse.models import WorkerRecord

pytestmark = pytest.mark.django_db

TASK = "tests.status_escapes.tick"
# Clear the screen, set the window title (OSC ... BEL), a right-to-left override, a line break.
QUEUE = "mail\x1b[2J"
SCOPE = "orders\x1b]0;owned\x07"
SCHEDULE = "nightly\u202e\r"
HOST = "web-1\x1b[1A\x9b"


@register(TASK)
def tick(payload: Any) -> Any:
    return payload


def status(*argv: str) -> str:
    out = StringIO()
    call_command("workhorse_status", *argv, stdout=out)
    return out.getvalue()


@override_settings(WORKHORSE_SCHEDULES={SCHEDULE: {"task": TASK, "every": timedelta(hours=1)}})
def test_status_escapes_the_control_characters_of_every_name():
    enqueue(TASK, {}, queue=QUEUE, idempotency=Idempotency("k-1", scope=SCOPE))
    enqueue_due_schedules()
    now = timezone.now()
    WorkerRecord.objects.create(
        name="w\x1b[0m", host=HOST, pid=1, queues=[QUEUE], concurrency=1, started_at=now, heartbeat_at=now
    )

    text = status()

    assert all(char == "\n" or char.isprintable() for char in text), repr(text)
    for escaped in ("mail\\x1b[2J", "orders\\x1b]0;owned\\x07", "nightly\\u202e\\r", "web-1\\x1b[1A\\x9b", "w\\x1b[0m"):
        assert escaped in text, text
    report = json.loads(status("--json"))  # JSON escapes them itself, and keeps the names exact
    assert [row["queue"] for row in report["queues"]] == [QUEUE]
    assert [row["scope"] for row in report["scopes"]] == [SCOPE]
    assert [row["name"] for row in report["schedules"]] == [SCHEDULE]


def test_printable_leaves_printable_names_alone_and_escapes_only_what_a_terminal_acts_on():
    from django_workhorse.observability.log_fields import printable

    assert printable("billing-eu") == "billing-eu"
    assert printable("café\\x1b") == "café\\x1b"  # already printable: shown as it is
    assert printable("a\tb\x00c\x7fd\u2028") == "a\\tb\\x00c\\x7fd\\u2028"
    assert printable(12) == "12"
