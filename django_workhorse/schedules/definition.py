"""Periodic schedules, the pure core: the definition, its tick instants and which of them are due.

No database here: evaluation (the state of each schedule, the enqueue of its due ticks) builds on
these functions. Every host computes the same instants from the same definition:

- ``every`` ticks are the multiples of ``every`` since the Unix epoch (UTC);
- ``cron`` ticks are the instants whose wall time in the schedule's zone (an IANA key, see
  ``check_timezone``) matches the expression, which ``cronsim`` reads. Across a change of UTC
  offset, Debian cron's rule: a schedule with seconds, or whose minute or hour field starts with
  ``*``, follows real time (a repeated wall time runs twice, a skipped one not at all); any other
  runs a repeated wall time once, at its first occurrence, and a skipped one once, right at the
  change (``30 2 * * *`` in New York on 2026-03-08 runs at 03:00 EDT). Ticks reach the last
  storable instant (9999-12-31 UTC) in every zone.

A tick is enqueued idempotently under ``tick_key(name, tick)`` in ``TICK_KEY_SCOPE``, so any number
of evaluators make one job per tick.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cache
from typing import Any, Literal
from zoneinfo import ZoneInfo, available_timezones

from cronsim import CronSim, CronSimError

from django_workhorse import conf
from django_workhorse.enqueueing.storable import check_datetime, check_text
from django_workhorse.enqueueing.validation import check_queue
from django_workhorse.exceptions import ScheduleDefinitionError

CatchUp = Literal["latest", "all", "skip"]
Overlap = Literal["allow", "skip"]
CATCH_UP_POLICIES: tuple[str, ...] = ("latest", "all", "skip")
OVERLAP_POLICIES: tuple[str, ...] = ("allow", "skip")
TIMEZONE_BOUND = (
    "an IANA time zone key such as 'Europe/Paris' or 'UTC' (not localtime, Factory, posixrules, posix/… or right/…)"
)
# zoneinfo loads these too, but they are not IANA zones, or not the same zone on every host.
_NOT_IANA_KEYS = frozenset({"localtime", "Factory", "posixrules"})
_NOT_IANA_PREFIXES = ("posix/", "right/")

# catch_up="skip" still runs the newest tick if it is at most this old.
SKIP_GRACE = timedelta(seconds=60)
TICK_KEY_SCOPE = "workhorse.schedule"
# How far back due ticks reach (a schedule's horizon): max_catch_up of its periods (its longest gap
# between ticks), at least MIN_HORIZON, at most a year less the margin. A tick's key lives its horizon
# plus TICK_KEY_MARGIN from when it is written (at or after the tick), so every evaluation that can
# still find a tick due meets its key, and an every-second schedule keeps hours of keys, not a year's.
MIN_HORIZON = timedelta(hours=1)
TICK_KEY_MARGIN = timedelta(hours=1)
MAX_HORIZON = conf.MAX_KEY_TTL - TICK_KEY_MARGIN
# The period of a cron schedule is measured over this many ticks after a fixed instant, the same on
# every host.
_PERIOD_SAMPLE = 30
_PERIOD_FROM = datetime(2000, 1, 1, tzinfo=timezone.utc)
# A change of UTC offset skips at most this many minutes of wall time (Samoa skipped a day in 2011).
_MAX_GAP_MINUTES = 2 * 24 * 60
# Cron fields match wall times, which datetime must represent: ticks of the first and the last
# millennium are computed one Gregorian cycle (400 years: the same dates and weekdays) nearer, where
# every zone's offsets are those of the same rules (before any change, or past the explicit ones).
# Frames: (first instant, last instant, shift).
_CYCLE = timedelta(days=146_097)
_MICROSECOND = timedelta(microseconds=1)
_FRAMES = (
    (conf.MIN_STORED_DATETIME, datetime(1000, 1, 1, tzinfo=timezone.utc) - _MICROSECOND, _CYCLE),
    (datetime(1000, 1, 1, tzinfo=timezone.utc), datetime(9000, 1, 1, tzinfo=timezone.utc) - _MICROSECOND, timedelta(0)),
    (datetime(9000, 1, 1, tzinfo=timezone.utc), conf.MAX_STORED_DATETIME, -_CYCLE),
)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_UTC = timezone.utc


@dataclass(frozen=True)
class Schedule:
    """When a task runs periodically: exactly one of ``cron`` (in ``timezone``) or ``every``.

    ``catch_up`` says which missed ticks run (``latest``, ``all`` or ``skip``), ``overlap`` whether
    a tick runs while the previous one still does (``allow`` or ``skip``); ``args``, ``kwargs``,
    ``queue`` and ``priority`` are those of each enqueued job. Invalid values raise
    ``ScheduleDefinitionError`` naming the field and its bound.
    """

    cron: str | None = None
    every: timedelta | None = field(default=None, kw_only=True)
    timezone: str = field(default="UTC", kw_only=True)
    catch_up: CatchUp = field(default="latest", kw_only=True)
    overlap: Overlap = field(default="allow", kw_only=True)
    args: tuple[Any, ...] = field(default=(), kw_only=True)
    kwargs: Mapping[str, Any] = field(default_factory=dict, kw_only=True)
    queue: str | None = field(default=None, kw_only=True)
    priority: int | None = field(default=None, kw_only=True)
    name: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        _check_definition(self)

    @property
    def zone(self) -> ZoneInfo:
        """The ``zoneinfo`` zone the cron expression is evaluated in."""
        return ZoneInfo(self.timezone)


def _fail(name: str, bound: str, value: Any = None) -> ScheduleDefinitionError:
    return ScheduleDefinitionError(field=name, bound=bound, value=value)


def _check_definition(schedule: Schedule) -> None:
    if (schedule.cron is None) == (schedule.every is None):
        raise _fail("cron/every", "exactly one of cron and every")
    if schedule.every is not None:
        _check_every(schedule.every)
    check_timezone(schedule.timezone)
    if schedule.cron is not None:
        _check_cron(schedule.cron)
    if schedule.catch_up not in CATCH_UP_POLICIES:
        raise _fail("catch_up", f"one of {', '.join(CATCH_UP_POLICIES)}", schedule.catch_up)
    if schedule.overlap not in OVERLAP_POLICIES:
        raise _fail("overlap", f"one of {', '.join(OVERLAP_POLICIES)}", schedule.overlap)
    # The annotations are what callers should pass; the values are untrusted here.
    args: object = schedule.args
    kwargs: object = schedule.kwargs
    if not isinstance(args, tuple):
        raise _fail("args", "a tuple", type(args).__name__)
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise _fail("kwargs", "a mapping with string keys")
    if schedule.queue is not None:
        check_queue(schedule.queue, error=ScheduleDefinitionError)
    priority: object = schedule.priority
    if priority is not None and (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not conf.MIN_PRIORITY <= priority <= conf.MAX_PRIORITY
    ):
        raise _fail("priority", f"an integer in {conf.MIN_PRIORITY}..{conf.MAX_PRIORITY}", priority)
    if schedule.name is not None:
        check_schedule_name(schedule.name)


def _check_every(every: Any) -> None:
    low, high = conf.MIN_SCHEDULE_EVERY, conf.MAX_SCHEDULE_EVERY
    if not isinstance(every, timedelta) or not low <= every <= high:
        raise _fail("every", f"a timedelta between {_spoken(low)} and {_spoken(high)}", every)


def _spoken(delta: timedelta) -> str:
    """Return a whole number of days, hours, minutes or seconds as words: ``365 days``."""
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60), ("second", 1)):
        count, rest = divmod(delta, timedelta(seconds=size))
        if not rest:
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return str(delta)


def check_timezone(name: Any) -> str:
    """Check a schedule's time zone: an IANA key ``zoneinfo`` knows; return it unchanged.

    ``zoneinfo`` also loads names that are not IANA zones or not the same zone on every host
    (``localtime``, ``Factory``, ``posixrules``, ``posix/…``, ``right/…`` with leap seconds), and
    on some file systems other spellings of a key: those are refused, so every host computes the
    same ticks.
    """
    if not isinstance(name, str) or name not in _iana_keys():
        raise _fail("timezone", TIMEZONE_BOUND, name)
    return name


@cache
def _iana_keys() -> frozenset[str]:
    return frozenset(
        key for key in available_timezones() if key not in _NOT_IANA_KEYS and not key.startswith(_NOT_IANA_PREFIXES)
    )


def _check_cron(expression: Any) -> None:
    bound = "a cron expression (5 fields, or 6 with seconds)"
    if not isinstance(expression, str):
        raise _fail("cron", bound, type(expression).__name__)
    try:
        CronSim(expression, datetime(2000, 1, 1))
    except (CronSimError, ValueError) as exc:
        raise _fail("cron", bound, f"{expression!r} ({exc})") from None


def check_schedule_name(name: Any) -> str:
    """Check a schedule's name: storable text of 1..200 characters and at most 400 UTF-8 bytes."""
    return check_text(
        name,
        "name",
        max_chars=conf.MAX_SCHEDULE_NAME_CHARS,
        max_bytes=conf.MAX_SCHEDULE_NAME_BYTES,
        error=ScheduleDefinitionError,
    )


