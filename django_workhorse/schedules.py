"""Periodic schedules, the pure core: the definition, its tick instants and which of them are due.

No database here: evaluation (the state of each schedule, the enqueue of its due ticks) builds on
these functions. Every host computes the same instants from the same definition:

- ``every`` ticks are the multiples of ``every`` since the Unix epoch (UTC);
- ``cron`` ticks are evaluated in the schedule's zone (``zoneinfo``) by ``cronsim``, with Debian
  cron's DST rule for fixed-time schedules: a local time skipped by a spring-forward runs once,
  right at the change (``30 2 * * *`` in New York on 2026-03-08 runs at 03:00 EDT); a repeated
  local hour (fall back) runs a fixed-time schedule once, at the first occurrence. Hourly (and
  more frequent) schedules follow real time: every real hour runs, and wall times that do not exist
  do not run.

A tick is enqueued idempotently under ``tick_key(name, tick)`` in ``TICK_KEY_SCOPE``, so any number
of evaluators make one job per tick.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from django_workhorse import conf
from django_workhorse.exceptions import ScheduleDefinitionError
from django_workhorse.storable import check_datetime, check_text

CatchUp = Literal["latest", "all", "skip"]
Overlap = Literal["allow", "skip"]
CATCH_UP_POLICIES: tuple[str, ...] = ("latest", "all", "skip")
OVERLAP_POLICIES: tuple[str, ...] = ("allow", "skip")

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
# DST changes move local time by less than this; starting cron evaluation this long before a window
# means it never starts inside a repeated hour that the window depends on.
_CRON_LEAD = timedelta(hours=3)
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
    _check_timezone(schedule.timezone)
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
        check_text(schedule.queue, "queue", max_chars=conf.MAX_QUEUE_CHARS, error=ScheduleDefinitionError)
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
        raise _fail("every", f"a timedelta in {low}..{high}", every)


def _check_timezone(name: Any) -> None:
    bound = "an IANA time zone key (zoneinfo)"
    if not isinstance(name, str) or not name or "\x00" in name:
        raise _fail("timezone", bound, name)
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise _fail("timezone", bound, name) from None


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


def _cron_start(zone: ZoneInfo, after: datetime) -> datetime:
    # cronsim started inside a repeated hour may return a time before its start (the first
    # occurrence) and miss the ticks of the second: near an offset change, start well before the
    # window and keep only later ticks. Elsewhere start at the window, so a schedule with seconds
    # does not walk three hours of ticks.
    if zone.utcoffset(after - _CRON_LEAD) != zone.utcoffset(after + _CRON_LEAD):
        return (after - _CRON_LEAD).astimezone(zone)
    return after.astimezone(zone)


def _cron_ticks(
    expression: str, zone: ZoneInfo, after: datetime, until: datetime, limit: int, oldest: bool
) -> list[datetime]:
    found: deque[datetime] = deque(maxlen=limit)
    try:
        for local in CronSim(expression, _cron_start(zone, after)):
            tick = local.astimezone(_UTC)
            if tick > until:
                break
            if tick > after and (not found or tick > found[-1]):
                found.append(tick)
                if oldest and len(found) == limit:
                    break
    except (OverflowError, ValueError):  # past year 9999
        pass
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
    try:
        for local in CronSim(schedule.cron, _cron_start(schedule.zone, after)):
            tick = local.astimezone(_UTC)
            if tick > after:
                return tick
    except (OverflowError, ValueError):  # past year 9999
        return None
    return None


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
