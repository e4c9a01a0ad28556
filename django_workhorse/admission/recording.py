"""Turn finished attempts into circuit breaker verdicts, and report every breaker transition.

The worker calls :func:`record_attempts` after it wrote a batch of outcomes (one statement, and
none when no job of the batch runs behind a breaker); ``HandlerContext.open_breaker`` and the
operator's reset write through ``sql.breakers`` too and report here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django_workhorse import sql
from django_workhorse.admission.breakers import DEFAULT_BREAKER, FAILURE, SUCCESS, Breaker, verdict
from django_workhorse.exceptions import HandlerNotRegisteredError
from django_workhorse.observability import instruments
from django_workhorse.observability.log_fields import printable
from django_workhorse.tasks.registry import get_handler

if TYPE_CHECKING:
    from django_workhorse.sql.claims import ClaimedJob

logger = logging.getLogger(__name__)


def policy_for(job_type: str) -> Breaker:
    """The breaker policy of ``job_type``'s jobs: its task's ``breaker=``, else the default ``Breaker()``."""
    try:
        breaker = get_handler(job_type).breaker
    except HandlerNotRegisteredError:
        breaker = None
    return breaker or DEFAULT_BREAKER


def record_attempts(alias: str, attempts: Iterable[tuple[ClaimedJob, str, str, str]]) -> list[sql.breakers.Transition]:
    """Apply the verdicts of finished attempts ``(job, written status, outcome kind, error)`` to their breakers.

    Only jobs with a breaker key count, by ``breakers.verdict``; nothing runs when none does.
    """
    batch: dict[str, dict[str, Any]] = {}
    for job, status, kind, error in attempts:
        if job.breaker_key is None:
            continue
        counted = verdict(status, kind, error)
        if counted is None:
            continue
        entry = batch.setdefault(
            job.breaker_key,
            {"key": job.breaker_key, "failures": 0, "succeeded": False, "policy": policy_for(job.job_type).to_json()},
        )
        if counted == FAILURE:
            entry["failures"] += 1
        elif counted == SUCCESS:
            entry["succeeded"] = True
    if not batch:
        return []
    transitions = sql.breakers.record_verdicts(alias, list(batch.values()))
    report(transitions)
    return transitions


def report(transitions: Sequence[sql.breakers.Transition]) -> None:
    """Log and count each transition: WARNING when a breaker opens, INFO otherwise."""
    for transition in transitions:
        instruments.breaker_transitioned(transition.to_state)
        level = logging.WARNING if transition.to_state == "open" else logging.INFO
        logger.log(
            level,
            "Circuit breaker %s key=%s from=%s reason=%s cooldown=%s released=%s",
            transition.to_state,
            printable(transition.key),
            transition.from_state,
            transition.reason,
            transition.cooldown_seconds,
            transition.released,
            extra={"breaker": transition.key, "breaker_state": transition.to_state},
        )


def claimed(jobs: Iterable[ClaimedJob]) -> None:
    """Report the breakers a claim moved from open to half-open (their first canary)."""
    half_opened = [
        sql.breakers.Transition(job.breaker_key, "open", "half_open", f"cooldown over, canary job id={job.id}")
        for job in jobs
        if job.half_opened and job.breaker_key is not None
    ]
    if half_opened:
        report(half_opened)
