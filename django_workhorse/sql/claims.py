"""The worker's statements: claim (with concurrency slots), extend leases, and checkpoints (what
ends a hold on a job, outcomes, release and reclaim, is in sql.outcomes)."""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, OperationalError, connections, transaction

from django_workhorse.conf import app_settings
from django_workhorse.models import JOB_CONCURRENCY_SLOT_UNIQ
from django_workhorse.sql import rate_limits
from django_workhorse.sql.breakers import appended_transition
from django_workhorse.sql.connection import constraint_name, decode_json, execute

# claim: lease up to %(limit)s ready jobs of the given queues in priority DESC, run_at, id order,
# skipping rows other workers hold. A paused queue (a workhorse_queue row, by its primary key) is
# left out before its jobs are read: pausing costs the claim one key lookup per queue asked for.
# Each queue is read through workhorse_job_ready_idx (queue, priority DESC, run_at, id) in exactly its order; the best %(limit)s of those candidates win, so
# the order holds across queues too. Each claim gets a fresh lease token.
#
# Concurrency keys: a job with a concurrency key runs in one of its key's slots 1..limit, and the
# partial unique index workhorse_job_concurrency_slot_uniq over running jobs is what holds the
# line: two workers that pick the same free slot at once cannot both commit (the second gets a
# unique violation and claims again). A key whose slots are all taken is skipped in the scan, so
# its queued jobs never block the jobs behind them. Jobs leave the index by leaving 'running'.
# A claim considers a key only while it holds that key's transaction-level advisory lock (tried,
# never waited for): two claims never take slots of one key at once, so they cannot deadlock on the
# slot index; what is left is a claim whose snapshot predates another's commit, which the index
# refuses at once. Its rows are locked in claim order, not id order: SKIP LOCKED never waits for a
# job row, so that order cannot take part in a deadlock on them.
#
# The answer is the claimed jobs and, when candidates were held, one more row (its id NULL) with how
# many: a claim that held some may have left ready jobs behind them, so the worker claims again
# at once instead of waiting for the poll interval.
#
# Circuit breakers (decision 0021): a candidate without a breaker_key is admitted as before (one
# NULL test). One with a key whose breaker row is missing or closed is admitted too; the others
# (``gated``) get a verdict. Open with open_until in the future: held until open_until. Open past
# its cooldown, or half-open: the first candidate of the key in claim order may take a canary
# slot, by a conditional UPDATE of the breaker row (``canaries``); under READ COMMITTED a claim
# that finds the row updated by a concurrent one waits for it and re-checks the condition on the
# committed version (EvalPlanQual), so no two claims spend one slot. A breaker that closed meanwhile
# admits it as well. Every other gated candidate is held until now + the breaker's cooldown. A held
# job stays queued with its attempt untouched, run_at moved to the instant its verdict may change,
# held_since set and a 'held' event written: it leaves the ready index's due range. Concurrency
# slots are counted over admitted candidates only. A half-open breaker whose canaries sent no
# verdict for its cooldown plus this lease (their worker died) admits a new round. The breaker row
# is locked after the job rows, the reverse of sql.breakers' closing write, which therefore skips
# locked jobs rather than wait for them.
CONCURRENCY_LOCK_CLASS = 0x776F726B  # "work": the first half of two-int advisory lock ids
# A job's trace context as a claim reads it: as stored when it is as small as enqueue writes it (a
# traceparent and at most 512 characters of tracestate), else its traceparent only (bounded), so a
# value written some other way never crosses the wire whole on every attempt.
MAX_TRACE_CONTEXT_BYTES = 2048
MAX_TRACEPARENT_CHARS = 128
BOUNDED_TRACE_CONTEXT = (
    f"CASE WHEN job.trace_context IS NULL OR octet_length(job.trace_context::text) <= {MAX_TRACE_CONTEXT_BYTES} "
    f"THEN job.trace_context ELSE jsonb_strip_nulls(jsonb_build_object('traceparent', "
    f"left(job.trace_context->>'traceparent', {MAX_TRACEPARENT_CHARS}))) END"
)
# The columns of CLAIM's ``claimed`` answer (ClaimedJob's fields, bar claimed_at, plus the order columns).
CLAIMED_COLUMNS = 24
# A candidate's concurrency key has a free slot (see above), tried while scanning so that a key whose
# slots are all taken never blocks the jobs behind it.
FREE_CONCURRENCY_KEY = f"""CASE WHEN concurrency_key IS NULL THEN true
                   ELSE pg_try_advisory_xact_lock({CONCURRENCY_LOCK_CLASS}, hashtext(concurrency_key))
                        AND (SELECT count(*) FROM workhorse_job AS running
                         WHERE running.status = 'running' AND running.concurrency_key = job.concurrency_key)
                        < job.concurrency_limit END"""
CANDIDATE_COLUMNS = (
    "id, priority, run_at, concurrency_key, concurrency_limit, breaker_key, rate_limit, rate_partition, held_since"
)
# The first partition key of a fair queue after ``after`` with ready work (a key whose jobs are all
# scheduled later is passed over inside the index: run_at is one of its columns).
NEXT_FAIR_KEY = """SELECT min(partition_key) AS key FROM workhorse_job
             WHERE status = 'queued' AND partition_key IS NOT NULL AND queue = visited.queue
               AND partition_key > {after} AND run_at <= clock_timestamp()"""
