"""Named rate limits (``WORKHORSE_RATE_LIMITS``): their definition, and what a claim is told of them.

Importable before Django's apps are ready (settings build ``RateLimit`` values). The budgets
themselves are rows (``RateBudget``) that every claim spends in one statement (decision 0021);
``operations.rate_limits`` spends them outside a job.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django_workhorse import conf
from django_workhorse.admission.bounds import check_boolean, check_duration, check_integer
from django_workhorse.exceptions import RateLimitValidationError

logger = logging.getLogger(__name__)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` attempts start per ``per`` (plus ``burst`` more), across every worker.

    Enforced by the generic cell rate algorithm on PostgreSQL's clock: starts are spaced by the
    emission interval ``per / limit`` (rounded up to a whole microsecond), and up to ``burst``
    starts may come early. Over any window of length ``per``, at most ``limit + burst`` start.
    ``partitioned=True`` gives each ``rate_partition`` (an account, a tenant) a budget of its own.

    Raise ``RateLimitValidationError`` naming the field and its bound if a value is out of bounds.
    """

    limit: int
    per: timedelta = timedelta(seconds=1)
    burst: int = 0
    partitioned: bool = False

    def __post_init__(self) -> None:
        check_integer(self.limit, "limit", conf.MIN_RATE_LIMIT, conf.MAX_RATE_LIMIT, RateLimitValidationError)
        check_duration(self.per, "per", conf.MIN_RATE_PER, conf.MAX_RATE_PER, RateLimitValidationError)
        check_integer(self.burst, "burst", conf.MIN_RATE_BURST, conf.MAX_RATE_BURST, RateLimitValidationError)
        check_boolean(self.partitioned, "partitioned", RateLimitValidationError)

    @property
    def interval_us(self) -> int:
        """The emission interval in microseconds, rounded up (so the rate is never exceeded)."""
        return math.ceil((self.per // _MICROSECOND) / self.limit)

    @property
    def tolerance_us(self) -> int:
        """How early a start may come, in microseconds: ``burst`` intervals."""
        return self.burst * self.interval_us


def check_name(value: Any, field: str = "rate_limit") -> str:
    """Return ``value`` if it is a name of at most MAX_RATE_LIMIT_NAME_CHARS characters, without NUL."""
    bound = f"a non-empty string of at most {conf.MAX_RATE_LIMIT_NAME_CHARS} characters, without NUL"
    if not isinstance(value, str) or not 1 <= len(value) <= conf.MAX_RATE_LIMIT_NAME_CHARS or "\x00" in value:
        raise RateLimitValidationError(field=field, bound=bound, value=value)
    return value


def settings_errors(value: Any) -> list[str]:
    """What is wrong with a WORKHORSE_RATE_LIMITS value (nothing: an empty list)."""
    if not isinstance(value, Mapping):
        return [f"must be a dict of names to RateLimit values, got {type(value).__name__}"]
    errors = []
    for name, limit in value.items():
        try:
            check_name(name, "name")
        except RateLimitValidationError as exc:
            errors.append(f"has a bad name: {exc}")
            continue
        if not isinstance(limit, RateLimit):
            errors.append(f"[{name!r}] must be a RateLimit, got {type(limit).__name__}")
    return errors


def configured() -> Mapping[str, RateLimit]:
    """The well-formed limits of WORKHORSE_RATE_LIMITS (a malformed entry is left out; checks say so)."""
    from django_workhorse.conf import app_settings

    value: Any = app_settings.RATE_LIMITS
    if not isinstance(value, Mapping):
        return {}
    return {name: limit for name, limit in value.items() if isinstance(name, str) and isinstance(limit, RateLimit)}


# The claim's parameter, built once per settings value (conf keeps a setting's value until it changes).
_parameters: dict[int, tuple[Any, str]] = {}


# How far ahead of its conformance instant a worker's claim admits a job (decision 0021, "Admitted
# ahead"): the job is recorded as started at that instant, and its executor waits for it before
# the handler runs. Without it a strictly spaced budget (burst 0) loses each claim's lateness: one
# start per claim, 40% of a 1,000/s limit across two processes. Claims of one job (eager mode, run
# now) admit nothing ahead: their caller does not wait.
ADMIT_AHEAD = timedelta(milliseconds=50)
ADMIT_AHEAD_US = ADMIT_AHEAD // timedelta(microseconds=1)


def claim_parameter() -> str:
    """The configured limits as the claim's one jsonb parameter: {name: {"t": interval, "tau": tolerance}}
    in microseconds."""
    from django_workhorse.conf import app_settings

    value = app_settings.RATE_LIMITS
    cached = _parameters.get(id(value))
    if cached is not None and cached[0] is value:
        return cached[1]
    limits = configured()
    text = json.dumps({name: {"t": limit.interval_us, "tau": limit.tolerance_us} for name, limit in limits.items()})
    _parameters.clear()
    _parameters[id(value)] = (value, text)
    return text


# Names of limits that jobs named but settings do not define, logged once per process.
_unknown_logged: set[str] = set()


def claimed(jobs: Iterable[Any]) -> None:
    """Log once per name per process that claimed jobs run unlimited: their limit is not in settings."""
    names = {job.rate_limit for job in jobs if job.rate_limit is not None} - _unknown_logged
    if not names:
        return
    limits = configured()
    for name in sorted(names):
        if name not in limits:
            _unknown_logged.add(name)
            logger.warning(
                "Rate limit %r is not in WORKHORSE_RATE_LIMITS: its jobs run unlimited (logged once per process)", name
            )
