"""Evaluate the periodic schedules: enqueue each due tick, exactly once however many evaluators run.

Every worker evaluates (at most once per ``WORKHORSE_SCHEDULE_INTERVAL``); nothing elects a leader.
Each tick is an idempotent enqueue keyed by the schedule's name and the tick's UTC instant in a
reserved scope, so PostgreSQL's unique constraint on bindings decides, as for any enqueue, and two
evaluators whose windows overlap make one job per tick.

An evaluation reads the state table (one SELECT) and, for schedules whose next tick has come, locks
their rows in name order, re-reads them, enqueues their due ticks in one batch and advances their
windows, in one transaction. A schedule with nothing due costs a comparison: the next tick of each
definition is kept in memory.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.db import router, transaction

from django_workhorse import sql
from django_workhorse.conf import app_settings
from django_workhorse.enqueueing.after_write import after_write
from django_workhorse.enqueueing.api import enqueue_prepared
from django_workhorse.enqueueing.prepared import PreparedJob
from django_workhorse.enqueueing.storable import check_datetime, check_json
from django_workhorse.exceptions import EnqueueIdempotencyConflictError, EnqueueValidationError, InvalidArgumentError
from django_workhorse.models import TERMINAL_STATUSES, JobStatus, ScheduleState
from django_workhorse.observability import instruments
from django_workhorse.schedules.definition import (
    TICK_KEY_SCOPE,
    Schedule,
    due_ticks,
    horizon,
    next_tick,
    tick_key,
    tick_key_ttl,
    ticks,
)
from django_workhorse.schedules.sources import (
    ARGUMENTS_DO_NOT_FIT,
    DUPLICATE_NAME,
    INVALID_CRON,
    INVALID_DEFINITION,
    UNKNOWN_TASK,
    UNKNOWN_TIMEZONE,
    DeclaredSchedule,
    ScheduleProblem,
    check_arguments,
    declared_schedules,
)
from django_workhorse.sql.schedules import Advance, ScheduleRow
from django_workhorse.types import EnqueueResult, Idempotency

logger = logging.getLogger(__name__)

# overlap="skip" waits while the previous job is in one of these: any status that is not terminal.
LIVE_STATUSES = tuple(status for status in JobStatus.values if status not in TERMINAL_STATUSES)
# The system checks that report a schedule the evaluation leaves out.
LEFT_OUT_CHECK_IDS = (
    INVALID_CRON,
    UNKNOWN_TIMEZONE,
    UNKNOWN_TASK,
    DUPLICATE_NAME,
    INVALID_DEFINITION,
    ARGUMENTS_DO_NOT_FIT,
)
# How far a ``now`` given to an evaluation or a schedule action may lie ahead of the database's
# clock (hosts' clocks disagree a little): a ``now`` further ahead would move the schedules' windows
# past the clock, and no tick would come until the clock caught up.
FUTURE_NOW_TOLERANCE = timedelta(seconds=5)
# The setting that lifts that bound, for tests that play a schedule forward in time.
ALLOW_FUTURE_NOW = "WORKHORSE_ALLOW_FUTURE_NOW"


@dataclass
class _Known:
    """What this process computed for one definition: kept while its digest stays the same."""

    horizon: timedelta
    problem: ScheduleProblem | None
    # (after, the first tick after it or None): nothing is due while that tick lies ahead. One
    # attribute, so threads replace the pair at once.
    window: tuple[datetime, datetime | None] | None = None


_known: dict[tuple[str, str, int], _Known] = {}
_known_lock = threading.Lock()
# A horizon depends on the expression, the zone and max_catch_up only, and measuring a cron
# schedule's period walks 30 of its ticks: schedules that share an expression measure it once.
_horizons: dict[tuple[str | None, timedelta | None, str, int], timedelta] = {}
# The problems this process has logged, each once.
_reported: set[ScheduleProblem] = set()


def enqueue_due_schedules(now: datetime | None = None, *, using: str | None = None) -> list[EnqueueResult]:
    """Enqueue the due ticks of every active schedule, in one batch; return their results.

    ``now`` defaults to the database's clock (the same for every host). The due ticks of a
    schedule lie in (its previous evaluation, ``now``]; a schedule seen for the first time has
    none; ``catch_up`` and ``overlap`` decide which of them run. Paused schedules make no ticks.
    A schedule the system checks report (``workhorse.E203``-``E208``) is left out, logged at ERROR
    and counted (:func:`report_left_out_schedules`); the others still run. Raise
    ``InvalidArgumentError`` for a ``now`` more than ``FUTURE_NOW_TOLERANCE`` ahead of the
    database's clock (unless ``WORKHORSE_ALLOW_FUTURE_NOW``), before anything is written.
    """
    if now is not None:
        check_datetime(now, "now")
    alias = using or router.db_for_write(ScheduleState)
    declared, problems = declared_schedules()
    max_catch_up = app_settings.SCHEDULE_MAX_CATCH_UP
    knowledge = {d.name: (d, _knowledge(d, max_catch_up)) for d in declared}
    left_out = [*problems, *(k.problem for _, k in knowledge.values() if k.problem is not None)]
    _report(left_out)
    runnable = {name: d for name, (d, k) in knowledge.items() if k.problem is None}
    states, clock = sql.schedules.read_states(alias)
    now = clock if now is None else check_now(now, clock)
    _sync(alias, runnable, states, now, kept={problem.name for problem in left_out})
    candidates = sorted(name for name in runnable if _may_be_due(*knowledge[name], states.get(name), now))
    if not candidates:
        return []
    with transaction.atomic(using=alias):
        locked = sql.schedules.lock_states(alias, candidates)
        prepared, advances = _plan([runnable[name] for name in candidates], locked, now, max_catch_up)
        ticked: list[tuple[str, str]] = []
        results = _enqueue(alias, prepared, advances, ticked)
        sql.schedules.advance(alias, list(advances.values()), now)
    for name, outcome in ticked:
        instruments.schedule_ticked(name, outcome)
    for advance in advances.values():
        if advance.skip_at is not None:
            instruments.schedule_ticked(advance.name, "skipped")
    after_write(alias, results)
    return results


def check_now(now: datetime, clock: datetime) -> datetime:
    """Return ``now``, or raise ``InvalidArgumentError`` (field ``now``) if it lies more than
    ``FUTURE_NOW_TOLERANCE`` ahead of ``clock``, the database's, unless ``WORKHORSE_ALLOW_FUTURE_NOW``."""
    if now - clock > FUTURE_NOW_TOLERANCE and not app_settings.ALLOW_FUTURE_NOW:
        bound = (
            f"at most {FUTURE_NOW_TOLERANCE.total_seconds():g} s ahead of the database's clock "
            f"({clock.isoformat()}; {ALLOW_FUTURE_NOW} = True lifts this in tests)"
        )
        raise InvalidArgumentError(field="now", bound=bound, value=now.isoformat())
    return now