# Fair queues (decision 0021, "Fair share"): %(fair_queues)s, each with %(fair_after)s, the partition
# key this worker's previous claim of it ended at ('' at first), and %(fair_unkeyed)s, whether to
# look for its jobs without a partition key. ``fair_keys`` is a loose index scan over
# workhorse_job_fair_ready_idx: one index descent per key with ready work, in key order from just
# after the cursor, wrapping round to the first key, each key once, at most limit - U keys (U the
# fair queues whose unkeyed jobs are looked for; at least one key). Each key gives its head: at most
# ``share`` = ceil(limit / (keys + U)) jobs in claim order. A fair queue's unkeyed jobs are one more
# key, read through the ready index past the queue's keyed jobs (as many as precede them), so the
# worker looks for them only while it finds some, and otherwise once per recheck interval
# (admission.fair). A claim of a fair queue with more keys than its batch takes one job from each
# of the next keys, and none is cut by the final LIMIT. The recursion is only as deep as the keys
# it finds. A worker without fair queues runs the statements without this part (CLAIM, CLAIM_RATED,
# below); with an empty %(fair_queues)s it would seed nothing, but its set-up still costs a claim.
# Rate limits (decision 0021, "Rate limits"; the grant is sql.rate_limits'): admitted candidates whose
# rate_limit is configured (%(rate_limits)s, the limits as one jsonb parameter; a name missing from
# it runs unlimited) are grouped per budget in claim order (``metered``, ``demand``); one upsert
# per budget (``budgets``) grants the first k and moves the row; the others are held (``refused``, ``held``)
# at consecutive slots of the budget's reservation tail, one emission interval apart, so a backlog
# comes back one job per slot. The grants are the starts that conform by now + %(rate_ahead)s; a
# granted job's started_at is its conformance instant (the i-th of k: tat - (k - i + 1)*T - tau,
# tat the row's new one), or now if that has passed: the instants the budget counted. The upsert proposes the fresh row's values; its DO UPDATE reads
# the demand and the instant back from EXCLUDED (n = admitted + deferred, now = changed_at).
_US = rate_limits.MICROSECOND
_T_OF_RATE_LIMIT = rate_limits.interval_of("rate_limit")
_T_OF_NAME, _TAU_OF_NAME = rate_limits.interval_of("name"), rate_limits.tolerance_of("name")
# A claim grants the starts that conform by now + %(rate_ahead)s (microseconds; admitted ahead).
_AHEAD = "%(rate_ahead)s::bigint"
# A budget's first row: a full budget at now.
_FRESH_K = rate_limits.granted("n", "now", "now", "t", f"(tau + {_AHEAD})")
_FRESH_TAT = rate_limits.moved("now", "now", "t", _FRESH_K)
_FRESH_RESERVED = rate_limits.reserved("NULL", _FRESH_TAT, "t", "tau", f"n - {_FRESH_K}")
# The next version of a budget's row, from the latest committed one (budget.*) and EXCLUDED.
_T, _TAU = rate_limits.interval_of("EXCLUDED.name"), rate_limits.tolerance_of("EXCLUDED.name")
_N = "(EXCLUDED.admitted + EXCLUDED.deferred)"
_K = rate_limits.granted(_N, "EXCLUDED.changed_at", "budget.tat", _T, f"({_TAU} + {_AHEAD})")
_NEXT_TAT = rate_limits.moved("EXCLUDED.changed_at", "budget.tat", _T, _K)
# Held again: a job that came back at its slot and still found no start (another claim, or its
# worker's lateness, took it). The first of a claim takes the budget's next conformance instant,
# ahead of the tail, so that an instant lost to lateness is not lost to the budget's use too;
# the others go to the tail's end, so that jobs held again never crowd one instant.
_HEAD = (
    "(SELECT least(count(*), 1) FROM metered WHERE metered.name = EXCLUDED.name "
    f"AND metered.part = EXCLUDED.partition AND metered.reheld AND metered.nth > {_K})"
)
_NEXT_RESERVED = rate_limits.reserved(
    "budget.reserved_until", f"{_NEXT_TAT} + {_HEAD} * {_T} * {_US}", _T, _TAU, f"{_N} - {_K} - {_HEAD}"
)
_CLAIM_TEMPLATE = f"""
WITH RECURSIVE fair AS (
    SELECT asked.queue, asked.after, asked.unkeyed
    FROM unnest(%(fair_queues)s::text[], %(fair_after)s::text[], %(fair_unkeyed)s::boolean[]) AS asked(queue, after, unkeyed)
    WHERE NOT EXISTS (SELECT 1 FROM workhorse_queue AS paused WHERE paused.queue = asked.queue AND paused.paused)
),
fair_keys(queue, after, key, n, wrapped) AS (
    SELECT queue, after, after, 0, false FROM fair
    UNION ALL
    SELECT visited.queue, visited.after, step.key, visited.n + 1, step.wrapped
    FROM fair_keys AS visited, LATERAL (
        (SELECT later.key, visited.wrapped FROM ({NEXT_FAIR_KEY.format(after="visited.key")}) AS later
         WHERE later.key IS NOT NULL AND (NOT visited.wrapped OR later.key <= visited.after))
        UNION ALL
        (SELECT lowest.key, true FROM ({NEXT_FAIR_KEY.format(after="''")}) AS lowest
         WHERE NOT visited.wrapped AND lowest.key <= visited.after)
        LIMIT 1
    ) AS step
    WHERE visited.n < greatest(%(limit)s - (SELECT count(*) FROM fair WHERE unkeyed), 1)
),
fair_share AS (
    SELECT ceil(%(limit)s::numeric / greatest(count(*) + (SELECT count(*) FROM fair WHERE unkeyed), 1))::int AS share
    FROM fair_keys WHERE n > 0
),
candidates AS (
    SELECT pool.* FROM (
    SELECT ready.id, ready.priority, ready.run_at, ready.concurrency_key, ready.concurrency_limit, ready.breaker_key,
           ready.rate_limit, ready.rate_partition, ready.held_since
    FROM (SELECT queue FROM unnest(%(queues)s::text[]) AS asked(queue)
          WHERE NOT EXISTS (SELECT 1 FROM workhorse_queue AS paused
                            WHERE paused.queue = asked.queue AND paused.paused)) AS wanted,
    LATERAL (
        SELECT {CANDIDATE_COLUMNS} FROM workhorse_job AS job
        WHERE status = 'queued' AND queue = wanted.queue AND run_at <= clock_timestamp()
          AND {FREE_CONCURRENCY_KEY}
        ORDER BY priority DESC, run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS ready
    UNION ALL
    SELECT head.* FROM fair_keys, LATERAL (
        SELECT {CANDIDATE_COLUMNS} FROM workhorse_job AS job
        WHERE status = 'queued' AND partition_key IS NOT NULL AND queue = fair_keys.queue
          AND partition_key >= fair_keys.key AND partition_key <= fair_keys.key
          AND run_at <= clock_timestamp() AND {FREE_CONCURRENCY_KEY}
        ORDER BY partition_key, priority DESC, run_at, id
        LIMIT (SELECT share FROM fair_share)
        FOR UPDATE SKIP LOCKED
    ) AS head
    WHERE fair_keys.n > 0
    UNION ALL
    SELECT unkeyed.* FROM fair, LATERAL (
        SELECT {CANDIDATE_COLUMNS} FROM workhorse_job AS job
        WHERE status = 'queued' AND queue = fair.queue AND run_at <= clock_timestamp()
          AND partition_key IS NULL AND {FREE_CONCURRENCY_KEY}
        ORDER BY priority DESC, run_at, id
        LIMIT (SELECT share FROM fair_share)
        FOR UPDATE SKIP LOCKED
    ) AS unkeyed
    WHERE fair.unkeyed
    ) AS pool
    ORDER BY pool.priority DESC, pool.run_at, pool.id
    LIMIT %(limit)s
),
gated AS (
    SELECT candidates.id, candidates.breaker_key, breaker.state, breaker.open_until, breaker.cooldown,
           row_number() OVER (PARTITION BY candidates.breaker_key
                              ORDER BY candidates.priority DESC, candidates.run_at, candidates.id) AS nth
    FROM candidates JOIN workhorse_breaker AS breaker ON breaker.key = candidates.breaker_key
    WHERE candidates.breaker_key IS NOT NULL AND breaker.state <> 'closed'
),
canaries AS (
    UPDATE workhorse_breaker AS breaker
    SET state = CASE WHEN breaker.state = 'closed' THEN 'closed' ELSE 'half_open' END,
        probes_admitted = CASE WHEN breaker.state = 'closed' THEN 0
                               WHEN breaker.state = 'open' OR breaker.probes_admitted >= breaker.probes THEN 1
                               ELSE breaker.probes_admitted + 1 END,
        transitions = CASE WHEN breaker.state = 'open'
                           THEN {appended_transition("breaker.transitions", "'open'", "'half_open'", "'cooldown over'")}
                           ELSE breaker.transitions END,
        changed_at = clock_timestamp()
    FROM gated
    WHERE gated.nth = 1 AND breaker.key = gated.breaker_key
      AND (breaker.state = 'closed'
           OR (breaker.state = 'open' AND breaker.open_until <= clock_timestamp())
           OR (breaker.state = 'half_open' AND (breaker.probes_admitted < breaker.probes
               OR breaker.changed_at <= clock_timestamp() - breaker.cooldown - %(lease)s)))
    RETURNING breaker.key, gated.state = 'open' AND breaker.state = 'half_open' AND breaker.probes_admitted = 1
              AS half_opened
),
canary_jobs AS (
    SELECT gated.id, canaries.half_opened FROM gated JOIN canaries ON canaries.key = gated.breaker_key
    WHERE gated.nth = 1
),
admitted AS (
    SELECT id, priority, run_at, concurrency_key, concurrency_limit, rate_limit, rate_partition, held_since
    FROM candidates WHERE breaker_key IS NULL
    UNION ALL
    SELECT id, priority, run_at, concurrency_key, concurrency_limit, rate_limit, rate_partition, held_since
    FROM candidates
    WHERE breaker_key IS NOT NULL
      AND (id NOT IN (SELECT id FROM gated) OR id IN (SELECT id FROM canary_jobs))
),
{{RATE_SECTION}}refused AS (
    SELECT gated.id, jsonb_build_object('breaker', gated.breaker_key) AS reason, false AS rate,
           CASE WHEN gated.state = 'open' AND gated.open_until > clock_timestamp() THEN gated.open_until
                ELSE clock_timestamp() + coalesce(gated.cooldown, interval '1 second') END AS until
    FROM gated WHERE gated.id NOT IN (SELECT id FROM canary_jobs)
{{RATE_REFUSALS}}),
held AS (
    UPDATE workhorse_job AS job
    SET run_at = refused.until, held_since = coalesce(job.held_since, clock_timestamp())
    FROM refused
    WHERE job.id = refused.id
    RETURNING job.id, job.attempt, job.run_at, refused.reason, refused.rate
),
held_events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'held', attempt, clock_timestamp(), reason || jsonb_build_object('until', run_at)
    FROM held
),
keyed AS (
    SELECT id, concurrency_key, started,
           row_number() OVER (PARTITION BY concurrency_key ORDER BY priority DESC, run_at, id) AS nth
    FROM runnable WHERE concurrency_key IS NOT NULL
),
free_slots AS (
    SELECT keys.concurrency_key, slot, row_number() OVER (PARTITION BY keys.concurrency_key ORDER BY slot) AS nth
    FROM (SELECT concurrency_key, min(concurrency_limit) AS slots FROM runnable
          WHERE concurrency_key IS NOT NULL GROUP BY concurrency_key) AS keys,
    generate_series(1, keys.slots) AS slot
    WHERE NOT EXISTS (
        SELECT 1 FROM workhorse_job AS running
        WHERE running.status = 'running' AND running.concurrency_key = keys.concurrency_key
          AND running.concurrency_slot = slot
    )
),
chosen AS (
    SELECT id, NULL::smallint AS slot, started FROM runnable WHERE concurrency_key IS NULL
    UNION ALL
    SELECT keyed.id, free_slots.slot::smallint, keyed.started FROM keyed JOIN free_slots USING (concurrency_key, nth)
),
claimed AS (
    UPDATE workhorse_job AS job
    SET status = 'running', attempt = job.attempt + 1, lease_token = gen_random_uuid(),
        lease_expires_at = clock_timestamp() + %(lease)s, started_at = coalesce(chosen.started, clock_timestamp()),
        claimed_by = %(worker)s, concurrency_slot = chosen.slot, held_since = NULL
    FROM chosen
    WHERE job.id = chosen.id
    RETURNING job.id, job.job_type, job.queue, job.payload, job.attempt, job.max_attempts,
              job.retry_policy, job.deadline, job.timeout, job.lease_token, coalesce(job.root_id, job.id),
              job.scheduled_for, {BOUNDED_TRACE_CONTEXT} AS trace_context,
              extract(epoch FROM clock_timestamp() - job.run_at)::float8 AS waited, job.priority, job.run_at,
              job.snoozes, job.breaker_key,
              coalesce((SELECT half_opened FROM canary_jobs WHERE canary_jobs.id = job.id), false) AS half_opened,
              job.partition_key, job.rate_limit,
              greatest(extract(epoch FROM job.started_at - clock_timestamp()), 0)::float8 AS start_in,
              job.workflow_id, job.cipher_salt
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'claimed', attempt, clock_timestamp(), jsonb_build_object('worker', %(worker)s::text)
    FROM claimed
)
SELECT *, NULL::bigint AS held, NULL::float8 AS next_slot FROM claimed
UNION ALL
SELECT {", ".join(["NULL"] * CLAIMED_COLUMNS)}, count(*),
       extract(epoch FROM min(run_at) FILTER (WHERE rate) - clock_timestamp())::float8
FROM held HAVING count(*) > 0
ORDER BY priority DESC, run_at, id
"""
# Without rate limits configured the claim leaves the rate section out: a project that declares none
# claims at the cost it had before them (the section's CTEs, empty, still cost about 0.9 ms per claim
# here to set up). A job naming a limit then runs unlimited, as one whose limit was removed does.
# A held job comes back %(rate_ahead)s before its slot, so that the claim that meets it can admit it
# ahead, at its slot, rather than at whatever instant after the slot the claim came.
RATE_REFUSALS = f"""    UNION ALL
    SELECT rate_verdicts.id, jsonb_build_object('rate_limit', rate_verdicts.name,
                                                'partition', nullif(rate_verdicts.part, '')), true,
           rate_verdicts.slot - {_AHEAD} * {_US}
    FROM rate_verdicts WHERE NOT rate_verdicts.granted
"""
RATE_SECTION = f"""metered AS (
    SELECT id, rate_limit AS name, coalesce(rate_partition, '') AS part, held_since IS NOT NULL AS reheld,
           row_number() OVER (PARTITION BY rate_limit, coalesce(rate_partition, '')
                              ORDER BY priority DESC, run_at, id) AS nth
    FROM admitted WHERE rate_limit IS NOT NULL AND {_T_OF_RATE_LIMIT} IS NOT NULL
),
demand AS (
    SELECT name, part, count(*) AS n, clock_timestamp() AS now, {_T_OF_NAME} AS t, {_TAU_OF_NAME} AS tau
    FROM metered GROUP BY name, part
),
budgets AS (
    INSERT INTO workhorse_rate_budget AS budget
        (name, partition, tat, reserved_until, granted, admitted, deferred, changed_at)
    SELECT name, part, {_FRESH_TAT}, {_FRESH_RESERVED}, {_FRESH_K}, {_FRESH_K}, n - {_FRESH_K}, now
    FROM demand
    ORDER BY name, part
    ON CONFLICT (name, partition) DO UPDATE
    SET granted = {_K},
        tat = {_NEXT_TAT},
        reserved_until = {_NEXT_RESERVED},
        admitted = budget.admitted + {_K},
        deferred = budget.deferred + {_N} - {_K},
        changed_at = EXCLUDED.changed_at
    RETURNING budget.name, budget.partition, budget.granted, budget.tat, budget.reserved_until, budget.changed_at
),
rate_verdicts AS (
    SELECT id, name, part, granted,
           CASE WHEN granted THEN greatest(now, tat - (k - nth + 1) * t * {_US} - tau * {_US}) END AS start,
           CASE WHEN head THEN tat - tau * {_US}
                ELSE reserved_until - (count(*) OVER tail - row_number() OVER (tail ORDER BY nth) + 1) * t * {_US}
           END AS slot
    FROM (
        SELECT *, NOT granted AND reheld AND row_number() OVER (PARTITION BY name, part, reheld, granted ORDER BY nth) = 1
                  AS head
        FROM (
            SELECT metered.id, metered.name, metered.part, metered.nth, metered.reheld,
                   metered.nth <= budgets.granted AS granted, budgets.granted AS k, budgets.changed_at AS now, budgets.tat,
                   budgets.reserved_until, demand.t, demand.tau
            FROM metered
            JOIN budgets ON budgets.name = metered.name AND budgets.partition = metered.part
            JOIN demand ON demand.name = metered.name AND demand.part = metered.part
        ) AS verdicts
    ) AS placed
    WINDOW tail AS (PARTITION BY name, part, granted OR head)
),
runnable AS (
    SELECT id, priority, run_at, concurrency_key, concurrency_limit, NULL::timestamptz AS started FROM admitted
    WHERE rate_limit IS NULL OR {_T_OF_RATE_LIMIT} IS NULL
    UNION ALL
    SELECT admitted.id, priority, run_at, concurrency_key, concurrency_limit, rate_verdicts.start FROM admitted
    JOIN rate_verdicts ON rate_verdicts.id = admitted.id AND rate_verdicts.granted
),
"""
UNLIMITED_RUNNABLE = """runnable AS (
    SELECT id, priority, run_at, concurrency_key, concurrency_limit, NULL::timestamptz AS started FROM admitted
),
"""
# A worker without fair queues (most workers) claims without the fair CTEs and branches either: empty,
# they still cost each claim their set-up (W3 of the peer run, docs/benchmarks.md). Its claim is the
# one it had before fair queues, candidate for candidate.
_FAIR_CTES = _CLAIM_TEMPLATE[
    _CLAIM_TEMPLATE.index("WITH RECURSIVE fair AS (") : _CLAIM_TEMPLATE.index("candidates AS (")
]
_FAIR_BRANCHES = _CLAIM_TEMPLATE[
    _CLAIM_TEMPLATE.index("    UNION ALL\n    SELECT head.*") : _CLAIM_TEMPLATE.index("    ) AS pool\n")
]
_UNFAIR_TEMPLATE = _CLAIM_TEMPLATE.replace(_FAIR_CTES, "WITH ").replace(_FAIR_BRANCHES, "")
assert "fair" not in _UNFAIR_TEMPLATE.replace("unfair", "")
# Capability (decision 0021, "Capability"): a worker's claim takes only the job types it has handlers
# for, %(job_types)s exactly or by a module prefix %(job_type_patterns)s (LIKE patterns 'module.%%',
# for the django.tasks backend's tasks, found by import). A filter on each branch's candidates: the
# jobs of other types ahead of them in claim order are read past (heap rows of the ready index's
# entries), so a worker never locks, holds or counts an attempt of a job it cannot run. A claim
# without a capability (eager mode: the caller's own process runs the job) has no filter.
DUE_FILTERS = (
    "WHERE status = 'queued' AND queue = wanted.queue AND run_at <= clock_timestamp()",
    "WHERE status = 'queued' AND partition_key IS NOT NULL AND queue = fair_keys.queue",
    "WHERE status = 'queued' AND queue = fair.queue AND run_at <= clock_timestamp()",
)
CAPABLE = "(job_type = ANY(%(job_types)s::text[]) OR job_type LIKE ANY(%(job_type_patterns)s::text[]))"


