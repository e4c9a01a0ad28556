"""Housekeeping: prune expired bindings, effect records, finished jobs and stale workers; reclaim leases."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from django.db import router

from django_workhorse import sql
from django_workhorse.conf import app_settings
from django_workhorse.models import EffectRecord, IdempotencyBinding, Job

logger = logging.getLogger(__name__)
PRUNE_CHUNK = 5000


@dataclass(frozen=True)
class MaintenanceReport:
    """What one maintenance run did; ``ran`` is False when another run held the lock."""

    ran: bool
    expired_bindings: int = 0
    reclaimed_jobs: int = 0
    finished_jobs: int = 0
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
    before = datetime.now(timezone.utc) - (app_settings.JOB_RETENTION if older_than is None else older_than)
    total = 0
    cursor: sql.housekeeping.PruneCursor | None = sql.housekeeping.PruneCursor()
    while cursor is not None:
        deleted, cursor = sql.housekeeping.prune_finished_jobs(alias, before=before, limit=chunk, after=cursor)
        total += deleted
    logger.info("Pruned %s count=%s", "finished jobs", total)
    return total


def run_maintenance(*, using: str | None = None) -> MaintenanceReport:
    """Run every housekeeping step once, unless another process is running them right now.

    Order matters: expired bindings go before the finished jobs they point to.
    """
    alias = using or router.db_for_write(Job)
    with sql.housekeeping.maintenance_lock(alias) as taken:
        if not taken:
            return MaintenanceReport(ran=False)
        return MaintenanceReport(
            ran=True,
            expired_bindings=prune_expired_bindings(using=alias),
            reclaimed_jobs=sql.claims.reclaim_expired(alias),
            finished_jobs=prune_finished_jobs(using=alias),
            stale_workers=sql.housekeeping.prune_stale_workers(alias, app_settings.WORKER_STALE_AFTER),
            expired_effects=prune_expired_effects(using=alias),
        )


def _in_chunks(step: Callable[[], int], chunk: int, what: str) -> int:
    total = 0
    while (deleted := step()) > 0:
        total += deleted
        if deleted < chunk:
            break
    logger.info("Pruned %s count=%s", what, total)
    return total