def ticks(schedule: Schedule, after: datetime, until: datetime, *, limit: int, oldest: bool = False) -> list[datetime]:
    """Return the newest ``limit`` tick instants in (``after``, ``until``] (the oldest ones if
    ``oldest``), oldest first, in aware UTC."""
    _check_window(after, until, limit)
    if after >= until:
        return []
    if schedule.every is not None:
        return _every_ticks(schedule.every, after, until, limit, oldest)
    assert schedule.cron is not None
    return _cron_ticks(schedule.cron, schedule.zone, after, until, limit, oldest)


def _check_window(after: datetime, until: datetime, limit: int) -> None:
    check_datetime(after, "after")
    check_datetime(until, "until")
    count: object = limit
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"limit must be an integer >= 1, got {limit!r}")


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _every_ticks(every: timedelta, after: datetime, until: datetime, limit: int, oldest: bool) -> list[datetime]:
    step = _micros(every)
    first = _micros(after - _EPOCH) // step + 1  # the first multiple strictly after `after`
    last = _micros(until - _EPOCH) // step  # the last multiple at or before `until`
    if oldest:
        last = min(last, first + limit - 1)
    start = max(first, last - limit + 1)
    return [_EPOCH + timedelta(microseconds=k * step) for k in range(start, last + 1)]