def _capable(template: str) -> str:
    for due in DUE_FILTERS:
        template = template.replace(due, f"{due}\n          AND {CAPABLE}")
    return template


def _claim_statement(template: str, *, rated: bool) -> str:
    if rated:
        return template.replace("{RATE_SECTION}", RATE_SECTION).replace("{RATE_REFUSALS}", RATE_REFUSALS)
    return template.replace("{RATE_SECTION}", UNLIMITED_RUNNABLE).replace("{RATE_REFUSALS}", "")


CLAIM = _claim_statement(_UNFAIR_TEMPLATE, rated=False)
CLAIM_RATED = _claim_statement(_UNFAIR_TEMPLATE, rated=True)
CLAIM_FAIR = _claim_statement(_CLAIM_TEMPLATE, rated=False)
CLAIM_FAIR_RATED = _claim_statement(_CLAIM_TEMPLATE, rated=True)
CLAIM_CAPABLE, CLAIM_CAPABLE_RATED, CLAIM_FAIR_CAPABLE, CLAIM_FAIR_CAPABLE_RATED = (
    _capable(statement) for statement in (CLAIM, CLAIM_RATED, CLAIM_FAIR, CLAIM_FAIR_RATED)
)
assert CLAIM_CAPABLE.count(CAPABLE) == 1 and CLAIM_FAIR_CAPABLE.count(CAPABLE) == 3


