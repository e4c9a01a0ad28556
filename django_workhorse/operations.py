"""Operator actions not covered elsewhere: run scheduled jobs now, release keys.

Cancel, redrive and purge live in ``cancellation``, ``dead_letters`` and ``maintenance``. Every
action records who asked in the affected job's events.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import router

from django_workhorse import sql
from django_workhorse.conf import app_settings
from django_workhorse.models import IdempotencyBinding, Job


def run_now(job_ids: Sequence[int], *, requested_by: str = "", using: str | None = None) -> list[int]:
    """Make the given queued, scheduled jobs due now and wake the workers; return the ids moved."""
    alias = using or router.db_for_write(Job)
    return sql.run_now(alias, job_ids, requested_by, app_settings.NOTIFY_CHANNEL)


def release_bindings(binding_ids: Sequence[int], *, requested_by: str = "", using: str | None = None) -> list[int]:
    """Delete the given bindings, so their keys are free at once; return the ids of the jobs they named.

    The jobs themselves are untouched; the next request with a released key creates a new job.
    """
    alias = using or router.db_for_write(IdempotencyBinding)
    return sql.release_bindings(alias, binding_ids, requested_by)
