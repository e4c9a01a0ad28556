"""Cron ticks across every 2026 UTC-offset change of every zone, against an independent oracle.

The oracle walks UTC minute by minute over a window around each change, reads each minute's local
wall time with ``zoneinfo`` and lists the instants that run, by the documented rule:

- a schedule whose minute or hour field starts with ``*`` follows real time: every instant whose
  wall time matches runs (a repeated wall time twice, a skipped one never);
- any other (fixed-time) schedule runs a matching wall time once, at its first occurrence, and a
  matching wall time skipped by a change right at the change.
"""

from __future__ import annotations

import zoneinfo
from datetime import datetime, timedelta, timezone
from functools import cache

import pytest

from django_workhorse.schedules.definition import Schedule, next_tick, ticks

UTC = timezone.utc
MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)
# The oracle compares ticks in (change - REACH, change + REACH]; it starts walking LOOKBACK earlier
# so that a first occurrence is told from a repeat.
REACH = timedelta(hours=3)
LOOKBACK = timedelta(hours=3)
NOT_IANA = {"localtime", "Factory", "posixrules"}

REAL_TIME = ["* * * * *", "*/15 * * * *", "30 * * * *", "45 * * * *", "0 * * * *", "15 */2 * * *", "*/10 2 * * *"]
FIXED_TIME = ["30 2 * * *", "0 2 * * *", "30 1 * * *", "45 1 * * *", "0 0 * * *", "59 23 * * *", "0,30 2,3 * * *"]


def offset_at(zone: zoneinfo.ZoneInfo, instant: datetime) -> timedelta | None:
    return instant.astimezone(zone).utcoffset()


@cache
def changes_2026() -> list[tuple[str, datetime]]:
    """Each (zone, first instant of a new UTC offset) in 2026: day by day, then to the minute."""
    found = []
    for name in sorted(zoneinfo.available_timezones() - NOT_IANA):
        zone = zoneinfo.ZoneInfo(name)
        day = datetime(2026, 1, 1, tzinfo=UTC)
        while day < datetime(2027, 1, 1, tzinfo=UTC):
            if offset_at(zone, day) != offset_at(zone, day + DAY):
                low, high = day, day + DAY
                while high - low > MINUTE:
                    middle = low + (high - low) // 2 // MINUTE * MINUTE
                    low, high = (middle, high) if offset_at(zone, middle) == offset_at(zone, low) else (low, middle)
                found.append((name, high))
            day += DAY
    return found


def field_values(text: str, top: int) -> frozenset[int]:
    """The values a minute or hour field (``*``, ``*/n``, ``n``, and lists of them) allows."""
    values: set[int] = set()
    for part in text.split(","):
        step = int(part[2:]) if part.startswith("*/") else 1
        values.update(range(0, top, step) if part.startswith("*") else {int(part)})
    return frozenset(values)


@cache
def walk(name: str, change: datetime) -> tuple[datetime, ...]:
    """The local wall time of each UTC minute from change - REACH - LOOKBACK to change + REACH."""
    zone = zoneinfo.ZoneInfo(name)
    first = change - REACH - LOOKBACK
    count = (REACH + LOOKBACK + REACH) // MINUTE
    return tuple((first + k * MINUTE).astimezone(zone).replace(tzinfo=None) for k in range(count + 1))