# claim_job: lease one queued job by id, due now unless %(scheduled)s (eager mode runs it in the
# caller's transaction, paused queue or not); concurrency limits hold as in CLAIM.
PAUSE_FILTERED_QUEUES = """FROM (SELECT queue FROM unnest(%(queues)s::text[]) AS asked(queue)
          WHERE NOT EXISTS (SELECT 1 FROM workhorse_queue AS paused
                            WHERE paused.queue = asked.queue AND paused.paused)) AS wanted,"""
CLAIM_JOB_QUEUE = "FROM (SELECT queue FROM workhorse_job WHERE id = %(job_id)s) AS wanted(queue),"
DUE_NOW = "WHERE status = 'queued' AND queue = wanted.queue AND run_at <= clock_timestamp()"
DUE_OR_SCHEDULED = "WHERE status = 'queued' AND id = %(job_id)s AND (%(scheduled)s OR run_at <= clock_timestamp())"
assert PAUSE_FILTERED_QUEUES in CLAIM and DUE_NOW in CLAIM
CLAIM_JOB = CLAIM.replace(PAUSE_FILTERED_QUEUES, CLAIM_JOB_QUEUE).replace(DUE_NOW, DUE_OR_SCHEDULED)
assert CLAIM_JOB.count("%(job_id)s") == 2
CLAIM_JOB_RATED = CLAIM_RATED.replace(PAUSE_FILTERED_QUEUES, CLAIM_JOB_QUEUE).replace(DUE_NOW, DUE_OR_SCHEDULED)
assert CLAIM_JOB_RATED.count("%(job_id)s") == 2