def left_out_schedules() -> list[ScheduleProblem]:
    """Return the declared schedules an evaluation leaves out, with why: the system checks'
    ``workhorse.E203``-``E208`` (the sources' problems, then the schedules whose arguments do not fit)."""
    declared, problems = declared_schedules()
    unfit = (_problem(d) for d in declared)  # asked again, not kept: the checks call this too
    return [*problems, *(problem for problem in unfit if problem is not None)]


def report_left_out_schedules() -> list[ScheduleProblem]:
    """Log each schedule left out at ERROR, set the ``workhorse_schedules_left_out`` gauge, and
    return them: what the commands that evaluate do as they start. Each evaluation does too, logging
    only what this process has not logged yet."""
    problems = left_out_schedules()
    _report(problems, again=True)
    return problems


def _report(problems: list[ScheduleProblem], *, again: bool = False) -> None:
    for problem in problems:
        if again or problem not in _reported:
            logger.error(
                "Schedule left out name=%s check=%s origin=%s: %s",
                problem.name,
                problem.check_id,
                problem.origin,
                problem.message,
            )
            _reported.add(problem)
    counts = collections.Counter(problem.check_id for problem in problems)
    instruments.schedules_left_out({check_id: counts[check_id] for check_id in LEFT_OUT_CHECK_IDS})


def _knowledge(declared: DeclaredSchedule, max_catch_up: int) -> _Known:
    key = (declared.name, declared.digest, max_catch_up)
    known = _known.get(key)
    if known is None:
        known = _Known(horizon=_horizon(declared.schedule, max_catch_up), problem=_problem(declared))
        with _known_lock:
            _known[key] = known
    return known


def _problem(declared: DeclaredSchedule) -> ScheduleProblem | None:
    """Why ticks of ``declared`` cannot be enqueued (E208 its arguments, E207 its definition's size), if so."""
    why = check_arguments(declared)
    if why is not None:
        message = f"its arguments do not fit task {declared.task!r}: {why}"
        return ScheduleProblem(declared.name, declared.origin, message, ARGUMENTS_DO_NOT_FIT)
    try:
        check_json(declared.definition, "definition", max_bytes=app_settings.MAX_PAYLOAD_BYTES)
    except InvalidArgumentError as exc:
        return ScheduleProblem(declared.name, declared.origin, str(exc), INVALID_DEFINITION)
    return None


def _horizon(schedule: Schedule, max_catch_up: int) -> timedelta:
    key = (schedule.cron, schedule.every, schedule.timezone, max_catch_up)
    found = _horizons.get(key)
    if found is None:
        found = _horizons[key] = horizon(schedule, max_catch_up)
    return found


