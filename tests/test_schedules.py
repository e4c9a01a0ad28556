"""Schedules, the pure core: the definition's bounds, tick instants (epoch, cron, DST) and catch-up."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from itertools import pairwise

import pytest

from django_workhorse import conf
from django_workhorse.exceptions import InvalidArgumentError, ScheduleDefinitionError
from django_workhorse.schedules.definition import (
    TICK_KEY_SCOPE,
    Schedule,
    due_ticks,
    horizon,
    tick_key,
    tick_key_ttl,
    ticks,
)

UTC = timezone.utc


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def hhmm(instants: list[datetime]) -> list[str]:
    return [instant.strftime("%m-%dT%H:%M") for instant in instants]


# --- the definition ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"every": timedelta(seconds=1)},
        {"every": timedelta(days=365)},
        {"cron": "*/5 * * * *", "timezone": "Europe/Paris"},
        {"cron": "0 0 * * * *"},
        {"every": timedelta(minutes=1), "catch_up": "all", "overlap": "skip"},
        {"every": timedelta(minutes=1), "catch_up": "skip"},
        {"every": timedelta(minutes=1), "priority": 0, "queue": "q" * 100, "name": "n" * 200},
        {"every": timedelta(minutes=1), "priority": 100, "name": "é" * 200},
        {"every": timedelta(minutes=1), "args": (1, "a"), "kwargs": {"region": "eu"}},
    ],
    ids=repr,
)
def test_schedule_accepts_values_at_their_bounds(kwargs):
    schedule = Schedule(**kwargs)
    assert schedule.catch_up == kwargs.get("catch_up", "latest")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "cron/every"),
        ({"cron": "* * * * *", "every": timedelta(minutes=1)}, "cron/every"),
        ({"every": timedelta(seconds=1) - timedelta(microseconds=1)}, "every"),
        ({"every": timedelta(days=365, microseconds=1)}, "every"),
        ({"every": 60}, "every"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * *"}, "cron"),
        ({"cron": 5}, "cron"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"cron": "* * * * *", "timezone": "../etc/passwd"}, "timezone"),
        ({"cron": "* * * * *", "timezone": ""}, "timezone"),
        ({"every": timedelta(minutes=1), "catch_up": "none"}, "catch_up"),
        ({"every": timedelta(minutes=1), "overlap": "queue"}, "overlap"),
        ({"every": timedelta(minutes=1), "priority": -1}, "priority"),
        ({"every": timedelta(minutes=1), "priority": 101}, "priority"),
        ({"every": timedelta(minutes=1), "priority": True}, "priority"),
        ({"every": timedelta(minutes=1), "queue": "q" * 101}, "queue"),
        ({"every": timedelta(minutes=1), "queue": ""}, "queue"),
        ({"every": timedelta(minutes=1), "queue": "a\x00b"}, "queue"),
        ({"every": timedelta(minutes=1), "name": "n" * 201}, "name"),
        ({"every": timedelta(minutes=1), "name": "😀" * 101}, "name"),
        ({"every": timedelta(minutes=1), "name": ""}, "name"),
        ({"every": timedelta(minutes=1), "args": [1]}, "args"),
        ({"every": timedelta(minutes=1), "kwargs": {1: "a"}}, "kwargs"),
    ],
    ids=repr,
)
def test_schedule_rejects_values_out_of_bounds_naming_the_field(kwargs, field):
    with pytest.raises(ScheduleDefinitionError) as caught:
        Schedule(**kwargs)
    assert caught.value.field == field
    assert caught.value.bound
    assert isinstance(caught.value, InvalidArgumentError)


def test_schedule_is_frozen():
    schedule = Schedule(every=timedelta(minutes=1))
    with pytest.raises(AttributeError):
        schedule.every = timedelta(minutes=2)  # type: ignore[misc]


def test_schedule_error_is_exported_by_the_package():
    import django_workhorse

    assert django_workhorse.ScheduleDefinitionError is ScheduleDefinitionError
    assert "ScheduleDefinitionError" in django_workhorse.__all__


# --- ticks ---------------------------------------------------------------------------------------


def test_every_ticks_are_aligned_to_the_unix_epoch():
    schedule = Schedule(every=timedelta(minutes=7))
    found = ticks(schedule, utc(2026, 5, 1, 12, 0, 1), utc(2026, 5, 1, 12, 30), limit=100)
    assert found
    assert all(int(tick.timestamp()) % 420 == 0 for tick in found)
    assert [b - a for a, b in pairwise(found)] == [timedelta(minutes=7)] * (len(found) - 1)
    assert all(tick.tzinfo is UTC for tick in found)


def test_every_ticks_are_the_same_whatever_the_window_start():
    schedule = Schedule(every=timedelta(minutes=5))
    until = utc(2026, 5, 1, 13)
    one = ticks(schedule, utc(2026, 5, 1, 12, 0, 0, 1), until, limit=100)
    other = ticks(schedule, utc(2026, 5, 1, 12, 7, 17), until, limit=100)
    assert one[1:] == other
    assert hhmm(one[:2]) == ["05-01T12:05", "05-01T12:10"]


def test_ticks_window_is_open_at_after_and_closed_at_until():
    schedule = Schedule(every=timedelta(minutes=1))
    assert ticks(schedule, utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 2), limit=10) == [
        utc(2026, 1, 1, 0, 1),
        utc(2026, 1, 1, 0, 2),
    ]
    cron = Schedule("* * * * *")
    assert ticks(cron, utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 2), limit=10) == [
        utc(2026, 1, 1, 0, 1),
        utc(2026, 1, 1, 0, 2),
    ]


def test_ticks_keeps_the_newest_limit_in_order():
    for schedule in (Schedule(every=timedelta(minutes=1)), Schedule("* * * * *")):
        found = ticks(schedule, utc(2026, 1, 1), utc(2026, 1, 1, 1), limit=3)
        assert hhmm(found) == ["01-01T00:58", "01-01T00:59", "01-01T01:00"]


def test_ticks_of_an_empty_or_reversed_window_are_none():
    schedule = Schedule(every=timedelta(seconds=1))
    assert ticks(schedule, utc(2026, 1, 1), utc(2026, 1, 1), limit=5) == []
    assert ticks(schedule, utc(2026, 1, 2), utc(2026, 1, 1), limit=5) == []


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
def test_ticks_rejects_a_bad_limit(limit):
    with pytest.raises(ValueError, match="limit"):
        ticks(Schedule("* * * * *"), utc(2026, 1, 1), utc(2026, 1, 2), limit=limit)


def test_ticks_rejects_naive_datetimes():
    with pytest.raises(InvalidArgumentError) as caught:
        ticks(Schedule("* * * * *"), datetime(2026, 1, 1), utc(2026, 1, 2), limit=1)
    assert caught.value.field == "after"


def test_cron_ticks_in_utc():
    schedule = Schedule("0 3 * * *")
    found = ticks(schedule, utc(2026, 1, 1), utc(2026, 1, 4), limit=10)
    assert found == [utc(2026, 1, 1, 3), utc(2026, 1, 2, 3), utc(2026, 1, 3, 3)]


def test_cron_ticks_in_a_zone_are_local_times():
    schedule = Schedule("0 3 * * *", timezone="Europe/Paris")
    winter = ticks(schedule, utc(2026, 1, 1), utc(2026, 1, 2), limit=10)
    summer = ticks(schedule, utc(2026, 7, 1), utc(2026, 7, 2), limit=10)
    assert winter == [utc(2026, 1, 1, 2)]  # 03:00 CET
    assert summer == [utc(2026, 7, 1, 1)]  # 03:00 CEST


# DST in 2026: New York springs forward 2026-03-08 02:00 EST -> 03:00 EDT (07:00 UTC) and falls back
# 2026-11-01 02:00 EDT -> 01:00 EST (06:00 UTC); Paris springs forward 2026-03-29 02:00 -> 03:00
# (01:00 UTC) and falls back 2026-10-25 03:00 -> 02:00 (01:00 UTC).
DST_FIXED_TIME = [
    # zone, expression, window start (UTC), the three ticks from it (UTC)
    ("America/New_York", "30 2 * * *", utc(2026, 3, 7), ["03-07T07:30", "03-08T07:00", "03-09T06:30"]),
    ("America/New_York", "30 1 * * *", utc(2026, 10, 31), ["10-31T05:30", "11-01T05:30", "11-02T06:30"]),
    ("Europe/Paris", "30 2 * * *", utc(2026, 3, 28), ["03-28T01:30", "03-29T01:00", "03-30T00:30"]),
    ("Europe/Paris", "30 2 * * *", utc(2026, 10, 24), ["10-24T00:30", "10-25T00:30", "10-26T01:30"]),
]


@pytest.mark.parametrize(("zone", "expression", "start", "expected"), DST_FIXED_TIME, ids=repr)
def test_fixed_time_cron_runs_once_across_dst(zone, expression, start, expected):
    """A skipped local time runs once right at the change; a repeated one once, at its first occurrence."""
    schedule = Schedule(expression, timezone=zone)
    assert hhmm(ticks(schedule, start, start + timedelta(days=3), limit=100)) == expected


@pytest.mark.parametrize(
    ("zone", "expression", "inside"),
    [
        # Windows that lie wholly in the second occurrence of the repeated hour: no tick.
        ("America/New_York", "30 1 * * *", (utc(2026, 11, 1, 6, 15), utc(2026, 11, 1, 6, 45))),
        ("America/New_York", "30 1 * * *", (utc(2026, 11, 1, 6, 0), utc(2026, 11, 1, 7, 0))),
        ("Europe/Paris", "30 2 * * *", (utc(2026, 10, 25, 1, 15), utc(2026, 10, 25, 1, 45))),
    ],
    ids=repr,
)
def test_fixed_time_cron_does_not_rerun_when_evaluated_inside_the_repeated_hour(zone, expression, inside):
    """cronsim started at 01:15 EST returns 01:30 EDT, before the start; the window must hold."""
    assert ticks(Schedule(expression, timezone=zone), *inside, limit=100) == []


def test_fixed_time_cron_across_dst_is_the_same_in_small_windows():
    """Evaluating every minute across both changes makes the same ticks as one evaluation."""
    for zone, expression, start, expected in DST_FIXED_TIME:
        schedule = Schedule(expression, timezone=zone)
        found: list[datetime] = []
        for minute in range(3 * 24 * 60):
            after = start + timedelta(minutes=minute)
            found.extend(ticks(schedule, after, after + timedelta(minutes=1), limit=100))
        assert hhmm(found) == expected, (zone, expression)


@pytest.mark.parametrize(
    ("zone", "day_start", "day_end", "hours"),
    [
        ("America/New_York", utc(2026, 3, 8, 5), utc(2026, 3, 9, 4), 23),
        ("America/New_York", utc(2026, 11, 1, 4), utc(2026, 11, 2, 5), 25),
        ("Europe/Paris", utc(2026, 3, 28, 23), utc(2026, 3, 29, 22), 23),
        ("Europe/Paris", utc(2026, 10, 24, 22), utc(2026, 10, 25, 23), 25),
    ],
    ids=repr,
)
def test_hourly_cron_follows_real_hours_across_dst(zone, day_start, day_end, hours):
    """On a 23-hour day an hourly schedule runs 23 times, on a 25-hour day 25 times, one real hour apart."""
    found = ticks(
        Schedule("0 * * * *", timezone=zone),
        day_start - timedelta(seconds=1),
        day_end - timedelta(seconds=1),
        limit=100,
    )
    assert len(found) == hours
    assert {b - a for a, b in pairwise(found)} == {timedelta(hours=1)}


# --- due ticks -----------------------------------------------------------------------------------

MINUTELY = timedelta(minutes=1)
NOW = utc(2026, 6, 1, 12, 0, 30)


def test_first_evaluation_has_no_due_ticks():
    for policy in ("latest", "all", "skip"):
        assert due_ticks(Schedule(every=MINUTELY, catch_up=policy), None, NOW, max_catch_up=100) == []


@pytest.mark.parametrize(("missed", "expected"), [(1, 1), (100, 100), (101, 100), (500, 100)])
def test_catch_up_all_runs_each_missed_tick_up_to_max_catch_up(missed, expected):
    schedule = Schedule(every=MINUTELY, catch_up="all")
    previous = utc(2026, 6, 1, 12, 0) - missed * MINUTELY  # exactly `missed` ticks in (previous, now]
    due = due_ticks(schedule, previous, NOW, max_catch_up=100)
    assert len(due) == expected
    assert due[-1] == utc(2026, 6, 1, 12, 0)
    assert due[0] == utc(2026, 6, 1, 12, 0) - (expected - 1) * MINUTELY


def test_catch_up_all_respects_a_max_catch_up_of_one():
    schedule = Schedule(every=MINUTELY, catch_up="all")
    assert due_ticks(schedule, NOW - timedelta(hours=1), NOW, max_catch_up=1) == [utc(2026, 6, 1, 12, 0)]


def test_catch_up_latest_runs_only_the_newest_tick():
    schedule = Schedule(every=MINUTELY, catch_up="latest")
    assert due_ticks(schedule, NOW - timedelta(hours=5), NOW, max_catch_up=100) == [utc(2026, 6, 1, 12, 0)]
    assert due_ticks(schedule, utc(2026, 6, 1, 12, 0), NOW, max_catch_up=100) == []


@pytest.mark.parametrize(
    ("age", "runs"), [(timedelta(seconds=60), True), (timedelta(seconds=60, microseconds=1), False)]
)
def test_catch_up_skip_runs_the_newest_tick_only_within_60_seconds(age, runs):
    schedule = Schedule(every=timedelta(hours=1), catch_up="skip")
    now = utc(2026, 6, 1, 12) + age
    due = due_ticks(schedule, now - timedelta(hours=3), now, max_catch_up=100)
    assert due == ([utc(2026, 6, 1, 12)] if runs else [])


def test_no_tick_older_than_the_horizon_is_due_and_every_key_outlives_it():
    """A tick's key outlives every evaluation that can find it due."""
    schedule = Schedule(every=timedelta(days=1), catch_up="all")
    now = utc(2026, 6, 1)
    reach = horizon(schedule, 10_000)
    due = due_ticks(schedule, now - timedelta(days=1000), now, max_catch_up=10_000)
    assert due and min(due) >= now - reach
    assert tick_key_ttl(reach) > reach
    assert tick_key_ttl(reach) <= conf.MAX_KEY_TTL