# Lock order: a statement that updates or deletes several jobs locks them first, in a CTE
# ``SELECT … ORDER BY id FOR NO KEY UPDATE`` (the lock an UPDATE takes anyway), so any two such
# statements meet their common rows in the same order and cannot deadlock on them. Statements
# that SKIP LOCKED never wait for a row; they lock in id order too, except CLAIM, whose order is
# the claim order (and which waits for no job row).

# extend_leases: push the lease of jobs this worker still owns, locking them in id order; returns
# the ids still owned and whether cancellation was requested (a job missing from the answer was
# reclaimed: stop it).
EXTEND_LEASES = """
WITH held AS MATERIALIZED (
    SELECT job.id FROM workhorse_job AS job
    JOIN unnest(%(job_ids)s::bigint[], %(tokens)s::uuid[]) AS mine(id, token) ON mine.id = job.id
    WHERE job.lease_token = mine.token AND job.status = 'running'
    ORDER BY job.id
    FOR NO KEY UPDATE OF job
)
UPDATE workhorse_job AS job
SET lease_expires_at = clock_timestamp() + %(lease)s
FROM held
WHERE job.id = held.id
RETURNING job.id, job.cancel_requested
"""


# save_checkpoint: store a stage result once per job, only while this worker holds the lease
# (FOR SHARE waits out a concurrent reclaim); returns whether the lease was held.
SAVE_CHECKPOINT = """
WITH owner AS (
    SELECT id, attempt FROM workhorse_job
    WHERE id = %(job_id)s AND lease_token = %(token)s AND status = 'running'
    FOR SHARE
),
saved AS (
    INSERT INTO workhorse_checkpoint (job_id, name, value, attempt, created_at)
    SELECT id, %(name)s, %(value)s::jsonb, attempt, clock_timestamp() FROM owner
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING value
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'checkpoint_saved', attempt, clock_timestamp(), jsonb_build_object('name', %(name)s::text)
    FROM owner WHERE EXISTS (SELECT 1 FROM saved)
)
SELECT (SELECT count(*) FROM owner), (SELECT count(*) FROM saved)
"""