@cache
def oracle(expression: str, change: datetime, walls: tuple[datetime, ...]) -> list[datetime]:
    """The ticks in (change - REACH, change + REACH], minute by minute over the walk's wall times."""
    minute, hour, *_ = expression.split()
    real_time = minute.startswith("*") or hour.startswith("*")
    minutes, hours = field_values(minute, 60), field_values(hour, 24)

    def matches(wall: datetime) -> bool:
        return wall.minute in minutes and wall.hour in hours

    found: list[datetime] = []
    seen = {walls[0]}
    first = change - REACH - LOOKBACK
    for k in range(1, len(walls)):
        previous, wall = walls[k - 1], walls[k]
        runs = matches(wall) and (real_time or wall not in seen)
        if not real_time and wall - previous > MINUTE:
            skipped = (previous + j * MINUTE for j in range(1, (wall - previous) // MINUTE))
            runs = runs or any(matches(gap) for gap in skipped)  # right at the change
        instant = first + k * MINUTE
        if runs and instant > change - REACH:
            found.append(instant)
        seen.add(wall)
    return found


def expected_ticks(expression: str, name: str, change: datetime) -> list[datetime]:
    return oracle(expression, change, walk(name, change))


def window_ticks(expression: str, name: str, change: datetime) -> list[datetime]:
    return ticks(Schedule(expression, timezone=name), change - REACH, change + REACH, limit=10_000)


def around(name: str, change: datetime) -> list[str]:
    """Daily schedules at wall times on both sides of, and inside, the change's gap or repeat."""
    zone = zoneinfo.ZoneInfo(name)
    shown = {change + offset_at(zone, change - MINUTE), change + offset_at(zone, change)}  # old and new offset
    walls = {base + minutes * MINUTE for base in shown for minutes in (-61, -30, -15, -1, 0, 1, 15, 29, 30, 59, 89)}
    return [f"{wall.minute} {wall.hour} * * *" for wall in sorted(walls)]


def test_cron_ticks_match_the_oracle_at_every_2026_change_of_every_zone():
    names = {name for name, _ in changes_2026()}
    assert {"Australia/Lord_Howe", "Antarctica/Troll", "America/St_Johns", "Europe/Paris"} <= names
    wrong = []
    for name, change in changes_2026():
        for expression in REAL_TIME + FIXED_TIME + around(name, change):
            expected = expected_ticks(expression, name, change)
            found = window_ticks(expression, name, change)
            if found != expected:
                wrong.append((name, change.isoformat(), expression, [t.isoformat() for t in found], expected))
    assert wrong == []


def test_next_tick_from_any_minute_around_every_2026_change_is_the_oracles():
    """Evaluation may start anywhere, also inside a repeated hour: the next tick is the oracle's."""
    wrong = []
    for name, change in changes_2026():
        for expression in ("30 * * * *", "45 * * * *", "*/15 * * * *", "30 1 * * *", "30 2 * * *"):
            expected = expected_ticks(expression, name, change)
            schedule = Schedule(expression, timezone=name)
            after = change - REACH
            while expected and after < expected[-1]:
                want = next(t for t in expected if t > after)
                if next_tick(schedule, after) != want:
                    wrong.append((name, expression, after.isoformat(), want.isoformat()))
                after += 7 * MINUTE
    assert wrong == []


@pytest.mark.parametrize(
    ("expression", "change", "expected"),
    [
        # Lord Howe springs forward 2026-10-04 02:00 LHST (+10:30) -> 02:30 LHDT (+11) at 15:30 UTC.
        (
            "30 * * * *",
            datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
            ["13:00", "14:00", "15:00", "15:30", "16:30", "17:30", "18:30"],
        ),
        (
            "45 * * * *",
            datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
            ["13:15", "14:15", "15:15", "15:45", "16:45", "17:45"],
        ),
        # It falls back 2026-04-05 02:00 LHDT -> 01:30 LHST at 15:00 UTC: 01:30-01:59 happen twice.
        (
            "30 * * * *",
            datetime(2026, 4, 4, 15, 0, tzinfo=UTC),
            ["12:30", "13:30", "14:30", "15:00", "16:00", "17:00", "18:00"],
        ),
        ("45 * * * *", datetime(2026, 4, 4, 15, 0, tzinfo=UTC), ["12:45", "13:45", "14:45", "15:15", "16:15", "17:15"]),
    ],
    ids=repr,
)
def test_half_hour_dst_keeps_every_real_hour_in_lord_howe(expression, change, expected):
    found = window_ticks(expression, "Australia/Lord_Howe", change)
    assert [t.strftime("%H:%M") for t in found] == expected
