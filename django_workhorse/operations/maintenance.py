"""Housekeeping: prune expired bindings, effect records, finished jobs and stale workers; reclaim leases."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from django.db import DatabaseError, router, transaction

from django_workhorse import sql
from django_workhorse.conf import app_settings
from django_workhorse.models import EffectRecord, IdempotencyBinding, Job, Workflow

logger = logging.getLogger(__name__)
PRUNE_CHUNK = 5000
# The lease one maintenance run holds (sql.leases). A run renews it before each step; a holder that
# died frees it after MAINTENANCE_LEASE, and a step that outlasts it may overlap the next run (every
# step is safe to run concurrently: they lock with SKIP LOCKED).
MAINTENANCE_LEASE_NAME = "maintenance"
MAINTENANCE_LEASE = timedelta(minutes=5)


@dataclass(frozen=True)
class MaintenanceReport:
    """What one maintenance run did; ``ran`` is False when another run held the lock."""

    ran: bool
    expired_bindings: int = 0
    reclaimed_jobs: int = 0
    finished_jobs: int = 0
    finished_workflows: int = 0
    stale_workers: int = 0
    expired_effects: int = 0


def prune_expired_bindings(*, using: str | None = None, chunk: int = PRUNE_CHUNK) -> int:
    """Delete expired bindings in chunks (each its own statement); return how many were deleted."""
    alias = using or router.db_for_write(IdempotencyBinding)
    return _in_chunks(lambda: sql.housekeeping.prune_expired_bindings(alias, limit=chunk), chunk, "expired bindings")


def prune_expired_effects(*, using: str | None = None, chunk: int = PRUNE_CHUNK) -> int:
    """Delete effect ledger entries past their retention in chunks; return how many were deleted.

    A repeat of a pruned operation runs its effect again, as a repeat of an expired one does.
    """
    alias = using or router.db_for_write(EffectRecord)
    return _in_chunks(lambda: sql.effects.prune_expired_effects(alias, limit=chunk), chunk, "expired effect records")


def prune_finished_jobs(
    *, older_than: timedelta | None = None, using: str | None = None, chunk: int = PRUNE_CHUNK
) -> int:
    """Delete jobs finished more than ``older_than`` ago (WORKHORSE_JOB_RETENTION, 14 days).

    A job whose key is still live (an idempotency or throttle window, a debounce cool-down) is kept
    until the key is free; free bindings go with their job. Chunks follow workhorse_job_finished_idx
    in (finished_at, id) order, each its own statement and transaction, each starting where the
    last one stopped; a job locked by anyone else is skipped (pruned by a later run), never waited for.
    """
    alias = using or router.db_for_write(Job)
    before, results_before = _cut_offs(older_than)
    total = 0
    cursor: sql.housekeeping.PruneCursor | None = sql.housekeeping.PruneCursor()
    while cursor is not None:
        deleted, cursor = sql.housekeeping.prune_finished_jobs(
            alias, before=before, results_before=results_before, limit=chunk, after=cursor
        )
        total += deleted
    logger.info("Pruned %s count=%s", "finished jobs", total)
    return total


def prune_finished_workflows(
    *, older_than: timedelta | None = None, using: str | None = None, chunk: int = PRUNE_CHUNK
) -> int:
    """Delete workflows whose every job finished more than ``older_than`` ago (WORKHORSE_JOB_RETENTION),
    whole: the workflow row, its jobs, their edges and history.

    A workflow is kept while any of its jobs is not finished, holds a result someone waits for and
    has not read within WORKHORSE_RESULT_RETENTION, or is locked by anyone else, and while its key is
    live. Chunks walk the workflow steps of workhorse_job_finished_idx as ``prune_finished_jobs``
    does, each chunk its own transaction.
    """
    alias = using or router.db_for_write(Workflow)
    before, results_before = _cut_offs(older_than)
    total = 0
    cursor: sql.housekeeping.PruneCursor | None = sql.housekeeping.PruneCursor()
    while cursor is not None:
        with transaction.atomic(using=alias):
            locked, cursor = sql.housekeeping.lock_finished_workflows(
                alias, before=before, results_before=results_before, limit=chunk, after=cursor
            )
            if locked:
                total += sql.housekeeping.delete_finished_workflows(
                    alias, workflow_ids=locked, before=before, results_before=results_before
                )
    logger.info("Pruned %s count=%s", "finished workflows", total)
    return total


def _cut_offs(older_than: timedelta | None) -> tuple[datetime, datetime]:
    """Jobs finished before the first may go; flagged unread results finished before the second."""
    now = datetime.now(timezone.utc)
    return now - (app_settings.JOB_RETENTION if older_than is None else older_than), now - app_settings.RESULT_RETENTION


def run_maintenance(*, using: str | None = None) -> MaintenanceReport:
    """Run every housekeeping step once, unless another process is running them right now.

    One run at a time holds the ``maintenance`` lease (a row, so it holds behind PgBouncer in
    transaction mode too; decision 0010); each step commits as it goes. The lease is renewed before
    each step, and a run that lost it (a step outlasted MAINTENANCE_LEASE and another run took
    over) stops there. Order matters: expired bindings go before the finished jobs they point to.
    """
    alias = using or router.db_for_write(Job)
    holder = sql.leases.take_lease(alias, MAINTENANCE_LEASE_NAME, MAINTENANCE_LEASE)
    if holder is None:
        return MaintenanceReport(ran=False)
    steps: dict[str, Callable[[], int]] = {
        "expired_bindings": lambda: prune_expired_bindings(using=alias),
        "reclaimed_jobs": lambda: sql.outcomes.reclaim_expired(alias),
        "finished_jobs": lambda: prune_finished_jobs(using=alias),
        "finished_workflows": lambda: prune_finished_workflows(using=alias),
        "stale_workers": lambda: sql.housekeeping.prune_stale_workers(alias, app_settings.WORKER_STALE_AFTER),
        "expired_effects": lambda: prune_expired_effects(using=alias),
    }
    done: dict[str, Any] = {}
    try:
        for i, (field, step) in enumerate(steps.items()):
            if i and not sql.leases.renew_lease(alias, MAINTENANCE_LEASE_NAME, holder, MAINTENANCE_LEASE):
                logger.warning("Maintenance lease lost before %s; another run carries on", field)
                break
            done[field] = step()
    except BaseException:
        try:
            sql.leases.give_back_lease(alias, MAINTENANCE_LEASE_NAME, holder)
        except DatabaseError:  # the step's error is the one to report; the lease expires instead
            logger.exception("Giving back the maintenance lease failed; it expires after %s", MAINTENANCE_LEASE)
        raise
    sql.leases.give_back_lease(alias, MAINTENANCE_LEASE_NAME, holder)
    return MaintenanceReport(ran=True, **done)


def _in_chunks(step: Callable[[], int], chunk: int, what: str) -> int:
    total = 0
    while (deleted := step()) > 0:
        total += deleted
        if deleted < chunk:
            break
    logger.info("Pruned %s count=%s", what, total)
    return total