# load_checkpoint: the stored result of a stage, if any (workhorse_checkpoint_job_name_uniq).
LOAD_CHECKPOINT = "SELECT value FROM workhorse_checkpoint WHERE job_id = %(job_id)s AND name = %(name)s"


class Claimed(list["ClaimedJob"]):
    """The jobs a claim leased, in priority order; ``held`` counts the candidates it held back, and
    ``next_slot`` is how many seconds from now the earliest job a rate limit held is due (or None)."""

    held: int = 0
    next_slot: float | None = None


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker holds a lease on."""

    id: int
    job_type: str
    queue: str
    payload: Any
    attempt: int
    max_attempts: int
    retry_policy: dict[str, Any]
    deadline: datetime | None
    timeout: timedelta | None
    lease_token: Any
    root_id: int  # the first job of a redrive lineage (the job itself when never redriven)
    scheduled_for: datetime | None = None  # the schedule tick the job runs for
    trace_context: dict[str, str] | None = None  # the W3C trace context of its enqueue, if traced
    waited: float = 0.0  # seconds from run_at to the claim, on PostgreSQL's clock
    claimed_at: float = 0.0  # time.perf_counter() when this process claimed it
    snoozes: int = 0  # how many times the job snoozed before this attempt
    breaker_key: str | None = None  # the circuit breaker it runs behind, if any
    half_opened: bool = False  # its claim moved its breaker from open to half-open (the first canary)
    partition_key: str | None = None  # its fair share's key, if any
    rate_limit: str | None = None  # the rate limit it started under, if any
    start_in: float = 0.0  # seconds from the claim to its start, when its rate limit admitted it ahead
    workflow_id: int | None = None  # the workflow it is a step of, if any
    cipher_salt: bytes | None = None  # an encrypted job's salt (decision 0024); its payload is then an envelope


# Two workers that pick the same free concurrency slot at once: the second claims again. Two claims
# that take slots can also deadlock on the slot index (each inserts its entries in its own row
# order, and waits for the other's uncommitted ones); PostgreSQL aborts one, which claims again too.
CLAIM_ATTEMPTS = 5
DEADLOCK_DETECTED = "40P01"


# use_generic_plans: planning CLAIM costs more than running it, and PostgreSQL would plan it again
# on every execution (its custom plans look cheaper than the generic one for a small LIMIT), so a
# worker's claiming connection keeps one generic plan per prepared statement: 2.4 ms -> 1.1 ms per
# claim here. Only connections that claim get it (never a caller's connection: eager mode uses
# claim_job); what else they run (reclaims, maintenance) plans the same either way. It only matters
# for prepared statements: with WORKHORSE_PREPARED_STATEMENTS off the claim is planned at every
# execution whatever the setting, and it is not set at all.
#
# On a connection that keeps its session it is set once (USE_GENERIC_PLANS). An alias that goes
# through a transaction pooler (marked with Django's DISABLE_SERVER_SIDE_CURSORS, which such an
# alias needs anyway) does not keep it: a session SET would stay on a server connection that other
# clients then get, and be missing from the next one this worker gets. There each claim runs in a
# transaction of its own that sets it locally first (USE_GENERIC_PLANS_LOCALLY).
#
# The same connections turn JIT compilation off: a generic plan is costed without its LIMIT's value,
# and once the ready index holds many jobs not yet due (50,000 held behind a spent rate limit, say)
# its estimate passes jit_above_cost, and compiling the plan (about 120 ms here) at every execution
# dwarfs running it (about 1.5 ms).
USE_GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan; SET jit = off"
USE_GENERIC_PLANS_LOCALLY = "SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL jit = off"
_generic_plan_connections: weakref.WeakSet[Any] = weakref.WeakSet()


# The rate_limits parameter when none is configured: the claim without its rate section.
NO_RATE_LIMITS = "{}"


# The claim statement by (any fair queue, any rate limit configured, a capability given).
_CLAIMS = {
    (False, False, False): CLAIM, (False, True, False): CLAIM_RATED,
    (True, False, False): CLAIM_FAIR, (True, True, False): CLAIM_FAIR_RATED,
    (False, False, True): CLAIM_CAPABLE, (False, True, True): CLAIM_CAPABLE_RATED,
    (True, False, True): CLAIM_FAIR_CAPABLE, (True, True, True): CLAIM_FAIR_CAPABLE_RATED,
}  # fmt: skip


def capability_parameters(job_types: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split an advertised capability (``tasks.registry.capabilities()``) into the claim's parameters:
    the exact job types, and a LIKE pattern ``module.%`` (``_`` and ``%`` escaped) per ``module.*``."""
    exact = [name for name in job_types if not name.endswith(".*")]
    patterns = [_like_prefix(name[:-1]) for name in job_types if name.endswith(".*")]
    return exact, patterns


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def claim(
    alias: str,
    *,
    queues: Sequence[str],
    limit: int,
    lease: timedelta,
    worker: str,
    fair_queues: Sequence[tuple[str, str, bool]] = (),
    rate_limits: str = NO_RATE_LIMITS,
    rate_ahead_us: int = 0,
    job_types: Sequence[str] | None = None,
) -> Claimed:
    """Run CLAIM (with generic plans when it is prepared); return the leased jobs in priority order,
    and how many candidates a circuit breaker or a rate limit held back.

    ``queues`` are read in claim order; ``fair_queues`` are ``(queue, after, unkeyed)``: a queue read
    in fair share from just after the partition key ``after`` ("" to start at the first key), its
    jobs without a key looked for when ``unkeyed``. ``rate_limits`` is the configured limits as
    ``admission.rate_limits.claim_parameter`` gives them; a job one admits up to ``rate_ahead_us``
    microseconds ahead of its start (``ClaimedJob.start_in``) must not start before it. ``job_types``
    (``tasks.registry.capabilities()``) limits the claim to the jobs of those types (None: any type).
    """
    exact, patterns = capability_parameters(job_types or ())
    params = {
        "queues": list(queues),
        "fair_queues": [queue for queue, _, _ in fair_queues],
        "fair_after": [after for _, after, _ in fair_queues],
        "fair_unkeyed": [unkeyed for _, _, unkeyed in fair_queues],
        "limit": limit,
        "lease": lease,
        "worker": worker,
        "rate_limits": rate_limits,
        "rate_ahead": rate_ahead_us,
        "job_types": exact,
        "job_type_patterns": patterns,
    }
    statement = _CLAIMS[bool(fair_queues), rate_limits != NO_RATE_LIMITS, job_types is not None]
    if not app_settings.PREPARED_STATEMENTS:
        return _claim(alias, statement, params)
    if connections[alias].settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        return _claim(alias, statement, params, local_setting=USE_GENERIC_PLANS_LOCALLY)
    _use_generic_plans(alias)
    return _claim(alias, statement, params)


