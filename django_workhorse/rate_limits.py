"""Spend a named rate limit's budget outside a job: ``acquire`` and ``available``.

The budgets are the ones workers' claims spend (``WORKHORSE_RATE_LIMITS``, one row per limit and
partition): code that calls the provider directly and jobs under the same limit share it, exactly.
Usage: ``from django_workhorse import rate_limits; rate_limits.acquire("stripe", timeout=5)``.
``budgets`` and ``budget_totals`` are what ``workhorse_status``, the dashboard and the metrics show.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from django_workhorse import conf
from django_workhorse.admission.rate_limits import RateLimit, check_name, claim_parameter, configured
from django_workhorse.enqueueing.storable import check_text
from django_workhorse.exceptions import RateLimitTimeoutError, RateLimitValidationError
from django_workhorse.sql import rate_limits as statements

MAX_ACQUIRE_TIMEOUT = timedelta(days=1)
# The most budgets status and the dashboard list (partitions can be many; the metrics sum them).
MAX_LISTED_BUDGETS = 100


def acquire(
    name: str, partition: str | None = None, *, timeout: float | timedelta = 0, using: str = DEFAULT_DB_ALIAS
) -> None:
    """Spend one start of the budget of limit ``name`` (and ``partition``, for a partitioned limit).

    When the budget has none now, sleep until its next start is due and try again, for at most
    ``timeout`` (seconds or a timedelta, 0..1 day; 0 tries once), then raise
    ``RateLimitTimeoutError``. Each try is one statement on the budget's row. Raise
    ``RateLimitValidationError`` for an unknown name, a partition given to an unpartitioned limit
    or missing for a partitioned one, or a timeout out of bounds.
    """
    limit, key = _budget(name, partition)
    deadline = time.monotonic() + _seconds(timeout)
    while True:
        granted, wait = statements.acquire(using, name=name, partition=key, t=limit.interval_us, tau=limit.tolerance_us)
        if granted:
            return
        left = deadline - time.monotonic()
        if wait > left:
            raise RateLimitTimeoutError(name, partition, wait)
        time.sleep(wait)


def available(name: str, partition: str | None = None, *, using: str = DEFAULT_DB_ALIAS) -> int:
    """How many starts the budget of ``name`` (and ``partition``) has now, on the database's clock."""
    limit, key = _budget(name, partition)
    return statements.available(using, name=name, partition=key, t=limit.interval_us, tau=limit.tolerance_us)


def budgets(*, using: str | None = None, limit: int = MAX_LISTED_BUDGETS) -> list[statements.Budget]:
    """The budgets (one per limit, or per partition of a partitioned limit) with their counts and
    what each has available now, by name and partition; at most ``limit`` of them."""
    return statements.budgets(_read_alias(using), claim_parameter(), limit=limit)


def budget_totals(*, using: str | None = None) -> list[statements.Budget]:
    """Per limit name, its budgets summed (partitions counted in ``partitions``)."""
    return statements.budget_totals(_read_alias(using), claim_parameter())


def _read_alias(using: str | None) -> str:
    from django.db import router

    from django_workhorse.models import RateBudget

    return using or router.db_for_read(RateBudget)


def _budget(name: str, partition: str | None) -> tuple[RateLimit, str]:
    check_name(name, "name")
    limit = configured().get(name)
    if limit is None:
        raise RateLimitValidationError(field="name", bound="a name in WORKHORSE_RATE_LIMITS", value=name)
    if limit.partitioned != (partition is not None):
        bound = "given: the limit is partitioned" if limit.partitioned else "omitted: the limit is not partitioned"
        raise RateLimitValidationError(field="partition", bound=bound, value=partition)
    if partition is None:
        return limit, ""
    most = conf.MAX_RATE_PARTITION_BYTES
    return limit, check_text(partition, "partition", max_bytes=most, error=RateLimitValidationError)


def _seconds(given: float | timedelta) -> float:
    timeout: Any = given.total_seconds() if isinstance(given, timedelta) else given
    high = MAX_ACQUIRE_TIMEOUT.total_seconds()
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 <= timeout <= high:
        raise RateLimitValidationError(field="timeout", bound=f"seconds in 0..{high:g}", value=timeout)
    return float(timeout)
