"""Housekeeping: purge queued jobs (releasing their keys) and prune expired bindings."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import router

from django_workhorse import sql
from django_workhorse.exceptions import WorkhorseError
from django_workhorse.models import IdempotencyBinding, Job

logger = logging.getLogger(__name__)
PRUNE_CHUNK = 5000


def purge(*, queue: str | None = None, job_ids: Sequence[int] | None = None, using: str | None = None) -> int:
    """Delete queued jobs of ``queue`` (or the given ids) and release their keys at once.

    Running and finished jobs are never purged. Return how many jobs were deleted. Raise
    ``WorkhorseError`` if neither ``queue`` nor ``job_ids`` is given, so nothing is purged by accident.
    """
    if queue is None and job_ids is None:
        raise WorkhorseError("purge() needs queue= or job_ids=")
    count = sql.purge_queued(using or router.db_for_write(Job), queue=queue, job_ids=job_ids)
    logger.info("Purged queued jobs count=%s queue=%s", count, queue)
    return count


def prune_expired_bindings(*, using: str | None = None, chunk: int = PRUNE_CHUNK) -> int:
    """Delete expired bindings in chunks (each its own statement); return how many were deleted."""
    alias = using or router.db_for_write(IdempotencyBinding)
    total = 0
    while (deleted := sql.prune_expired_bindings(alias, limit=chunk)) > 0:
        total += deleted
        if deleted < chunk:
            break
    logger.info("Pruned expired bindings count=%s", total)
    return total
