"""Schedules at their edges: which time zone keys are accepted, the bounds of ``every`` as the
checks word them, and cron ticks up to the last storable instant (year 9999)."""

from __future__ import annotations

from datetime import datetime, time, timedelta, timezone
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings

from django_workhorse import Schedule, conf, register
from django_workhorse.checks import check_schedules
from django_workhorse.exceptions import ScheduleDefinitionError
from django_workhorse.schedules.definition import next_tick, ticks

UTC = timezone.utc
TASK = "tests.schedule_bounds.tick"
# Names zoneinfo loads that are not IANA zones, or not the same zone on every host.
NOT_IANA_ZONES = ["localtime", "Factory", "posixrules", "posix/Europe/Paris", "right/Europe/Paris", "right/UTC"]
IANA_ZONES = ["UTC", "Australia/Lord_Howe", "Etc/GMT-14", "America/Argentina/Buenos_Aires"]
MICROSECOND = timedelta(microseconds=1)
EVERY_BOUND = "every must be a timedelta between 1 second and 365 days"


@register(TASK)
def tick(payload: Any) -> Any:
    return payload


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def problems(schedules: Any) -> list[tuple[str, str]]:
    with override_settings(WORKHORSE_SCHEDULES=schedules):
        return [(message.id, message.msg) for message in check_schedules()]


# --- time zones ----------------------------------------------------------------------------------


@pytest.mark.parametrize("zone", NOT_IANA_ZONES)
def test_schedule_refuses_a_zone_that_is_not_an_iana_key(zone):
    with pytest.raises(ScheduleDefinitionError) as caught:
        Schedule("0 3 * * *", timezone=zone)
    assert caught.value.field == "timezone"
    assert str(caught.value).startswith("timezone must be an IANA time zone key")


def test_settings_zones_are_e204_unless_iana_keys():
    entries = {zone: {"task": TASK, "cron": "0 3 * * *", "timezone": zone} for zone in NOT_IANA_ZONES + IANA_ZONES}
    found = problems(entries)
    assert [check_id for check_id, _ in found] == ["workhorse.E204"] * len(NOT_IANA_ZONES)
    for zone, (_, message) in zip(NOT_IANA_ZONES, found, strict=True):
        assert f"{zone!r}" in message and "timezone must be an IANA time zone key" in message


# --- every ---------------------------------------------------------------------------------------


def test_every_is_checked_at_its_exact_bounds_in_readable_words():
    for every in (conf.MIN_SCHEDULE_EVERY, conf.MAX_SCHEDULE_EVERY):
        assert Schedule(every=every).every == every
        assert problems({"s": {"task": TASK, "every": every}}) == []
    for every in (conf.MIN_SCHEDULE_EVERY - MICROSECOND, conf.MAX_SCHEDULE_EVERY + MICROSECOND):
        with pytest.raises(ScheduleDefinitionError, match=f"^{EVERY_BOUND}, got "):
            Schedule(every=every)
        [(check_id, message)] = problems({"s": {"task": TASK, "every": every}})
        assert check_id == "workhorse.E207" and EVERY_BOUND in message


# --- year 9999 -----------------------------------------------------------------------------------

# zone -> (cron, after, the next tick or None), all near the last storable instant.
YEAR_9999 = {
    "UTC": [
        ("0 23 * * *", utc(9999, 12, 31, 21, 30), utc(9999, 12, 31, 23)),
        ("0 23 * * *", utc(9999, 12, 31, 23), None),
        ("* * * * *", utc(9999, 12, 31, 23, 58, 30), utc(9999, 12, 31, 23, 59)),
        ("* * * * * *", utc(9999, 12, 31, 23, 59, 58), utc(9999, 12, 31, 23, 59, 59)),
    ],
    # UTC+9: 23:00 local on 9999-12-31 is 14:00 UTC; 10000-01-01 00:30 local is 15:30 UTC.
    "Asia/Tokyo": [
        ("0 23 * * *", utc(9999, 12, 31, 10), utc(9999, 12, 31, 14)),
        ("30 0 * * *", utc(9999, 12, 31, 14), utc(9999, 12, 31, 15, 30)),
        ("30 0 * * *", utc(9999, 12, 31, 15, 30), None),
        ("* * * * *", utc(9999, 12, 31, 21), utc(9999, 12, 31, 21, 1)),
    ],
    # UTC+14: 09:00 local on 10000-01-01 is 19:00 UTC on 9999-12-31.
    "Pacific/Kiritimati": [
        ("0 23 * * *", utc(9999, 12, 31, 8), utc(9999, 12, 31, 9)),
        ("0 9 * * *", utc(9999, 12, 31, 12), utc(9999, 12, 31, 19)),
        ("* * * * *", utc(9999, 12, 31, 23), utc(9999, 12, 31, 23, 1)),
    ],
    # UTC-5: 23:00 local on 9999-12-31 is in year 10000 UTC; 18:00 local is 23:00 UTC.
    "America/New_York": [
        ("0 23 * * *", utc(9999, 12, 30, 5), utc(9999, 12, 31, 4)),
        ("0 23 * * *", utc(9999, 12, 31, 4), None),
        ("0 18 * * *", utc(9999, 12, 31, 21, 30), utc(9999, 12, 31, 23)),
    ],
}


@pytest.mark.parametrize("zone", YEAR_9999)
def test_cron_ticks_reach_the_last_hours_of_year_9999(zone):
    for cron, after, expected in YEAR_9999[zone]:
        schedule = Schedule(cron, timezone=zone)
        assert next_tick(schedule, after) == expected, cron
        assert ticks(schedule, after, conf.MAX_STORED_DATETIME, limit=1, oldest=True) == [expected][: bool(expected)]


@pytest.mark.parametrize("zone", YEAR_9999)
def test_every_minute_runs_through_the_last_three_hours_of_year_9999(zone):
    schedule = Schedule("* * * * *", timezone=zone)
    expected = [utc(9999, 12, 31, 21) + timedelta(minutes=k) for k in range(180)]
    assert ticks(schedule, expected[0] - MICROSECOND, conf.MAX_STORED_DATETIME, limit=1000) == expected
    chained = [next_tick(schedule, expected[0] - MICROSECOND)]
    while chained[-1] is not None:
        chained.append(next_tick(schedule, chained[-1]))
    assert chained == [*expected, None]


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Tokyo"])
def test_daily_cron_ticks_from_year_1_and_through_the_millennia_are_local_midnights(zone):
    """Wall times before year 1 or after 9999 are computed 400 years away (see ``_FRAMES``): the
    ticks around the first storable instant and across years 1000 and 9000 are each local midnight."""
    schedule = Schedule("0 0 * * *", timezone=zone)
    for start in (conf.MIN_STORED_DATETIME, utc(999, 12, 29), utc(8999, 12, 29)):
        found = ticks(schedule, start, start + timedelta(days=6), limit=10, oldest=True)
        assert found[0] == next_tick(schedule, start)
        walls = [tick.astimezone(ZoneInfo(zone)) for tick in found]
        assert {wall.time() for wall in walls} == {time(0)}
        assert [b.date() - a.date() for a, b in pairwise(walls)] == [timedelta(days=1)] * (len(walls) - 1) != []


def test_a_tick_whose_local_time_is_past_year_9999_is_shown_in_utc():
    from django_workhorse.schedules.overview import local_time

    last = datetime(9999, 12, 31, 19, 0, tzinfo=timezone.utc)
    assert local_time(last, "Pacific/Kiritimati") == last  # 10000-01-01 09:00 there
    assert local_time(last, "UTC") == last