def _sync(
    alias: str, runnable: dict[str, DeclaredSchedule], states: dict[str, ScheduleRow], now: datetime, *, kept: set[str]
) -> None:
    """Write what changed in code: new schedules, changed definitions, schedules gone (inactive).

    A schedule left out for a problem (``kept``) is still declared: it keeps its state as it is
    (active, its window where it was), so once fixed its missed ticks are its ``catch_up``'s to decide.
    """
    new = [d for name, d in runnable.items() if name not in states]
    changed = [
        d
        for name, d in runnable.items()
        if name in states and (states[name].digest != d.digest or not states[name].active)
    ]
    gone = sorted(name for name, row in states.items() if row.active and name not in runnable and name not in kept)
    if not (new or changed or gone):
        return
    with transaction.atomic(using=alias):
        if new:
            sql.schedules.insert_states(alias, [_definition_row(d) for d in new], now)
        if changed:
            sql.schedules.sync_states(alias, [_definition_row(d) for d in changed], now)
        if gone:
            sql.schedules.deactivate(alias, gone, now)
    for d in new:  # first seen: its window starts now, nothing is due in this evaluation
        states[d.name] = ScheduleRow(d.name, d.digest, True, False, now, None)


def _definition_row(declared: DeclaredSchedule) -> tuple[str, str, dict[str, object], str]:
    return (declared.name, declared.task, declared.definition, declared.digest)


def _may_be_due(declared: DeclaredSchedule, known: _Known, row: ScheduleRow | None, now: datetime) -> bool:
    """Whether a tick may lie in the schedule's window, from the next tick kept in memory."""
    if row is None or row.paused or row.evaluated_until >= now:
        return False
    start = max(row.evaluated_until, now - known.horizon)
    window = known.window
    if window is None or window[0] > start:
        window = known.window = (start, next_tick(declared.schedule, start))
    return window[1] is not None and window[1] <= now


def _plan(
    schedules: list[DeclaredSchedule], locked: dict[str, sql.schedules.LockedState], now: datetime, max_catch_up: int
) -> tuple[list[tuple[str, PreparedJob]], dict[str, Advance]]:
    """Return the requests of the due ticks (by schedule, in name and tick order) and each schedule's advance."""
    prepared: list[tuple[str, PreparedJob]] = []
    advances: dict[str, Advance] = {}
    for declared in schedules:
        state = locked.get(declared.name)
        if state is None or state.paused or not state.active or state.evaluated_until >= now:
            continue
        known = _knowledge(declared, max_catch_up)
        start = max(state.evaluated_until, now - known.horizon)
        known.window = (now, next_tick(declared.schedule, now))
        due = due_ticks(
            declared.schedule, state.evaluated_until, now, max_catch_up=max_catch_up, schedule_horizon=known.horizon
        )
        advances[declared.name] = Advance(declared.name)
        if not due:
            missed = ticks(declared.schedule, start, now, limit=1)
            if missed:  # catch_up="skip" dropped the newest tick: older than 60 s
                advances[declared.name] = Advance(
                    declared.name, skip_at=missed[0], skip_reason="catch_up=skip: too late"
                )
            continue
        if declared.schedule.overlap == "skip":
            if state.previous_job_status in LIVE_STATUSES:
                reason = f"overlap=skip: job {state.last_job_id} is {state.previous_job_status}"
                advances[declared.name] = Advance(declared.name, skip_at=due[-1], skip_reason=reason)
                continue
            due = due[-1:]  # the newest: the others would overlap it
        for tick in due:
            try:
                prepared.append((declared.name, _request(declared, tick, known.horizon)))
            except (EnqueueValidationError, TypeError, ValueError) as exc:
                logger.error("Schedule tick refused name=%s tick=%s: %s", declared.name, tick.isoformat(), exc)
                advances[declared.name] = Advance(declared.name, skip_at=tick, skip_reason=f"refused: {exc}"[:200])
                break
    return prepared, advances


def _request(declared: DeclaredSchedule, tick: datetime, schedule_horizon: timedelta) -> PreparedJob:
    key = Idempotency(tick_key(declared.name, tick), scope=TICK_KEY_SCOPE, ttl=tick_key_ttl(schedule_horizon))
    return declared.prepare(key, tick)


def _enqueue(
    alias: str, prepared: list[tuple[str, PreparedJob]], advances: dict[str, Advance], ticked: list[tuple[str, str]]
) -> list[EnqueueResult]:
    """Enqueue the ticks in one batch, adding (schedule, outcome) for each to ``ticked``. A tick
    another definition of its schedule enqueued already (old and new code during a deploy) is that
    tick's job (outcome ``conflict``): it is left out and the rest resubmitted."""
    pending = list(prepared)
    while pending:
        try:
            results = enqueue_prepared([job for _, job in pending], using=alias)
        except EnqueueIdempotencyConflictError as exc:
            assert exc.ordinal is not None
            name, job = pending.pop(exc.ordinal)
            logger.warning("Schedule tick enqueued already by another definition name=%s job=%s", name, exc.job_id)
            _record(advances, name, job, exc.job_id)
            ticked.append((name, "conflict"))
            continue
        for (name, job), result in zip(pending, results, strict=True):
            _record(advances, name, job, result.job_id)
            ticked.append((name, result.outcome.value))
        return results
    return []


def _record(advances: dict[str, Advance], name: str, job: PreparedJob, job_id: int) -> None:
    previous = advances[name]
    if previous.tick is None or (job.scheduled_for is not None and job.scheduled_for >= previous.tick):
        advances[name] = replace(previous, tick=job.scheduled_for, job_id=job_id)