def _cron_ticks(
    expression: str, zone: ZoneInfo, after: datetime, until: datetime, limit: int, oldest: bool
) -> list[datetime]:
    found: deque[datetime] = deque(maxlen=limit)
    for tick in _cron_instants(expression, zone, after):
        if tick > until:
            break
        found.append(tick)
        if oldest and len(found) == limit:
            break
    return list(found)


def next_tick(schedule: Schedule, after: datetime) -> datetime | None:
    """Return the first tick strictly after ``after`` (aware UTC), or None past the last storable instant."""
    check_datetime(after, "after")
    if schedule.every is not None:
        step = _micros(schedule.every)
        k = _micros(after - _EPOCH) // step + 1
        try:
            tick = _EPOCH + timedelta(microseconds=k * step)
        except OverflowError:
            return None
        return tick if tick <= conf.MAX_STORED_DATETIME else None
    assert schedule.cron is not None
    return next(_cron_instants(schedule.cron, schedule.zone, after), None)


def _follows_real_time(expression: str) -> bool:
    """Whether a cron expression runs at every real instant its wall time matches, across DST.

    Debian cron's rule: an expression with seconds, or whose minute or hour field starts with ``*``
    (``*``, ``*/15``), is hourly or more frequent; any other is a fixed-time schedule.
    """
    fields = expression.split()
    return len(fields) == 6 or fields[0].startswith("*") or fields[1].startswith("*")


