"""The dashboard with 10,000 schedules: it shows the soonest ticks across all of them and the counts,
and computes one first tick per schedule plus at most the ticks it shows (fewer on a refresh).

The rows are inserted by one SQL statement and declared in ``WORKHORSE_SCHEDULES``; the work is
counted by wrapping the tick functions ``schedule_overview`` calls, never timed.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_workhorse import conf, register
from django_workhorse.models import ScheduleState
from django_workhorse.schedules import overview as schedule_overview
from django_workhorse.schedules.definition import Schedule, next_tick, ticks
from tests.test_admin import DASHBOARD, VIEW_PERMS, body, login

pytestmark = pytest.mark.django_db

TASK = "tests.dashboard_many.tick"
MANY = 10_000
# Whole-second ticks: nothing ticks between T and T + 0.4 s.
T = datetime(2026, 6, 1, 12, 0, 0, 500_000, tzinfo=dt_timezone.utc)
SHORT = {
    "every-7m": {"task": TASK, "every": timedelta(minutes=7)},
    "every-11m": {"task": TASK, "every": timedelta(minutes=11)},
    "cron-5m-paris": {"task": TASK, "cron": "*/5 * * * *", "timezone": "Europe/Paris"},
    "paused-1m": {"task": TASK, "every": timedelta(minutes=1)},
    "inactive-1m": {"task": TASK, "every": timedelta(minutes=1)},
}
INSERT_MANY = """
INSERT INTO workhorse_schedule (name, task, definition, digest, active, paused, evaluated_until,
                                last_skip_reason, created_at, updated_at)
SELECT format('long-%%s', lpad(i::text, 5, '0')), %(task)s, '{}'::jsonb, repeat('0', 64), true, false,
       now(), '', now(), now()
FROM generate_series(0, %(count)s - 1) AS i
"""


@register(TASK)
def tick_handler(payload: Any) -> Any:
    return payload


def long_name(i: int) -> str:
    return f"long-{i:05}"


@pytest.fixture
def many(settings) -> dict[str, Schedule]:
    """10,000 schedules of distinct hourly-ish timings and five short ones (one paused, one inactive)."""
    declared = {long_name(i): {"task": TASK, "every": timedelta(seconds=3600 + 7 * i)} for i in range(MANY)}
    settings.WORKHORSE_SCHEDULES = {**declared, **SHORT}
    with connection.cursor() as cursor:
        cursor.execute(INSERT_MANY, {"task": TASK, "count": MANY})
    now = timezone.now()
    ScheduleState.objects.bulk_create(
        ScheduleState(
            name=name,
            task=TASK,
            definition={},
            digest="0" * 64,
            active=name != "inactive-1m",
            paused=name == "paused-1m",
            evaluated_until=now,
            created_at=now,
            updated_at=now,
        )
        for name in SHORT
    )
    showing = {long_name(i): Schedule(every=timedelta(seconds=3600 + 7 * i)) for i in range(MANY)}
    showing["every-7m"] = Schedule(every=timedelta(minutes=7))
    showing["every-11m"] = Schedule(every=timedelta(minutes=11))
    showing["cron-5m-paris"] = Schedule("*/5 * * * *", timezone="Europe/Paris")
    return showing  # the active, unpaused ones


def soonest(schedules: dict[str, Schedule], now: datetime, count: int) -> list[tuple[datetime, str]]:
    """The soonest ``count`` ticks of all the schedules, the long way: ``count`` ticks of each."""
    found = [
        (tick, name)
        for name, schedule in schedules.items()
        for tick in ticks(schedule, now, conf.MAX_STORED_DATETIME, limit=count, oldest=True)
    ]
    return sorted(found)[:count]


@pytest.fixture
def computed(monkeypatch) -> list[int]:
    """How many ticks ``schedule_overview`` computes, in a one-item list."""
    total = [0]

    def counting_ticks(*args: Any, **kwargs: Any) -> list[datetime]:
        found = ticks(*args, **kwargs)
        total[0] += len(found)
        return found

    def counting_next_tick(*args: Any, **kwargs: Any) -> datetime | None:
        total[0] += 1
        return next_tick(*args, **kwargs)

    monkeypatch.setattr(schedule_overview, "ticks", counting_ticks)
    monkeypatch.setattr(schedule_overview, "next_tick", counting_next_tick, raising=False)
    return total


def test_upcoming_ticks_with_many_schedules_computes_first_ticks_and_the_shown_ones_only(many, computed):
    limit = schedule_overview.UPCOMING_TICKS
    upcoming = schedule_overview.upcoming_ticks(now=T)

    assert [(tick.at, tick.schedule) for tick in upcoming] == soonest(many, T, limit)
    # One first tick per active, unpaused schedule declared here, then one more per tick shown.
    assert computed[0] <= len(many) + limit

    computed[0] = 0
    refreshed = schedule_overview.upcoming_ticks(now=T + timedelta(milliseconds=400))
    assert refreshed == upcoming
    assert computed[0] <= limit


def test_dashboard_with_many_schedules_shows_the_soonest_ticks_and_the_counts(client, django_user_model, many):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    response = client.get(DASHBOARD)

    assert response.status_code == 200
    page = body(response)
    section = page[page.index('id="workhorse-next-ticks"') :]
    shown = re.findall(r'<tr><td><span class="workhorse-cut wide" title="([^"]+)">', section)
    assert len(shown) == schedule_overview.UPCOMING_TICKS
    assert set(shown) <= set(many)
    assert "paused-1m" not in section and "inactive-1m" not in section
    total = MANY + len(SHORT)
    assert f"All schedules</a>: {total} ({total - 2} active, 1 paused, 1 inactive)" in section
