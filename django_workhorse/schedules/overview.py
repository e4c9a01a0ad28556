"""What the operator sees of the schedules: their next ticks, last tick and job, state (ORM only).

Shared by the admin's schedules list, the dashboard and ``manage.py workhorse_status``, so all three
show the same ticks. Next ticks come from this process's code (``declared_schedules()``); a
schedule that is paused, inactive (removed from code) or not declared here has none.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import router
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone as django_timezone

from django_workhorse import conf
from django_workhorse.exceptions import ScheduleDefinitionError
from django_workhorse.models import Job, ScheduleState
from django_workhorse.schedules.definition import Schedule, describe, next_tick, ticks
from django_workhorse.schedules.sources import DeclaredSchedule, declared_schedules

# How many next ticks the list and the status show per schedule, and the dashboard in all.
NEXT_TICKS = 5
UPCOMING_TICKS = 10


@dataclass(frozen=True)
class ScheduleOverview:
    """One stored schedule as the operator sees it; ``next_ticks`` in aware UTC, oldest first."""

    name: str
    task: str
    expression: str  # as declared here, else as last stored ("" if unreadable)
    timezone: str
    active: bool
    paused: bool
    declared_here: bool
    next_ticks: list[datetime] = field(default_factory=list)
    last_tick_at: datetime | None = None
    last_job_id: int | None = None
    last_job_status: str | None = None  # None: no job, or the job was pruned
    last_skip_at: datetime | None = None
    last_skip_reason: str = ""

    @property
    def state(self) -> str:
        """``inactive``, ``paused`` or ``active`` (``state_label``)."""
        return state_label(self)

    def as_json(self) -> dict[str, object]:
        """Return a JSON-ready dict (times in ISO 8601 UTC)."""
        return {
            "name": self.name,
            "task": self.task,
            "expression": self.expression,
            "timezone": self.timezone,
            "state": self.state,
            "active": self.active,
            "paused": self.paused,
            "declared_here": self.declared_here,
            "next_ticks": [tick.isoformat() for tick in self.next_ticks],
            "last_tick_at": _iso(self.last_tick_at),
            "last_job_id": self.last_job_id,
            "last_job_status": self.last_job_status,
            "last_skip_at": _iso(self.last_skip_at),
            "last_skip_reason": self.last_skip_reason,
        }


@dataclass(frozen=True)
class ScheduleCounts:
    """How many schedules are stored, and how many are active, paused and inactive."""

    total: int
    active: int
    paused: int
    inactive: int


@dataclass(frozen=True)
class UpcomingTick:
    """One tick to come: its schedule, its instant in UTC and in the schedule's zone."""

    schedule: str
    at: datetime
    local: datetime


def state_label(state: ScheduleState | ScheduleOverview) -> str:
    """``inactive`` (removed from code), ``paused`` or ``active``."""
    return "inactive" if not state.active else "paused" if state.paused else "active"


def with_last_job_status(states: QuerySet[ScheduleState]) -> QuerySet[ScheduleState]:
    """Annotate each schedule with ``last_job_status``, its last job's status, in the same query."""
    status = Job.objects.filter(pk=OuterRef("last_job_id")).values("status")[:1]
    annotated: QuerySet[ScheduleState] = states.annotate(last_job_status=Subquery(status))
    return annotated


def declared_by_name() -> dict[str, DeclaredSchedule]:
    """Return the valid schedules of this process's code, by name."""
    declared, _problems = declared_schedules()
    return {schedule.name: schedule for schedule in declared}


def next_ticks(
    state: ScheduleState, declared: DeclaredSchedule | None, now: datetime, count: int = NEXT_TICKS
) -> list[datetime]:
    """Return the next ``count`` ticks after ``now`` (UTC); none when paused, inactive or not declared here."""
    if declared is None or not state.active or state.paused:
        return []
    return ticks(declared.schedule, now, conf.MAX_STORED_DATETIME, limit=count, oldest=True)


def expression(state: ScheduleState, declared: DeclaredSchedule | None) -> tuple[str, str]:
    """Return the schedule's expression and zone: from this code, else from its stored definition
    (``("", "")`` if that cannot be read)."""
    schedule = declared.schedule if declared is not None else _stored_schedule(state.definition)
    return ("", "") if schedule is None else (describe(schedule), schedule.timezone)


def _stored_schedule(stored: Any) -> Schedule | None:
    """The schedule a stored definition describes (its timing only), or None if it describes none."""
    if not isinstance(stored, Mapping):
        return None
    try:
        every = stored.get("every_seconds")
        return Schedule(
            stored.get("cron"),
            every=None if every is None else timedelta(seconds=every),
            timezone=stored.get("timezone") or "UTC",
        )
    except (ScheduleDefinitionError, TypeError, ValueError, OverflowError):
        return None