def _use_generic_plans(alias: str) -> None:
    connection = connections[alias]
    connection.ensure_connection()
    raw = connection.connection
    if raw not in _generic_plan_connections:
        with connection.cursor() as cursor:
            cursor.execute(USE_GENERIC_PLANS)
        _generic_plan_connections.add(raw)


def claim_job(
    alias: str,
    *,
    job_id: int,
    lease: timedelta,
    worker: str,
    scheduled: bool = False,
    rate_limits: str = NO_RATE_LIMITS,
) -> ClaimedJob | None:
    """Run CLAIM_JOB inside a savepoint; return the leased job, or None if it is not claimable now."""
    params = {
        "job_id": job_id, "fair_queues": [], "fair_after": [], "fair_unkeyed": [], "limit": 1, "lease": lease,
        "worker": worker, "scheduled": scheduled, "rate_limits": rate_limits, "rate_ahead": 0,
    }  # fmt: skip
    statement = CLAIM_JOB if rate_limits == NO_RATE_LIMITS else CLAIM_JOB_RATED
    jobs = _claim(alias, statement, params, savepoint=True)
    return jobs[0] if jobs else None


def _claim(
    alias: str, statement: str, params: dict[str, Any], *, savepoint: bool = False, local_setting: str | None = None
) -> Claimed:
    for _ in range(CLAIM_ATTEMPTS):
        try:
            with transaction.atomic(using=alias) if savepoint or local_setting else nullcontext():
                if local_setting:
                    with connections[alias].cursor() as cursor:
                        cursor.execute(local_setting)
                rows = execute(alias, statement, params)
        except IntegrityError as exc:
            if constraint_name(exc) != JOB_CONCURRENCY_SLOT_UNIQ:
                raise
            continue
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != DEADLOCK_DETECTED:
                raise
            continue
        claimed_at = time.perf_counter()
        claimed = Claimed(_claimed(row, claimed_at) for row in rows if row[0] is not None)
        refused = [row for row in rows if row[0] is None]
        claimed.held = sum(row[-2] for row in refused)
        claimed.next_slot = next((row[-1] for row in refused if row[-1] is not None), None)
        return claimed
    return Claimed()


