"""Operator actions not covered elsewhere: run scheduled jobs now, release keys.

Cancel, redrive and purge live in ``cancellation``, ``dead_letters`` and ``maintenance``. Every
action records who asked in the affected job's events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import router

from django_workhorse import conf, sql
from django_workhorse.conf import app_settings
from django_workhorse.models import IdempotencyBinding, Job
from django_workhorse.storable import check_ids, check_text


def run_now(job_ids: Sequence[int], *, requested_by: str = "", using: str | None = None) -> list[int]:
    """Make the given queued, scheduled jobs due now and wake the workers; return the ids moved.

    Raise ``InvalidArgumentError`` unless ``job_ids`` is a sequence of ints (a string is not).
    """
    ids = check_ids(job_ids, "job_ids")
    alias = using or router.db_for_write(Job)
    return sql.run_now(alias, ids, check_requested_by(requested_by), app_settings.NOTIFY_CHANNEL)


def release_bindings(binding_ids: Sequence[int], *, requested_by: str = "", using: str | None = None) -> list[int]:
    """Delete the given bindings, so their keys are free at once; return the ids of the jobs they named.

    The jobs themselves are untouched; the next request with a released key creates a new job.
    Raise ``InvalidArgumentError`` unless ``binding_ids`` is a sequence of ints.
    """
    ids = check_ids(binding_ids, "binding_ids")
    alias = using or router.db_for_write(IdempotencyBinding)
    return sql.release_bindings(alias, ids, check_requested_by(requested_by))


def check_requested_by(value: Any) -> str:
    """Check who asked for an operator action: storable text of at most 200 characters ("" allowed)."""
    return check_text(value, "requested_by", max_chars=conf.MAX_REQUESTED_BY_CHARS, allow_empty=True)
