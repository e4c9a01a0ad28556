"""Rate budgets (decision 0021, "Rate limits"): the grant every claim makes, a start spent outside a
job, what is available now, and the budgets as status and metrics show them.

A budget row (workhorse_rate_budget, one per limit and partition) holds the generic cell rate
algorithm's theoretical arrival time ``tat``. With emission interval T and tolerance tau (both in
microseconds, from the limit's definition), n starts asked for at ``now`` are granted
k = least(n, floor((now + tau - greatest(tat, now)) / T) + 1), at least 0, and the row moves to
tat = greatest(tat, now) + k*T. Every write is ``INSERT ... ON CONFLICT (name, partition) DO
UPDATE``: its SET sees the latest committed version of the row (a concurrent claim's write is
waited for, never raced), so two statements never spend one start. ``reserved_until`` is the first
conformance slot not yet promised to a held job: held jobs get consecutive slots from
greatest(reserved_until, tat - tau) on, one interval apart, and come back one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_workhorse.sql.connection import execute

MICROSECOND = "interval '1 microsecond'"


def granted(n: str, now: str, tat: str, t: str, tau: str) -> str:
    """The GCRA grant: how many of ``n`` starts asked for at ``now`` conform, given the row's ``tat``
    (SQL expressions; ``t`` and ``tau`` in microseconds)."""
    behind = f"extract(epoch FROM {now} - greatest({tat}, {now})) * 1000000"
    return f"least({n}, greatest(0, floor(({behind} + {tau}) / {t}) + 1))::integer"


def moved(now: str, tat: str, t: str, k: str) -> str:
    """The row's next ``tat`` after ``k`` grants at ``now``."""
    return f"greatest({tat}, {now}) + ({k})::bigint * {t} * {MICROSECOND}"


def reserved(reserved_until: str, next_tat: str, t: str, tau: str, held: str) -> str:
    """The reservation tail after ``held`` more jobs were given slots."""
    return f"greatest({reserved_until}, {next_tat} - {tau} * {MICROSECOND}) + ({held})::bigint * {t} * {MICROSECOND}"


# The limit's interval and tolerance, read from the one jsonb parameter by a name expression.
def interval_of(name: str, parameter: str = "%(rate_limits)s") -> str:
    return f"({parameter}::jsonb -> {name} ->> 't')::bigint"


def tolerance_of(name: str, parameter: str = "%(rate_limits)s") -> str:
    return f"({parameter}::jsonb -> {name} ->> 'tau')::bigint"


_K = granted("1", "EXCLUDED.changed_at", "budget.tat", "%(t)s", "%(tau)s")

# acquire: spend one start of a budget now, if it conforms; answer whether it was granted and how
# many seconds from now the next start conforms (the wait before trying again). A refused acquire
# counts as deferred and reserves nothing.
ACQUIRE = f"""
INSERT INTO workhorse_rate_budget AS budget (name, partition, tat, reserved_until, granted, admitted, deferred,
                                             changed_at)
VALUES (%(name)s, %(partition)s, clock_timestamp() + %(t)s * {MICROSECOND}, NULL, 1, 1, 0, clock_timestamp())
ON CONFLICT (name, partition) DO UPDATE
SET granted = {_K},
    tat = {moved("EXCLUDED.changed_at", "budget.tat", "%(t)s", _K)},
    admitted = budget.admitted + {_K},
    deferred = budget.deferred + 1 - {_K},
    changed_at = EXCLUDED.changed_at
RETURNING budget.granted,
          extract(epoch FROM budget.tat - %(tau)s * {MICROSECOND} - clock_timestamp())::float8
"""

# available: how many starts would conform now (a full budget when it has no row yet).
AVAILABLE = f"""
SELECT coalesce((SELECT {granted("%(most)s", "clock_timestamp()", "budget.tat", "%(t)s", "%(tau)s")}
                 FROM workhorse_rate_budget AS budget
                 WHERE budget.name = %(name)s AND budget.partition = %(partition)s), %(most)s)
"""

# What a budget row has available now under its configured limit (%(limits)s; NULL for a limit no
# longer configured): a full budget is 1 + burst starts.
_T_OF_ROW, _TAU_OF_ROW = interval_of("budget.name", "%(limits)s"), tolerance_of("budget.name", "%(limits)s")
_AVAILABLE_NOW = (
    f"CASE WHEN {_T_OF_ROW} IS NULL THEN NULL "
    f"ELSE {granted(f'{_TAU_OF_ROW} / {_T_OF_ROW} + 1', 'clock_timestamp()', 'budget.tat', _T_OF_ROW, _TAU_OF_ROW)} END"
)

# budgets: the budget rows, with what each has available now, by name and partition; at most
# %(limit)s rows (workhorse_rate_budget_name_partition_uniq gives the order).
BUDGETS = f"""
SELECT budget.name, budget.partition, budget.admitted, budget.deferred, {_AVAILABLE_NOW}, budget.changed_at
FROM workhorse_rate_budget AS budget
ORDER BY budget.name, budget.partition
LIMIT %(limit)s
"""

# budget_totals: per limit name, its partitions summed (what the metrics gauges show).
BUDGET_TOTALS = f"""
SELECT budget.name, count(*), sum(budget.admitted)::bigint, sum(budget.deferred)::bigint,
       sum({_AVAILABLE_NOW})::bigint
FROM workhorse_rate_budget AS budget
GROUP BY budget.name
ORDER BY budget.name
"""


@dataclass(frozen=True)
class Budget:
    """One budget (a limit's, or one partition's; ``partitions`` of them summed in totals) as status,
    the dashboard and the metrics show it; ``available`` is None when its limit is not configured."""

    name: str
    partition: str
    admitted: int
    deferred: int
    available: int | None
    changed_at: datetime | None = None
    partitions: int = 1

    def as_json(self) -> dict[str, object]:
        """Return a JSON-ready dict (instants in ISO 8601)."""
        return {
            "name": self.name,
            "partition": self.partition,
            "admitted": self.admitted,
            "deferred": self.deferred,
            "available": self.available,
            "changed_at": self.changed_at.isoformat() if self.changed_at else None,
        }


def acquire(alias: str, *, name: str, partition: str, t: int, tau: int) -> tuple[bool, float]:
    """Run ACQUIRE; return (granted, seconds until the next start conforms)."""
    row = execute(alias, ACQUIRE, {"name": name, "partition": partition, "t": t, "tau": tau})[0]
    return bool(row[0]), max(0.0, float(row[1]))


def available(alias: str, *, name: str, partition: str, t: int, tau: int) -> int:
    """Run AVAILABLE."""
    params = {"name": name, "partition": partition, "t": t, "tau": tau, "most": tau // t + 1}
    return int(execute(alias, AVAILABLE, params)[0][0])


def budgets(alias: str, limits_json: str, *, limit: int) -> list[Budget]:
    """Run BUDGETS with the configured limits (``claim_parameter``'s jsonb)."""
    rows: Sequence[Sequence[Any]] = execute(alias, BUDGETS, {"limits": limits_json, "limit": limit})
    return [
        Budget(name, partition, admitted, deferred, available, changed)
        for name, partition, admitted, deferred, available, changed in rows
    ]


def budget_totals(alias: str, limits_json: str) -> list[Budget]:
    """Run BUDGET_TOTALS: one Budget per limit name (``partition`` empty, ``partitions`` counted)."""
    rows: Sequence[Sequence[Any]] = execute(alias, BUDGET_TOTALS, {"limits": limits_json})
    return [
        Budget(name, "", admitted, deferred, available, partitions=n) for name, n, admitted, deferred, available in rows
    ]
