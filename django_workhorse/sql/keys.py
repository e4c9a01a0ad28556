"""SQL fragments shared by the statements that decide who owns a key.

Whether a binding still owns its key is defined once, as data (``key_lifetimes.FREED_BY``):
``FREE`` is generated from it for the SQL statements, and ``IdempotencyBinding.objects.free()``/
``.live()`` build their ORM filter from the same data (``models.free_binding_q``).
"""

from __future__ import annotations

from django_workhorse.enqueueing.key_lifetimes import FREED_BY, TERMINAL_JOB_STATUSES, FreedBy

TERMINAL = "(" + ", ".join(f"'{status}'" for status in TERMINAL_JOB_STATUSES) + ")"


def _freed_when(rule: FreedBy) -> str:
    """Return the SQL condition of ``rule`` over ``binding`` and ``job``, with a ``{now}`` placeholder."""
    terms = [f"job.status IN {TERMINAL}"] if rule.job_terminal else []
    terms += ["binding.expires_at <= {now}"] if rule.expired else []
    return " AND ".join(terms)


# Whether a binding (joined with its job) owns nothing any more, so the next request may take the
# key over. NULL (a timed key without expires_at) counts as "not free" wherever it is used.
FREE = (
    "CASE binding.mode"
    + "".join(f"\n    WHEN '{mode}' THEN {_freed_when(rule)}" for mode, rule in FREED_BY.items())
    + " END"
)
# Where the bound job is, for debounce: 'open' (queued, never started, window open: replaceable),
# 'due' (queued, never started, window elapsed: a worker is about to take it) or 'started'.
JOB_STATE = """CASE WHEN job.status <> 'queued' OR job.attempt > 0 THEN 'started'
    WHEN job.run_at > {now} THEN 'open' ELSE 'due' END"""
BINDING_COLUMNS = "binding.job_id, binding.mode, binding.request_digest, binding.field_digests, {free}, {state}"