def _cron_instants(expression: str, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Yield the cron ticks after ``after``, in order, up to the last storable instant."""
    real_time = _follows_real_time(expression)
    for first, last, shift in _FRAMES:
        if after >= last:
            continue
        lower = after if after >= first else first - _MICROSECOND
        for tick in _wall_ticks(expression, zone, lower + shift, real_time):
            if tick > last + shift:
                break
            yield tick - shift


def _wall_ticks(expression: str, zone: ZoneInfo, after: datetime, real_time: bool) -> Iterator[datetime]:
    # cronsim walks naive wall times; each matching one becomes its instants. The first instants of
    # successive wall times are in order, but a repeated wall time's second occurrence comes after
    # the first occurrences of the later repeated ones: it waits in `later` until they are out.
    later: list[datetime] = []
    last = after
    for wall in CronSim(expression, _first_wall(zone, after)):
        found = _occurrences(zone, wall) if real_time else _first_occurrence(zone, wall)
        if not found:
            continue
        while later and later[0] < found[0]:
            if (tick := heapq.heappop(later)) > last:
                yield (last := tick)
        if found[0] > last:
            yield (last := found[0])
        for second in found[1:]:
            heapq.heappush(later, second)
    yield from (tick for tick in sorted(later) if tick > last)


def _first_wall(zone: ZoneInfo, after: datetime) -> datetime:
    """Return the wall time to start cronsim at: ``after``'s, less the repeat when ``after`` is in the
    first occurrence of a repeated hour (the second occurrence's ticks come after it)."""
    wall = after.astimezone(zone).replace(tzinfo=None, fold=0)
    repeat = _instant(zone, wall, fold=1) - _instant(zone, wall, fold=0)
    return wall - max(repeat, timedelta(0))


def _instant(zone: ZoneInfo, wall: datetime, *, fold: int) -> datetime:
    return wall.replace(tzinfo=zone, fold=fold).astimezone(_UTC)


def _occurrences(zone: ZoneInfo, wall: datetime) -> list[datetime]:
    """Return the instants whose wall time in ``zone`` is ``wall``: none, one, or two (repeated)."""
    candidates = sorted({_instant(zone, wall, fold=0), _instant(zone, wall, fold=1)})
    return [t for t in candidates if t.astimezone(zone).replace(tzinfo=None) == wall]


def _first_occurrence(zone: ZoneInfo, wall: datetime) -> list[datetime]:
    """Return a fixed-time tick's instant: the first occurrence of ``wall``, or if a change skips it
    the first minute after the change (Debian cron, and cronsim's fixed-time rule)."""
    for minutes in range(_MAX_GAP_MINUTES):
        found = _occurrences(zone, wall + timedelta(minutes=minutes))
        if found:
            return found[:1]
    return []


def definition(schedule: Schedule, task: str) -> dict[str, Any]:
    """Return the schedule as JSON-ready data (what the state table shows and its digest covers)."""
    return {
        "task": task,
        "cron": schedule.cron,
        "every_seconds": None if schedule.every is None else schedule.every.total_seconds(),
        "timezone": schedule.timezone,
        "catch_up": schedule.catch_up,
        "overlap": schedule.overlap,
        "args": list(schedule.args),
        "kwargs": dict(schedule.kwargs),
        "queue": schedule.queue,
        "priority": schedule.priority,
    }


def definition_digest(data: Mapping[str, Any]) -> str:
    """Return the SHA-256 (hex) of a definition's canonical JSON."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def describe(schedule: Schedule) -> str:
    """Return the expression as people read it: the cron text, or ``every 0:05:00``."""
    return schedule.cron if schedule.cron is not None else f"every {schedule.every}"


def period(schedule: Schedule) -> timedelta:
    """Return the longest gap between consecutive ticks: ``every``, or measured over 30 cron ticks."""
    if schedule.every is not None:
        return schedule.every
    found = ticks(schedule, _PERIOD_FROM, conf.MAX_STORED_DATETIME, limit=_PERIOD_SAMPLE, oldest=True)
    gaps = [later - earlier for earlier, later in zip(found, found[1:], strict=False)]
    return max(gaps, default=MAX_HORIZON)


def horizon(schedule: Schedule, max_catch_up: int) -> timedelta:
    """Return how far back the schedule's due ticks reach: ``max_catch_up`` periods, in 1 hour..~1 year."""
    return min(max(period(schedule) * max_catch_up, MIN_HORIZON), MAX_HORIZON)


def tick_key_ttl(schedule_horizon: timedelta) -> timedelta:
    """Return the lifetime of a tick's key: the horizon and a margin (see ``MIN_HORIZON``)."""
    return schedule_horizon + TICK_KEY_MARGIN


def due_ticks(
    schedule: Schedule,
    previous_evaluation: datetime | None,
    now: datetime,
    *,
    max_catch_up: int,
    schedule_horizon: timedelta | None = None,
) -> list[datetime]:
    """Return the ticks to enqueue now, oldest first, per the schedule's ``catch_up``.

    Due ticks lie in (``previous_evaluation``, ``now``] and within the schedule's horizon (see
    :func:`horizon`; pass it when known, it is computed otherwise).
    ``all``: each of them, at most ``max_catch_up`` (the latest); ``latest``: the newest one;
    ``skip``: the newest one if it is at most ``SKIP_GRACE`` (60 s) old. A schedule evaluated for
    the first time (``previous_evaluation is None``) has none.
    """
    check_datetime(now, "now")
    if previous_evaluation is None:
        return []
    reach = horizon(schedule, max_catch_up) if schedule_horizon is None else schedule_horizon
    after = max(previous_evaluation, now - reach)
    limit = max_catch_up if schedule.catch_up == "all" else 1
    due = ticks(schedule, after, now, limit=limit)
    if schedule.catch_up == "skip":
        return [tick for tick in due if now - tick <= SKIP_GRACE]
    return due


def tick_key(schedule_name: str, tick: datetime) -> str:
    """Return the idempotency key of one tick: the schedule's name and the tick's UTC instant."""
    check_schedule_name(schedule_name)
    check_datetime(tick, "tick")
    return f"{schedule_name}@{tick.astimezone(_UTC).isoformat(timespec='microseconds')}"