def _claimed(row: Sequence[Any], claimed_at: float) -> ClaimedJob:
    """A row of CLAIM's answer as a ClaimedJob (payload, retry policy and trace context are jsonb)."""
    return ClaimedJob(
        row[0], row[1], row[2], decode_json(row[3]), row[4], row[5], decode_json(row[6]), row[7], row[8], row[9],
        row[10], row[11], decode_json(row[12]), row[13], claimed_at, snoozes=row[16], breaker_key=row[17],
        half_opened=row[18], partition_key=row[19], rate_limit=row[20], start_in=row[21],
        workflow_id=row[22], cipher_salt=None if row[23] is None else bytes(row[23]),
    )  # fmt: skip


def extend_leases(alias: str, held: Sequence[ClaimedJob], lease: timedelta) -> dict[int, bool]:
    """Run EXTEND_LEASES; return {id: cancel requested} for the jobs still held."""
    params = {"job_ids": [j.id for j in held], "tokens": [j.lease_token for j in held], "lease": lease}
    return {row[0]: bool(row[1]) for row in execute(alias, EXTEND_LEASES, params)}


def save_checkpoint(alias: str, job: ClaimedJob, name: str, value_json: str) -> bool:
    """Run SAVE_CHECKPOINT; return whether this worker still held the job."""
    params = {"job_id": job.id, "token": job.lease_token, "name": name, "value": value_json}
    return bool(execute(alias, SAVE_CHECKPOINT, params)[0][0])


def load_checkpoint(alias: str, job_id: int, name: str) -> tuple[bool, Any]:
    """Run LOAD_CHECKPOINT; return (found, value)."""
    rows = execute(alias, LOAD_CHECKPOINT, {"job_id": job_id, "name": name})
    return (True, decode_json(rows[0][0])) if rows else (False, None)