def overview(
    *, using: str | None = None, now: datetime | None = None, count: int = NEXT_TICKS
) -> list[ScheduleOverview]:
    """Return every stored schedule, by name, with its next ``count`` ticks and last job's status."""
    now = now or django_timezone.now()
    alias = using or router.db_for_read(ScheduleState)
    declared = declared_by_name()
    rows = with_last_job_status(ScheduleState.objects.using(alias).order_by("name"))
    return [_overview(state, declared.get(state.name), now, count) for state in rows]


def upcoming_ticks(
    *, using: str | None = None, now: datetime | None = None, limit: int = UPCOMING_TICKS
) -> list[UpcomingTick]:
    """Return the next ``limit`` ticks across the active, unpaused schedules, soonest first.

    The work is one first tick per schedule timing declared here (remembered across calls until it
    passes) and at most ``limit`` ticks more; only the names of the active, unpaused rows are read.
    """
    now = now or django_timezone.now()
    alias = using or router.db_for_read(ScheduleState)
    declared = declared_by_name()
    names = ScheduleState.objects.using(alias).filter(active=True, paused=False).values_list("name", flat=True)
    firsts = _FIRST_TICKS.after(now, [(name, declared[name].schedule) for name in names if name in declared])
    return [
        UpcomingTick(name, tick, local_time(tick, schedule.timezone)) for tick, name, schedule in _merge(firsts, limit)
    ]


def schedule_counts(*, using: str | None = None) -> ScheduleCounts:
    """Count the stored schedules by state, in one query."""
    alias = using or router.db_for_read(ScheduleState)
    counts = ScheduleState.objects.using(alias).aggregate(
        all_count=Count("pk"),
        active_count=Count("pk", filter=Q(active=True, paused=False)),
        paused_count=Count("pk", filter=Q(active=True, paused=True)),
    )
    total, active, paused = counts["all_count"], counts["active_count"], counts["paused_count"]
    return ScheduleCounts(total=total, active=active, paused=paused, inactive=total - active - paused)


_Timing = tuple[str | None, timedelta | None, str]
_FirstTick = tuple[datetime, datetime | None]  # (computed after, the first tick then; None: none left)


class _FirstTicks:
    """Each schedule timing's first tick after an instant: still its first tick after any later
    instant before that tick, so a dashboard refreshing every few seconds computes almost none."""

    def __init__(self) -> None:
        self._known: dict[_Timing, _FirstTick] = {}

    def after(self, now: datetime, schedules: list[tuple[str, Schedule]]) -> list[tuple[datetime, str, Schedule]]:
        """Return ``(first tick after now, name, schedule)`` for each schedule that has one."""
        known: dict[_Timing, _FirstTick] = self._known
        kept: dict[_Timing, _FirstTick] = {}
        found = []
        for name, schedule in schedules:
            timing = (schedule.cron, schedule.every, schedule.timezone)
            first = kept.get(timing) or known.get(timing)
            if first is None or not _still_first(first, now):
                first = (now, next_tick(schedule, now))
            kept[timing] = first
            if first[1] is not None:
                found.append((first[1], name, schedule))
        self._known = kept  # only the timings declared now, so the memory stays bounded
        return found


_FIRST_TICKS = _FirstTicks()


def _still_first(first: _FirstTick, now: datetime) -> bool:
    after, tick = first
    return after <= now and (tick is None or now < tick)


def _merge(firsts: list[tuple[datetime, str, Schedule]], limit: int) -> Iterator[tuple[datetime, str, Schedule]]:
    """Yield the soonest ``limit`` ticks of all the schedules, from each one's first tick: only the
    schedule whose tick was taken computes its next."""
    heapq.heapify(firsts)  # names are unique: ties never compare the schedules
    for _ in range(limit):
        if not firsts:
            return
        tick, name, schedule = firsts[0]
        yield tick, name, schedule
        following = next_tick(schedule, tick)
        if following is None:
            heapq.heappop(firsts)
        else:
            heapq.heapreplace(firsts, (following, name, schedule))


def local_time(tick: datetime, zone: str) -> datetime:
    """Return ``tick`` in the zone ``zone`` names (UTC if it names none, or if the local time would
    fall past year 9999: a tick late on 9999-12-31 UTC in a zone ahead of UTC)."""
    try:
        return tick.astimezone(ZoneInfo(zone)) if zone else tick.astimezone(timezone.utc)
    except (ZoneInfoNotFoundError, ValueError, OverflowError):
        return tick.astimezone(timezone.utc)


def _overview(state: ScheduleState, declared: DeclaredSchedule | None, now: datetime, count: int) -> ScheduleOverview:
    text, zone = expression(state, declared)
    return ScheduleOverview(
        name=state.name,
        task=state.task,
        expression=text,
        timezone=zone,
        active=state.active,
        paused=state.paused,
        declared_here=declared is not None,
        next_ticks=next_ticks(state, declared, now, count),
        last_tick_at=state.last_tick_at,
        last_job_id=state.last_job_id,
        last_job_status=getattr(state, "last_job_status", None),
        last_skip_at=state.last_skip_at,
        last_skip_reason=state.last_skip_reason,
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