@pytest.mark.parametrize(
    ("schedule", "max_catch_up", "expected"),
    [
        (Schedule(every=timedelta(seconds=1)), 100, timedelta(hours=1)),  # at least an hour
        (Schedule(every=timedelta(minutes=1)), 100, timedelta(minutes=100)),
        (Schedule("0 3 * * *", timezone="Europe/Paris"), 100, timedelta(days=100)),
        (Schedule("0 3 * * 1-5"), 10, timedelta(days=30)),  # the weekend is the longest gap
        (Schedule("0 0 29 2 *"), 1, timedelta(days=365) - timedelta(hours=1)),  # at most a year
    ],
)
def test_the_horizon_is_max_catch_up_periods_within_its_bounds(schedule, max_catch_up, expected):
    assert horizon(schedule, max_catch_up) == expected


def test_due_ticks_of_overlapping_windows_are_the_same_ticks():
    schedule = Schedule("*/5 * * * *", catch_up="all")
    a = due_ticks(schedule, utc(2026, 6, 1, 11), utc(2026, 6, 1, 12), max_catch_up=100)
    b = due_ticks(schedule, utc(2026, 6, 1, 11, 30), utc(2026, 6, 1, 12, 10), max_catch_up=100)
    overlap = set(a) & set(b)
    assert overlap == {tick for tick in a if tick > utc(2026, 6, 1, 11, 30)}
    assert len(overlap) == 6


# --- tick keys -----------------------------------------------------------------------------------


def test_tick_key_is_stable_and_in_utc():
    paris = utc(2026, 6, 1, 1).astimezone(Schedule("0 3 * * *", timezone="Europe/Paris").zone)
    assert tick_key("nightly", utc(2026, 6, 1, 1)) == "nightly@2026-06-01T01:00:00.000000+00:00"
    assert tick_key("nightly", paris) == tick_key("nightly", utc(2026, 6, 1, 1))


def test_tick_key_is_distinct_per_tick_and_schedule():
    keys = {tick_key(name, utc(2026, 6, 1, 1, 0, second)) for name in ("a", "b", "a@") for second in (0, 1)}
    assert len(keys) == 6


def test_tick_key_of_the_longest_name_fits_the_key_bound():
    for name in ("n" * 200, "é" * 200):
        key = tick_key(name, datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC))
        assert len(key.encode()) <= conf.MAX_KEY_BYTES
    assert len(TICK_KEY_SCOPE.encode()) <= conf.MAX_SCOPE_BYTES


def test_tick_key_rejects_a_bad_name():
    with pytest.raises(ScheduleDefinitionError) as caught:
        tick_key("n" * 201, utc(2026, 1, 1))
    assert caught.value.field == "name"
