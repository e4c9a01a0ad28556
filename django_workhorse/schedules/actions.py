"""Operator actions on periodic schedules: pause, resume, run now.

The admin's schedule actions and any script call these. Arguments are checked before any SQL
(``InvalidArgumentError``); each change is recorded as a ``ScheduleEvent`` with who asked.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import router, transaction

from django_workhorse import conf, sql
from django_workhorse.enqueueing.after_write import after_write
from django_workhorse.enqueueing.api import enqueue_prepared
from django_workhorse.enqueueing.storable import check_datetime, check_text
from django_workhorse.exceptions import InvalidArgumentError, ScheduleDefinitionError, ScheduleNotFoundError
from django_workhorse.models import ScheduleEvent, ScheduleEventKind, ScheduleState
from django_workhorse.operations.actions import check_requested_by
from django_workhorse.schedules.definition import TICK_KEY_SCOPE, check_schedule_name
from django_workhorse.schedules.evaluation import FUTURE_NOW_TOLERANCE, check_now
from django_workhorse.schedules.sources import DeclaredSchedule, check_arguments, declared_schedules
from django_workhorse.types import EnqueueOutcome, EnqueueResult, Idempotency

logger = logging.getLogger(__name__)

RUN_NOW_KEY_SCOPE = TICK_KEY_SCOPE + ".run_now"
# A run-now's key lives as long as a key can: a confirmation page submitted again, even much later,
# replays the job it made (the request's ScheduleEvent answers too, once its job is pruned).
RUN_NOW_KEY_TTL = conf.MAX_KEY_TTL


def pause_schedules(
    names: Sequence[str], *, requested_by: str = "", now: datetime | None = None, using: str | None = None
) -> list[str]:
    """Pause the named schedules that are not paused; return the names paused, in name order.

    A paused schedule makes no ticks, and never catches up the ticks of the time it was paused (see
    :func:`resume_schedules`); it can still be run now. Names with no stored schedule (unknown, or
    not evaluated yet) are left out. ``now`` (the events' time) defaults to the database's clock.
    Raise ``InvalidArgumentError`` for a bad argument, ``now`` included: more than
    ``FUTURE_NOW_TOLERANCE`` ahead of the database's clock (see ``enqueue_due_schedules``).
    """
    return _set_paused(names, paused=True, requested_by=requested_by, now=now, using=using)


def resume_schedules(
    names: Sequence[str], *, requested_by: str = "", now: datetime | None = None, using: str | None = None
) -> list[str]:
    """Resume the named paused schedules, and repair the named ones whose window lies ahead of the
    clock; return the names resumed or repaired, in name order.

    Each one's window starts again at ``now`` (the database's clock by default; pass the ``now`` you
    give ``enqueue_due_schedules``, if you give it one): the ticks of the paused time are not caught
    up, the first tick after ``now`` is. A window more than ``FUTURE_NOW_TOLERANCE`` ahead of the
    database's clock (an evaluation was given a ``now`` in the future, and no tick would come until
    the clock caught up) is brought back to the clock, paused or not, and recorded as a resume. A
    window is never moved back otherwise. Names with no stored schedule are left out. Raise
    ``InvalidArgumentError`` for a bad argument, ``now`` included (as ``pause_schedules``).
    """
    return _set_paused(names, paused=False, requested_by=requested_by, now=now, using=using)


def _set_paused(
    names: Sequence[str], *, paused: bool, requested_by: str, now: datetime | None, using: str | None
) -> list[str]:
    checked = _check_names(names)
    by = check_requested_by(requested_by)
    if now is not None:
        check_datetime(now, "now")
    alias = _alias(using)
    with transaction.atomic(using=alias):
        clock = sql.actions.clock(alias)
        if now is not None:
            check_now(now, clock)
        changed = sql.actions.set_paused(alias, checked, paused=paused, requested_by=by, now=now)
        if not paused:
            changed = sorted({*changed, *_repair_windows(alias, checked, max(now or clock, clock), by, changed)})
    logger.info("%s schedules names=%s requested_by=%s", "Paused" if paused else "Resumed", changed, by)
    return changed


def _repair_windows(alias: str, names: list[str], at: datetime, requested_by: str, resumed: list[str]) -> list[str]:
    """Bring back to ``at`` the windows of ``names`` that lie more than the tolerance ahead of it;
    record a resume for those not just resumed. Return their names."""
    ahead = (
        ScheduleState.objects.using(alias)
        .select_for_update(no_key=True)
        .filter(name__in=names, evaluated_until__gt=at + FUTURE_NOW_TOLERANCE)
        .order_by("name")  # the lock order of every statement that locks several schedules
    )
    repaired = {state.pk: state.name for state in ahead}
    if not repaired:
        return []
    ScheduleState.objects.using(alias).filter(pk__in=repaired).update(evaluated_until=at, updated_at=at)
    events = [
        ScheduleEvent(schedule_id=pk, kind=ScheduleEventKind.RESUMED, at=at, requested_by=requested_by)
        for pk, name in repaired.items()
        if name not in resumed
    ]
    ScheduleEvent.objects.using(alias).bulk_create(events)
    logger.warning("Schedule windows ahead of the clock brought back names=%s to=%s", sorted(repaired.values()), at)
    return list(repaired.values())


def run_schedule_now(name: str, *, request_id: str, requested_by: str = "", using: str | None = None) -> EnqueueResult:
    """Enqueue one job of schedule ``name`` now, once per ``request_id``; return its result.

    The job is what a tick enqueues (the schedule's task, arguments, queue and priority), with
    ``scheduled_for`` the instant of the request by the database's clock. A repeat with the same
    ``request_id`` (a form submitted twice, racing threads) makes no job and returns the first one's,
    ``REPLAYED``: run-nows of one schedule take turns on its row's lock, and find the first one's
    event (unique per request id) or its key (``run_now_key`` in ``RUN_NOW_KEY_SCOPE``, kept 365
    days). The run is recorded as a ``ScheduleEvent`` and becomes the schedule's last job, so
    ``overlap="skip"`` waits for it. Paused schedules can be run now too (they stay paused).
    Raise ``ScheduleNotFoundError`` unless this process's code declares the schedule and it is
    active, ``ScheduleDefinitionError`` if its arguments do not fit its task (``workhorse.E208``),
    ``InvalidArgumentError`` for a bad argument; each before anything is written.
    """
    name = _check_name(name, "name")
    check_text(request_id, "request_id", max_chars=conf.MAX_REQUEST_ID_CHARS)
    by = check_requested_by(requested_by)
    declared = _declared(name)
    _check_fits(declared)
    alias = _alias(using)
    with transaction.atomic(using=alias):
        schedule_id, now = _lock(alias, declared)
        earlier = _earlier_run(alias, schedule_id, request_id)
        if earlier is not None:
            return earlier
        result = _enqueue(alias, declared, request_id, now)
        if result.outcome is EnqueueOutcome.ACCEPTED:
            _record(alias, schedule_id, result.job_id, request_id=request_id, requested_by=by, at=now)
    after_write(alias, [result])
    logger.info("Ran schedule now name=%s job=%s outcome=%s", name, result.job_id, result.outcome)
    return result


def run_now_key(name: str, request_id: str) -> str:
    """Return the key of a run-now: the SHA-256 (hex) of the schedule's name and the request id."""
    text = json.dumps([name, request_id], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _lock(alias: str, declared: DeclaredSchedule) -> tuple[int, datetime]:
    """Lock the schedule's row, writing it first if no evaluation has yet; return its id and the clock."""
    locked = sql.actions.lock_schedule(alias, declared.name)
    if locked is None:
        now = sql.actions.clock(alias)
        row = (declared.name, declared.task, declared.definition, declared.digest)
        sql.schedules.insert_states(alias, [row], now)
        locked = sql.actions.lock_schedule(alias, declared.name)
        assert locked is not None  # inserted, or inserted by a racing transaction that committed
    schedule_id, active, now = locked
    if not active:
        raise ScheduleNotFoundError(declared.name, "is inactive: the last evaluation ran code that does not declare it")
    return schedule_id, now


def _earlier_run(alias: str, schedule_id: int, request_id: str) -> EnqueueResult | None:
    job_id = (
        ScheduleEvent.objects.using(alias)
        .filter(schedule_id=schedule_id, kind=ScheduleEventKind.RUN_NOW, request_id=request_id)
        .values_list("job_id", flat=True)
        .first()
    )
    return None if job_id is None else EnqueueResult(job_id, EnqueueOutcome.REPLAYED)


def _enqueue(alias: str, declared: DeclaredSchedule, request_id: str, now: datetime) -> EnqueueResult:
    key = Idempotency(run_now_key(declared.name, request_id), scope=RUN_NOW_KEY_SCOPE, ttl=RUN_NOW_KEY_TTL)
    [result] = enqueue_prepared([declared.prepare(key, now)], using=alias)
    return result


def _record(alias: str, schedule_id: int, job_id: int, *, request_id: str, requested_by: str, at: datetime) -> None:
    event = ScheduleEvent(
        schedule_id=schedule_id,
        kind=ScheduleEventKind.RUN_NOW,
        at=at,
        requested_by=requested_by,
        request_id=request_id,
        job_id=job_id,
    )
    # workhorse_schedule_event_request_uniq: one run-now event per request id.
    ScheduleEvent.objects.using(alias).bulk_create([event], ignore_conflicts=True)
    ScheduleState.objects.using(alias).filter(pk=schedule_id).update(last_job_id=job_id, updated_at=at)


def _declared(name: str) -> DeclaredSchedule:
    declared, _problems = declared_schedules()
    for schedule in declared:
        if schedule.name == name:
            return schedule
    raise ScheduleNotFoundError(name, "is not declared by this process's code")


def _check_fits(declared: DeclaredSchedule) -> None:
    why = check_arguments(declared)
    if why is not None:
        raise ScheduleDefinitionError(
            field=f"the args/kwargs of schedule {declared.name!r}",
            bound=f"arguments that fit task {declared.task!r} (workhorse.E208)",
            value=why,
        )


def _check_name(value: Any, field: str) -> str:
    try:
        return check_schedule_name(value)
    except ScheduleDefinitionError as exc:
        raise InvalidArgumentError(field=field, bound=exc.bound, value=exc.value) from exc


def _check_names(names: Any) -> list[str]:
    if isinstance(names, (str, bytes, bytearray)) or not isinstance(names, (Sequence, set, frozenset)):
        raise InvalidArgumentError(field="names", bound="a sequence of schedule names", value=type(names).__name__)
    return [_check_name(name, "names") for name in names]


def _alias(using: str | None) -> str:
    return using or router.db_for_write(ScheduleState)
