"""Every raw SQL statement of django-workhorse, and the thin functions that run them.

PostgreSQL-specific SQL lives in this package and nowhere else (a test enforces it), one module per
concern, and callers name the concern: ``sql.enqueue`` (enqueue), ``sql.claims`` (the worker:
claims, lease extension, checkpoints), ``sql.capability`` (jobs no live worker can run: their hold and return), ``sql.outcomes`` (what ends a worker's hold: outcomes, release at a stop, reclaim), ``sql.releases`` (the release of workflow steps, a fragment of those), ``sql.actions`` (operator actions), ``sql.awaiting`` (waits on results: the flag, the reads, the result notifications), ``sql.breakers`` (circuit breakers' state), ``sql.housekeeping``
(purge, pruning, the worker registry), ``sql.leases`` (named leases: the maintenance lease), ``sql.effects`` (the effect ledger),
``sql.http_records`` (``@idempotent`` views' records, on the ledger's table), ``sql.schedules`` (periodic schedules' state), ``sql.queues`` (queue control), ``sql.rate_limits`` (rate budgets),
``sql.workflows`` (workflows: their enqueue and lookup), ``sql.workflow_control`` (a workflow's cancellation and state), ``sql.steps`` (what a step's handler reads of its workflow), ``sql.keys`` (the fragments that decide who owns a key), ``sql.rekey`` (key rotation: envelopes by key id), ``sql.poolers`` (whether a pooler
forwards prepared statements) and ``sql.connection`` (how statements
run, and LISTEN). Each statement is a named constant with a comment saying what it does and which
constraint or index it relies on. Parameters are always bound (``%(name)s``), never formatted in.
"""

from __future__ import annotations

from django_workhorse.sql import (
    actions,
    awaiting,
    breakers,
    capability,
    claims,
    connection,
    effects,
    enqueue,
    housekeeping,
    http_records,
    keys,
    leases,
    outcomes,
    poolers,
    queues,
    rate_limits,
    rekey,
    releases,
    schedules,
    steps,
    workflow_control,
    workflows,
)

__all__ = [
    "actions",
    "awaiting",
    "breakers",
    "capability",
    "claims",
    "connection",
    "effects",
    "enqueue",
    "housekeeping",
    "http_records",
    "keys",
    "leases",
    "outcomes",
    "poolers",
    "queues",
    "rate_limits",
    "rekey",
    "releases",
    "schedules",
    "steps",
    "workflow_control",
    "workflows",
]
