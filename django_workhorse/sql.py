"""Every raw SQL statement of django-workhorse, and the thin functions that run them.

PostgreSQL-specific SQL lives here and nowhere else (a test enforces it). Each statement is a named
constant with a comment saying what it does and which constraint or index it relies on. Parameters
are always bound (``%(name)s``), never formatted in.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import psycopg
from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.backends.utils import CursorWrapper
from psycopg import sql as pgsql

from django_workhorse.conf import app_settings
from django_workhorse.models import JOB_CONCURRENCY_SLOT_UNIQ, JOB_ID_SEQUENCE
from django_workhorse.validation import PreparedJob

# The request columns and their types, in the order the statements unpack them.
_REQUEST_COLUMNS = (
    ("ordinal", "int"), ("job_type", "text"), ("queue", "text"), ("payload", "jsonb"),
    ("priority", "int"), ("run_at", "timestamptz"), ("delay", "interval"), ("tags", "jsonb"),
    ("max_attempts", "int"), ("retry_policy", "jsonb"), ("deadline", "timestamptz"),
    ("timeout", "interval"), ("concurrency_key", "text"), ("concurrency_limit", "int"), ("scope", "text"),
    ("key_hash", "bytea"),
    ("key_preview", "text"), ("mode", "text"), ("request_digest", "bytea"),
    ("field_digests", "jsonb"), ("lifetime", "interval"),
)  # fmt: skip
_COLUMNS = tuple(name for name, _ in _REQUEST_COLUMNS)
# Job ids are drawn up front so a binding can name its job in the same statement.
_DRAWN = f"nextval('{JOB_ID_SEQUENCE}') AS job_id, statement_timestamp() AS now"
# One request as scalar parameters: planning a one-row statement is cheap.
_ONE_REQUEST_CTE = "requests AS (SELECT {}, {})".format(
    ", ".join(f"%({name})s::{kind} AS {name}" for name, kind in _REQUEST_COLUMNS), _DRAWN
)
# How a batch row (a JSON array) yields each column: one text parameter carries the whole batch,
# which costs far less to send than twenty arrays, and payloads arrive as jsonb without a re-parse.
_FROM_JSON = {
    "int": "(r->>{i})::int",
    "text": "r->>{i}",
    "jsonb": "r->{i}",
    "timestamptz": "(r->>{i})::timestamptz",
    "interval": "(r->>{i})::bigint * interval '1 microsecond'",
    "bytea": "decode(r->>{i}, 'hex')",
}
_MANY_REQUESTS_CTE = "requests AS (SELECT {}, {} FROM jsonb_array_elements(%(rows)s::jsonb) AS r)".format(
    ", ".join(f"{_FROM_JSON[kind].format(i=i)} AS {name}" for i, (name, kind) in enumerate(_REQUEST_COLUMNS)),
    _DRAWN,
)


def _jobs_ctes(only: str = "") -> str:
    """Insert the jobs of ``requests`` (filtered by ``only``), their "enqueued" events, and one NOTIFY
    per queue for work that is ready now (PostgreSQL delivers it at commit, drops it on rollback)."""
    return f"""
jobs AS (
    INSERT INTO workhorse_job (
        id, job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
        retry_policy, deadline, timeout, concurrency_key, concurrency_limit, tags, created_at, last_error)
    SELECT job_id, job_type, queue, payload, 'queued', priority,
           coalesce(run_at, now + coalesce(delay, interval '0')), 0, max_attempts,
           retry_policy, deadline, timeout, concurrency_key, concurrency_limit, tags, now, ''
    FROM requests
    {only}
    RETURNING id, queue, run_at, created_at
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'enqueued', 0, created_at, '{{}}'::jsonb FROM jobs
),
notified AS (
    SELECT pg_notify(%(channel)s, queue)
    FROM (SELECT DISTINCT queue FROM jobs WHERE run_at <= created_at) AS ready
)"""


# The accepted requests; referencing `notified` makes PostgreSQL run it.
_ACCEPTED = """
SELECT requests.ordinal, requests.job_id, true, NULL::text, NULL::bytea, NULL::jsonb, NULL::boolean, NULL::text
FROM requests JOIN jobs ON jobs.id = requests.job_id
CROSS JOIN (SELECT count(*) FROM notified) AS notifications"""

# Whether a binding (joined with its job) owns nothing any more, so the next request may take the
# key over: idempotency and throttle keys once their time is up, unique keys once their job is
# terminal, debounce keys once both hold (debounce keeps its key one window past the scheduled run).
_TERMINAL = "('succeeded', 'dead', 'cancelled')"
_FREE = f"""CASE binding.mode
    WHEN 'unique' THEN job.status IN {_TERMINAL}
    WHEN 'debounce' THEN job.status IN {_TERMINAL} AND binding.expires_at <= {{now}}
    ELSE binding.expires_at <= {{now}} END"""
# Where the bound job is, for debounce: 'open' (queued, never started, window open: replaceable),
# 'due' (queued, never started, window elapsed: a worker is about to take it) or 'started'.
_JOB_STATE = """CASE WHEN job.status <> 'queued' OR job.attempt > 0 THEN 'started'
    WHEN job.run_at > {now} THEN 'open' ELSE 'due' END"""
_BINDING_COLUMNS = "binding.job_id, binding.mode, binding.request_digest, binding.field_digests, {free}, {state}"

# enqueue_unkeyed: requests without a key only ever insert; skipping the binding CTEs makes the
# statement noticeably cheaper to run.
ENQUEUE_ONE_UNKEYED = f"WITH {_ONE_REQUEST_CTE},{_jobs_ctes()}{_ACCEPTED}"
ENQUEUE_MANY_UNKEYED = f"WITH {_MANY_REQUESTS_CTE},{_jobs_ctes()}{_ACCEPTED}"

# enqueue: write bindings (in (scope, key_hash) order, so two batches with overlapping keys take
# them in the same order and cannot deadlock) and the jobs they own; a key already bound is left
# alone (ON CONFLICT DO NOTHING on workhorse_binding_scope_key_hash_uniq, which waits for an
# in-flight owner to commit or roll back). Returns one row per accepted request and one per
# request whose existing binding this statement's snapshot can see.
_BIND = """
bound AS (
    INSERT INTO workhorse_binding (
        scope, key_hash, key_preview, mode, request_digest, field_digests, job_id, created_at, expires_at)
    SELECT scope, key_hash, key_preview, mode, request_digest, field_digests, job_id, now, now + lifetime
    FROM requests
    WHERE key_hash IS NOT NULL
    ORDER BY scope, key_hash
    ON CONFLICT (scope, key_hash) DO NOTHING
    RETURNING job_id
),"""
_EXISTING = """
UNION ALL
SELECT requests.ordinal, {columns}
FROM requests
JOIN workhorse_binding AS binding USING (scope, key_hash)
JOIN workhorse_job AS job ON job.id = binding.job_id
WHERE requests.job_id NOT IN (SELECT job_id FROM bound)
""".format(
    columns=_BINDING_COLUMNS.replace("binding.job_id,", "binding.job_id, false,").format(
        free=_FREE.format(now="requests.now"), state=_JOB_STATE.format(now="requests.now")
    )
)
_ONLY_UNKEYED_OR_BOUND = "WHERE key_hash IS NULL OR job_id IN (SELECT job_id FROM bound)"
ENQUEUE_ONE = f"WITH {_ONE_REQUEST_CTE},{_BIND}{_jobs_ctes(_ONLY_UNKEYED_OR_BOUND)}{_ACCEPTED}{_EXISTING}"
ENQUEUE_MANY = f"WITH {_MANY_REQUESTS_CTE},{_BIND}{_jobs_ctes(_ONLY_UNKEYED_OR_BOUND)}{_ACCEPTED}{_EXISTING}"

# take_over: rebind a key that owns nothing any more (see _FREE) to a new job, compare-and-swap
# on the job it was seen bound to. The row lock of the UPDATE serializes racing takers; PostgreSQL
# re-checks the locked row, so a taker that lost the race (the key now names the winner's job,
# which is live) gets no row back and starts over. A job never leaves a terminal status, so
# "terminal when seen" stays true.
TAKE_OVER = f"""
WITH {_ONE_REQUEST_CTE},
bound AS (
    UPDATE workhorse_binding AS binding
    SET key_preview = requests.key_preview, mode = requests.mode,
        request_digest = requests.request_digest, field_digests = requests.field_digests,
        previous_request_digest = NULL, job_id = requests.job_id, created_at = requests.now,
        expires_at = requests.now + requests.lifetime
    FROM requests, workhorse_job AS job
    WHERE binding.scope = requests.scope AND binding.key_hash = requests.key_hash
      AND binding.job_id = %(seen_job_id)s AND job.id = binding.job_id
      AND {_FREE.format(now="requests.now")}
    RETURNING binding.job_id
),{_jobs_ctes(_ONLY_UNKEYED_OR_BOUND)}{_ACCEPTED}
"""

# replace_debounced: update a pending debounced job's definition in place (same id) and its
# binding. The job's row lock comes first (as for purge, claims and outcomes) and serializes
# racing replacers; PostgreSQL re-checks the locked row, so a job claimed meanwhile is left alone
# and no row comes back. The binding's SET reads the row as the previous replacer left it, so the
# event's prior digest is exact. Debounced jobs run in the future: no NOTIFY.
REPLACE_DEBOUNCED = f"""
WITH {_ONE_REQUEST_CTE},
replaced AS (
    UPDATE workhorse_job AS job
    SET job_type = requests.job_type, queue = requests.queue, payload = requests.payload,
        priority = requests.priority, tags = requests.tags, max_attempts = requests.max_attempts,
        retry_policy = requests.retry_policy, deadline = requests.deadline, timeout = requests.timeout,
        concurrency_key = requests.concurrency_key, concurrency_limit = requests.concurrency_limit,
        run_at = CASE WHEN %(reset)s THEN requests.now + %(window)s ELSE job.run_at END
    FROM requests
    WHERE job.id = %(seen_job_id)s AND job.status = 'queued' AND job.attempt = 0 AND job.run_at > requests.now
    RETURNING job.id, job.run_at
),
rebound AS (
    UPDATE workhorse_binding AS binding
    SET previous_request_digest = binding.request_digest, request_digest = requests.request_digest,
        field_digests = requests.field_digests, key_preview = requests.key_preview,
        expires_at = replaced.run_at + %(window)s
    FROM requests, replaced
    WHERE binding.scope = requests.scope AND binding.key_hash = requests.key_hash
      AND binding.job_id = replaced.id AND binding.mode = 'debounce'
    RETURNING binding.job_id, binding.previous_request_digest, binding.request_digest
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT rebound.job_id, 'replaced', 0, requests.now, jsonb_build_object(
        'prior_request_digest', encode(rebound.previous_request_digest, 'hex'),
        'request_digest', encode(rebound.request_digest, 'hex'), 'run_at', replaced.run_at)
    FROM rebound, replaced, requests
)
SELECT rebound.job_id FROM rebound
"""

# find_bindings: read bindings by key in a fresh snapshot, for keys an ENQUEUE found taken by a
# transaction that committed after its snapshot. Uses workhorse_binding_scope_key_hash_uniq.
FIND_BINDINGS = """
SELECT requests.ordinal, {columns}
FROM unnest(%(ordinal)s::int[], %(scope)s::text[], %(key_hash)s::bytea[]) AS requests(ordinal, scope, key_hash)
JOIN workhorse_binding AS binding USING (scope, key_hash)
JOIN workhorse_job AS job ON job.id = binding.job_id
""".format(
    columns=_BINDING_COLUMNS.format(
        free=_FREE.format(now="statement_timestamp()"), state=_JOB_STATE.format(now="statement_timestamp()")
    )
)

# purge_queued: delete queued jobs of a queue (or by id) with their events, checkpoints and
# lineage records, and release their bindings at once, in one statement. Running and finished
# jobs are left alone.
PURGE_QUEUED = """
WITH doomed AS (
    SELECT id FROM workhorse_job
    WHERE status = 'queued'
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(job_ids)s::bigint[] IS NULL OR id = ANY(%(job_ids)s::bigint[]))
    FOR UPDATE SKIP LOCKED
),
released AS (DELETE FROM workhorse_binding WHERE job_id IN (SELECT id FROM doomed)),
history AS (DELETE FROM workhorse_job_event WHERE job_id IN (SELECT id FROM doomed)),
-- A job waiting for a retry may have saved checkpoints; a redriven job has a lineage record.
checkpoints AS (DELETE FROM workhorse_checkpoint WHERE job_id IN (SELECT id FROM doomed)),
lineage AS (DELETE FROM workhorse_redrive WHERE new_job_id IN (SELECT id FROM doomed))
DELETE FROM workhorse_job WHERE id IN (SELECT id FROM doomed)
"""

# prune_expired_bindings: delete up to %(limit)s bindings whose time is up and that own nothing
# (a debounce key also waits for its job to finish); uses workhorse_binding_expires_idx. Unique
# keys have no time: they go with their finished job (prune_finished_jobs).
PRUNE_EXPIRED_BINDINGS = f"""
DELETE FROM workhorse_binding
WHERE id IN (
    SELECT binding.id FROM workhorse_binding AS binding
    JOIN workhorse_job AS job ON job.id = binding.job_id
    WHERE binding.expires_at <= statement_timestamp()
      AND {_FREE.format(now="statement_timestamp()")}
    LIMIT %(limit)s
    FOR UPDATE OF binding SKIP LOCKED
)
"""


# claim: lease up to %(limit)s ready jobs of the given queues in priority DESC, run_at, id order,
# skipping rows other workers hold. Each queue is read through workhorse_job_ready_idx (queue,
# priority DESC, run_at, id) in exactly its order; the best %(limit)s of those candidates win, so
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
# refuses at once.
CONCURRENCY_LOCK_CLASS = 0x776F726B  # "work": the first half of two-int advisory lock ids
CLAIM = f"""
WITH candidates AS (
    SELECT ready.id, ready.priority, ready.run_at, ready.concurrency_key, ready.concurrency_limit
    FROM unnest(%(queues)s::text[]) AS wanted(queue),
    LATERAL (
        SELECT id, priority, run_at, concurrency_key, concurrency_limit FROM workhorse_job AS job
        WHERE status = 'queued' AND queue = wanted.queue AND run_at <= clock_timestamp()
          AND CASE WHEN concurrency_key IS NULL THEN true
                   ELSE pg_try_advisory_xact_lock({CONCURRENCY_LOCK_CLASS}, hashtext(concurrency_key))
                        AND (SELECT count(*) FROM workhorse_job AS running
                         WHERE running.status = 'running' AND running.concurrency_key = job.concurrency_key)
                        < job.concurrency_limit END
        ORDER BY priority DESC, run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS ready
    ORDER BY ready.priority DESC, ready.run_at, ready.id
    LIMIT %(limit)s
),
keyed AS (
    SELECT id, concurrency_key,
           row_number() OVER (PARTITION BY concurrency_key ORDER BY priority DESC, run_at, id) AS nth
    FROM candidates WHERE concurrency_key IS NOT NULL
),
free_slots AS (
    SELECT keys.concurrency_key, slot, row_number() OVER (PARTITION BY keys.concurrency_key ORDER BY slot) AS nth
    FROM (SELECT concurrency_key, min(concurrency_limit) AS slots FROM candidates
          WHERE concurrency_key IS NOT NULL GROUP BY concurrency_key) AS keys,
    generate_series(1, keys.slots) AS slot
    WHERE NOT EXISTS (
        SELECT 1 FROM workhorse_job AS running
        WHERE running.status = 'running' AND running.concurrency_key = keys.concurrency_key
          AND running.concurrency_slot = slot
    )
),
chosen AS (
    SELECT id, NULL::smallint AS slot FROM candidates WHERE concurrency_key IS NULL
    UNION ALL
    SELECT keyed.id, free_slots.slot::smallint FROM keyed JOIN free_slots USING (concurrency_key, nth)
),
claimed AS (
    UPDATE workhorse_job AS job
    SET status = 'running', attempt = job.attempt + 1, lease_token = gen_random_uuid(),
        lease_expires_at = clock_timestamp() + %(lease)s, started_at = clock_timestamp(),
        claimed_by = %(worker)s, concurrency_slot = chosen.slot
    FROM chosen
    WHERE job.id = chosen.id
    RETURNING job.id, job.job_type, job.queue, job.payload, job.attempt, job.max_attempts,
              job.retry_policy, job.deadline, job.timeout, job.lease_token, coalesce(job.root_id, job.id),
              job.priority, job.run_at
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'claimed', attempt, clock_timestamp(), jsonb_build_object('worker', %(worker)s::text)
    FROM claimed
)
SELECT * FROM claimed ORDER BY priority DESC, run_at, id
"""

# claim_job: lease one queued job by id, due now unless %(scheduled)s (eager mode runs it in the
# caller's transaction); concurrency limits hold as in CLAIM.
CLAIM_JOB = CLAIM.replace(
    "FROM unnest(%(queues)s::text[]) AS wanted(queue),",
    "FROM (SELECT queue FROM workhorse_job WHERE id = %(job_id)s) AS wanted(queue),",
).replace(
    "WHERE status = 'queued' AND queue = wanted.queue AND run_at <= clock_timestamp()",
    "WHERE status = 'queued' AND id = %(job_id)s AND (%(scheduled)s OR run_at <= clock_timestamp())",
)
assert CLAIM_JOB.count("%(job_id)s") == 2


# record_outcomes: write how attempts ended, many in one statement, each fenced by its lease
# token: a worker whose lease expired (the job may be another worker's now) changes nothing.
# status is 'succeeded', 'queued' (a retry at run_at; 'cancelled' instead when cancellation was
# requested meanwhile) or 'dead'; each outcome brings its events.
RECORD_OUTCOMES = """
WITH outcome AS (
    SELECT (o->>'id')::bigint AS id, (o->>'token')::uuid AS token, o->>'status' AS status,
           o->'result' AS result, o->>'error' AS error, (o->>'run_at')::timestamptz AS run_at,
           o->'events' AS events
    FROM jsonb_array_elements(%(outcomes)s::jsonb) AS o
),
finished AS (
    UPDATE workhorse_job AS job
    SET status = CASE WHEN job.cancel_requested AND outcome.status = 'queued' THEN 'cancelled'
                      ELSE outcome.status END,
        result = outcome.result, last_error = outcome.error,
        run_at = coalesce(outcome.run_at, job.run_at), lease_token = NULL, lease_expires_at = NULL,
        finished_at = CASE WHEN outcome.status = 'queued' AND NOT job.cancel_requested
                           THEN NULL ELSE clock_timestamp() END
    FROM outcome
    WHERE job.id = outcome.id AND job.lease_token = outcome.token AND job.status = 'running'
    RETURNING job.id, job.attempt, outcome.events
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT finished.id, event->>0, finished.attempt, clock_timestamp(), event->1
    FROM finished, jsonb_array_elements(finished.events) AS event
)
SELECT id FROM finished
"""

# extend_leases: push the lease of jobs this worker still owns; returns the ids still owned and
# whether cancellation was requested (a job missing from the answer was reclaimed: stop it).
EXTEND_LEASES = """
UPDATE workhorse_job AS job
SET lease_expires_at = clock_timestamp() + %(lease)s
FROM unnest(%(job_ids)s::bigint[], %(tokens)s::uuid[]) AS held(id, token)
WHERE job.id = held.id AND job.lease_token = held.token AND job.status = 'running'
RETURNING job.id, job.cancel_requested
"""

# release: give held jobs back to the queue at once (a clean stop); an attempt that never started
# its handler is not counted, and one interrupted on its last attempt is dead, as a reclaimed one
# would be. Fenced by the lease token.
RELEASE = """
WITH released AS (
    UPDATE workhorse_job AS job
    SET status = CASE WHEN held.started AND job.attempt >= job.max_attempts THEN 'dead' ELSE 'queued' END,
        last_error = CASE WHEN held.started AND job.attempt >= job.max_attempts
                          THEN 'interrupted by a worker shutdown on the last attempt' ELSE job.last_error END,
        finished_at = CASE WHEN held.started AND job.attempt >= job.max_attempts THEN clock_timestamp() END,
        lease_token = NULL, lease_expires_at = NULL, run_at = clock_timestamp(),
        attempt = job.attempt - CASE WHEN held.started THEN 0 ELSE 1 END
    FROM unnest(%(job_ids)s::bigint[], %(tokens)s::uuid[], %(started)s::boolean[]) AS held(id, token, started)
    WHERE job.id = held.id AND job.lease_token = held.token AND job.status = 'running'
    RETURNING job.id, job.attempt, job.status
)
INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
SELECT id, 'released', attempt, clock_timestamp(), '{}'::jsonb FROM released
UNION ALL
SELECT id, 'dead', attempt, clock_timestamp(), '{}'::jsonb FROM released WHERE status = 'dead'
"""

# reclaim_expired: requeue running jobs whose lease expired (their worker died or stalled), or
# bury them when that was their last attempt; uses workhorse_job_lease_idx.
RECLAIM_EXPIRED = """
WITH expired AS (
    UPDATE workhorse_job AS job
    SET status = CASE WHEN job.attempt >= job.max_attempts THEN 'dead' ELSE 'queued' END,
        lease_token = NULL, lease_expires_at = NULL,
        finished_at = CASE WHEN job.attempt >= job.max_attempts THEN clock_timestamp() END,
        last_error = CASE WHEN job.attempt >= job.max_attempts
                          THEN 'lease expired on the last attempt' ELSE job.last_error END
    WHERE job.id IN (
        SELECT id FROM workhorse_job
        WHERE status = 'running' AND lease_expires_at < clock_timestamp()
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING job.id, job.attempt, job.status
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'lease_expired', attempt, clock_timestamp(), '{}'::jsonb FROM expired
    UNION ALL
    SELECT id, 'dead', attempt, clock_timestamp(), '{}'::jsonb FROM expired WHERE status = 'dead'
)
SELECT count(*) FROM expired
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

# redrive: copy a dead job into a new queued job (clearing its deadline, not copying checkpoints)
# and record the lineage, once per (source job, request id): ON CONFLICT DO NOTHING on
# workhorse_redrive_source_request_uniq. Returns the new job, or the redrive already recorded.
REDRIVE = f"""
WITH source AS (
    SELECT * FROM workhorse_job WHERE id = %(source_id)s AND status = 'dead'
),
drawn AS (SELECT nextval('{JOB_ID_SEQUENCE}') AS job_id, statement_timestamp() AS now),
lineage AS (
    INSERT INTO workhorse_redrive (source_id, request_id, new_job_id, requested_by, reason, created_at)
    SELECT source.id, %(request_id)s, drawn.job_id, %(requested_by)s, %(reason)s, drawn.now FROM source, drawn
    ON CONFLICT (source_id, request_id) DO NOTHING
    RETURNING new_job_id
),
jobs AS (
    INSERT INTO workhorse_job (
        id, job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
        retry_policy, deadline, timeout, concurrency_key, concurrency_limit, tags, created_at, last_error, root_id)
    SELECT lineage.new_job_id, source.job_type, source.queue, source.payload, 'queued', source.priority,
           drawn.now, 0, source.max_attempts, source.retry_policy, NULL, source.timeout,
           source.concurrency_key, source.concurrency_limit, source.tags, drawn.now, '',
           coalesce(source.root_id, source.id)
    FROM lineage, source, drawn
    RETURNING id, queue, created_at
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'enqueued', 0, created_at, jsonb_build_object('redriven_from', %(source_id)s::bigint) FROM jobs
    UNION ALL
    SELECT source.id, 'redriven', source.attempt, jobs.created_at,
           jsonb_build_object('new_job', jobs.id, 'requested_by', %(requested_by)s::text)
    FROM jobs, source
),
notified AS (SELECT pg_notify(%(channel)s, queue) FROM jobs)
SELECT true, jobs.id, NULL::text, NULL::text FROM jobs CROSS JOIN (SELECT count(*) FROM notified) AS n
UNION ALL
SELECT false, redrive.new_job_id, redrive.requested_by, redrive.reason
FROM workhorse_redrive AS redrive
WHERE redrive.source_id = %(source_id)s AND redrive.request_id = %(request_id)s
  AND NOT EXISTS (SELECT 1 FROM lineage)
"""

# find_redrive: a recorded redrive by (source, request id), via workhorse_redrive_source_request_uniq.
FIND_REDRIVE = """
SELECT false, new_job_id, requested_by, reason FROM workhorse_redrive
WHERE source_id = %(source_id)s AND request_id = %(request_id)s
"""

# cancel: stop a job. A queued job is cancelled at once; a running one is asked to stop (its
# handler sees ctx.cancelled at the next heartbeat). Returns the job's status before, if it exists.
CANCEL = """
WITH target AS (
    SELECT id, status FROM workhorse_job WHERE id = %(job_id)s FOR UPDATE
),
cancelled AS (
    UPDATE workhorse_job AS job
    SET status = CASE WHEN target.status = 'queued' THEN 'cancelled' ELSE job.status END,
        finished_at = CASE WHEN target.status = 'queued' THEN clock_timestamp() ELSE job.finished_at END,
        cancel_requested = target.status = 'running'
    FROM target
    WHERE job.id = target.id AND target.status IN ('queued', 'running')
    RETURNING job.id, job.attempt, target.status AS was
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, CASE WHEN was = 'queued' THEN 'cancelled' ELSE 'cancel_requested' END, attempt,
           clock_timestamp(), jsonb_build_object('requested_by', %(requested_by)s::text)
    FROM cancelled
)
SELECT status FROM target
"""


def redrive(
    alias: str, *, source_id: int, request_id: str, requested_by: str, reason: str, channel: str
) -> tuple[bool, int, str, str] | None:
    """Run REDRIVE; return (created, new job id, stored requested_by, stored reason), or None."""
    params = {
        "source_id": source_id, "request_id": request_id, "requested_by": requested_by, "reason": reason,
        "channel": channel,
    }  # fmt: skip
    rows = _execute(alias, REDRIVE, params)
    return tuple(rows[0]) if rows else None


def find_redrive(alias: str, *, source_id: int, request_id: str) -> tuple[bool, int, str, str] | None:
    """Read a recorded redrive in a fresh snapshot (one committed after REDRIVE's snapshot)."""
    rows = _execute(alias, FIND_REDRIVE, {"source_id": source_id, "request_id": request_id})
    return tuple(rows[0]) if rows else None


def cancel(alias: str, job_id: int, requested_by: str) -> str | None:
    """Run CANCEL; return the job's status before it, or None if there is no such job."""
    rows = _execute(alias, CANCEL, {"job_id": job_id, "requested_by": requested_by})
    return rows[0][0] if rows else None


# register_worker: record this worker process (a restart under the same name replaces it).
REGISTER_WORKER = """
INSERT INTO workhorse_worker (name, host, pid, queues, concurrency, started_at, heartbeat_at)
VALUES (%(name)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, clock_timestamp(), clock_timestamp())
ON CONFLICT (name) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at
"""

# touch_worker: this worker is alive (workhorse_worker_name_uniq).
TOUCH_WORKER = "UPDATE workhorse_worker SET heartbeat_at = clock_timestamp() WHERE name = %(name)s"

# deregister_worker: a clean exit.
DEREGISTER_WORKER = "DELETE FROM workhorse_worker WHERE name = %(name)s"

# prune_stale_workers: forget workers that stopped heartbeating (killed, host lost).
PRUNE_STALE_WORKERS = "DELETE FROM workhorse_worker WHERE heartbeat_at < clock_timestamp() - %(stale_after)s"

# prune_finished_jobs: delete up to %(limit)s jobs that finished before %(before)s and whose
# bindings own nothing any more (a live key always finds its job), with those bindings, events,
# checkpoints and redrive records; uses workhorse_job_finished_idx.
PRUNE_FINISHED_JOBS = f"""
WITH doomed AS (
    SELECT id FROM workhorse_job AS job
    WHERE status IN {_TERMINAL} AND finished_at < %(before)s
      AND NOT EXISTS (
          SELECT 1 FROM workhorse_binding AS binding
          WHERE binding.job_id = job.id AND NOT ({_FREE.format(now="statement_timestamp()")})
      )
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
released AS (DELETE FROM workhorse_binding WHERE job_id IN (SELECT id FROM doomed)),
events AS (DELETE FROM workhorse_job_event WHERE job_id IN (SELECT id FROM doomed)),
checkpoints AS (DELETE FROM workhorse_checkpoint WHERE job_id IN (SELECT id FROM doomed)),
redrives AS (
    DELETE FROM workhorse_redrive
    WHERE source_id IN (SELECT id FROM doomed) OR new_job_id IN (SELECT id FROM doomed)
)
DELETE FROM workhorse_job WHERE id IN (SELECT id FROM doomed)
"""

# maintenance lock: one maintenance run at a time across every worker and command (a session
# advisory lock, released explicitly or when the connection ends).
TRY_MAINTENANCE_LOCK = "SELECT pg_try_advisory_lock(%(key)s)"
RELEASE_MAINTENANCE_LOCK = "SELECT pg_advisory_unlock(%(key)s)"
MAINTENANCE_LOCK_KEY = 0x776F726B686F7273  # "workhors"


def register_worker(alias: str, *, name: str, host: str, pid: int, queues: Sequence[str], concurrency: int) -> None:
    """Run REGISTER_WORKER."""
    params = {"name": name, "host": host, "pid": pid, "queues": json.dumps(list(queues)), "concurrency": concurrency}
    _run(alias, REGISTER_WORKER, params)


def touch_worker(alias: str, name: str) -> None:
    """Run TOUCH_WORKER."""
    _run(alias, TOUCH_WORKER, {"name": name})


def deregister_worker(alias: str, name: str) -> None:
    """Run DEREGISTER_WORKER."""
    _run(alias, DEREGISTER_WORKER, {"name": name})


def prune_stale_workers(alias: str, stale_after: timedelta) -> int:
    """Run PRUNE_STALE_WORKERS; return how many records were deleted."""
    return _run(alias, PRUNE_STALE_WORKERS, {"stale_after": stale_after})


def prune_finished_jobs(alias: str, *, before: datetime, limit: int) -> int:
    """Run PRUNE_FINISHED_JOBS once; return how many jobs were deleted."""
    return _run(alias, PRUNE_FINISHED_JOBS, {"before": before, "limit": limit})


@contextmanager
def maintenance_lock(alias: str) -> Iterator[bool]:
    """Hold the maintenance advisory lock if no one else does; yield whether it was taken."""
    taken = bool(_execute(alias, TRY_MAINTENANCE_LOCK, {"key": MAINTENANCE_LOCK_KEY})[0][0])
    try:
        yield taken
    finally:
        if taken:
            _execute(alias, RELEASE_MAINTENANCE_LOCK, {"key": MAINTENANCE_LOCK_KEY})


def _run(alias: str, statement: str, params: dict[str, Any]) -> int:
    with _cursor(alias) as cursor:
        cursor.execute(statement, params)
        return int(cursor.rowcount)


# listen: subscribe a dedicated connection to the channel enqueue notifies on commit.
LISTEN = "LISTEN {channel}"


@contextmanager
def listen(alias: str, channel: str) -> Iterator[psycopg.Connection[Any]]:
    """Open a dedicated autocommit connection (outside Django's) that LISTENs on ``channel``."""
    params = connections[alias].get_connection_params()
    for django_only in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(django_only, None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(pgsql.SQL(LISTEN).format(channel=pgsql.Identifier(channel)))
        yield conn


# load_checkpoint: the stored result of a stage, if any (workhorse_checkpoint_job_name_uniq).
LOAD_CHECKPOINT = "SELECT value FROM workhorse_checkpoint WHERE job_id = %(job_id)s AND name = %(name)s"


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


# Two workers that pick the same free concurrency slot at once: the second claims again. Two claims
# that take slots can also deadlock on the slot index (each inserts its entries in its own row
# order, and waits for the other's uncommitted ones); PostgreSQL aborts one, which claims again too.
CLAIM_ATTEMPTS = 5
DEADLOCK_DETECTED = "40P01"


# use_generic_plans: planning CLAIM costs more than running it, and PostgreSQL would plan it again
# on every execution (its custom plans look cheaper than the generic one for a small LIMIT), so a
# worker's claiming connection keeps one generic plan per prepared statement: 2.4 ms -> 1.1 ms per
# claim here. Only connections that claim get it (never a caller's connection: eager mode uses
# claim_job); what else they run (reclaims, maintenance) plans the same either way.
USE_GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"
_generic_plan_connections: weakref.WeakSet[Any] = weakref.WeakSet()


def claim(alias: str, *, queues: Sequence[str], limit: int, lease: timedelta, worker: str) -> list[ClaimedJob]:
    """Run CLAIM (on a connection that keeps generic plans); return the leased jobs in priority order."""
    _use_generic_plans(alias)
    params = {"queues": list(queues), "limit": limit, "lease": lease, "worker": worker}
    return _claim(alias, CLAIM, params)


def _use_generic_plans(alias: str) -> None:
    connection = connections[alias]
    connection.ensure_connection()
    raw = connection.connection
    if raw not in _generic_plan_connections:
        with connection.cursor() as cursor:
            cursor.execute(USE_GENERIC_PLANS)
        _generic_plan_connections.add(raw)


def claim_job(alias: str, *, job_id: int, lease: timedelta, worker: str, scheduled: bool = False) -> ClaimedJob | None:
    """Run CLAIM_JOB inside a savepoint; return the leased job, or None if it is not claimable now."""
    params = {"job_id": job_id, "limit": 1, "lease": lease, "worker": worker, "scheduled": scheduled}
    jobs = _claim(alias, CLAIM_JOB, params, savepoint=True)
    return jobs[0] if jobs else None


def _claim(alias: str, statement: str, params: dict[str, Any], *, savepoint: bool = False) -> list[ClaimedJob]:
    for _ in range(CLAIM_ATTEMPTS):
        try:
            with transaction.atomic(using=alias) if savepoint else nullcontext():
                rows = _execute(alias, statement, params)
        except IntegrityError as exc:
            if constraint_name(exc) != JOB_CONCURRENCY_SLOT_UNIQ:
                raise
            continue
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != DEADLOCK_DETECTED:
                raise
            continue
        return [
            ClaimedJob(*(_json(value) if i in (3, 6) else value for i, value in enumerate(row[:11]))) for row in rows
        ]
    return []


def constraint_name(exc: BaseException) -> str | None:
    """Return the name of the constraint a database error violated, if PostgreSQL named one."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)


def record_outcomes(alias: str, outcomes: Sequence[Any]) -> set[int]:
    """Run RECORD_OUTCOMES for ``execution.Outcome`` values; return the ids whose lease was still held."""
    encoded = "[" + ",".join(_json_outcome(outcome) for outcome in outcomes) + "]"
    return {row[0] for row in _execute(alias, RECORD_OUTCOMES, {"outcomes": encoded})}


def _json_outcome(outcome: Any) -> str:
    fields = {
        "id": outcome.job.id,
        "token": str(outcome.job.lease_token),
        "status": outcome.status,
        "error": outcome.error,
        "run_at": outcome.run_at.isoformat() if outcome.run_at else None,
        "events": [[kind, details] for kind, details in outcome.events],
    }
    text = json.dumps(fields, default=str)
    # The result is canonical JSON already: splice it in rather than parse and re-encode it.
    return text if outcome.result_json is None else text[:-1] + f',"result":{outcome.result_json}}}'


def extend_leases(alias: str, held: Sequence[ClaimedJob], lease: timedelta) -> dict[int, bool]:
    """Run EXTEND_LEASES; return {id: cancel requested} for the jobs still held."""
    params = {"job_ids": [j.id for j in held], "tokens": [j.lease_token for j in held], "lease": lease}
    return {row[0]: bool(row[1]) for row in _execute(alias, EXTEND_LEASES, params)}


def release(alias: str, held: Sequence[tuple[ClaimedJob, bool]]) -> None:
    """Run RELEASE for ``(job, handler_started)`` pairs."""
    params = {
        "job_ids": [job.id for job, _ in held],
        "tokens": [job.lease_token for job, _ in held],
        "started": [started for _, started in held],
    }
    _run(alias, RELEASE, params)


def reclaim_expired(alias: str, *, limit: int = 1000) -> int:
    """Run RECLAIM_EXPIRED once; return how many jobs it took back."""
    return int(_execute(alias, RECLAIM_EXPIRED, {"limit": limit})[0][0])


def save_checkpoint(alias: str, job: ClaimedJob, name: str, value_json: str) -> bool:
    """Run SAVE_CHECKPOINT; return whether this worker still held the job."""
    params = {"job_id": job.id, "token": job.lease_token, "name": name, "value": value_json}
    return bool(_execute(alias, SAVE_CHECKPOINT, params)[0][0])


def load_checkpoint(alias: str, job_id: int, name: str) -> tuple[bool, Any]:
    """Run LOAD_CHECKPOINT; return (found, value)."""
    rows = _execute(alias, LOAD_CHECKPOINT, {"job_id": job_id, "name": name})
    return (True, _json(rows[0][0])) if rows else (False, None)


def _json(value: Any) -> Any:
    # Django's connections hand jsonb back as text; the ORM decodes it, raw cursors do not.
    return json.loads(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class ExistingBinding:
    """A binding found in the way of a request."""

    ordinal: int
    job_id: int
    mode: str
    request_digest: bytes
    field_digests: dict[str, str]
    free: bool  # it owns nothing any more: the next request takes the key over
    job_state: str  # 'open', 'due' or 'started' (see _JOB_STATE)


@dataclass
class EnqueueRows:
    """What ENQUEUE did: accepted ordinals with their job ids, and the bindings it saw."""

    accepted: dict[int, int]
    existing: dict[int, ExistingBinding]


def enqueue_rows(alias: str, rows: Sequence[tuple[int, PreparedJob]], channel: str) -> EnqueueRows:
    """Run ENQUEUE for ``(ordinal, request)`` pairs."""
    result = EnqueueRows(accepted={}, existing={})
    keyed = any(request.binding is not None for _, request in rows)
    if len(rows) == 1:
        statement, params = ENQUEUE_ONE if keyed else ENQUEUE_ONE_UNKEYED, _one_request_params(rows[0], channel)
    else:
        statement, params = ENQUEUE_MANY if keyed else ENQUEUE_MANY_UNKEYED, _request_params(rows, channel)
    for row in _execute(alias, statement, params):
        ordinal, job_id, accepted = row[0], row[1], row[2]
        if accepted:
            result.accepted[ordinal] = job_id
        else:
            result.existing[ordinal] = _existing(ordinal, (row[1], *row[3:]))
    return result


def take_over(alias: str, ordinal: int, request: PreparedJob, seen_job_id: int, channel: str) -> int | None:
    """Run TAKE_OVER for one request; return the new job id, or None if the key is no longer free
    or no longer names ``seen_job_id``."""
    params = {**_one_request_params((ordinal, request), channel), "seen_job_id": seen_job_id}
    rows = _execute(alias, TAKE_OVER, params)
    return rows[0][1] if rows else None


def replace_debounced(alias: str, ordinal: int, request: PreparedJob, seen_job_id: int) -> bool:
    """Run REPLACE_DEBOUNCED; return whether the pending job took the request's definition."""
    binding = request.binding
    assert binding is not None and binding.window is not None
    params = {
        **_one_request_params((ordinal, request), ""),
        "seen_job_id": seen_job_id,
        "reset": binding.reset,
        "window": binding.window,
    }
    return bool(_execute(alias, REPLACE_DEBOUNCED, params))


def find_bindings(alias: str, rows: Sequence[tuple[int, PreparedJob]]) -> dict[int, ExistingBinding]:
    """Run FIND_BINDINGS for keyed ``(ordinal, request)`` pairs."""
    bindings = [(ordinal, request.binding) for ordinal, request in rows if request.binding is not None]
    params = {
        "ordinal": [ordinal for ordinal, _ in bindings],
        "scope": [binding.scope for _, binding in bindings],
        "key_hash": [binding.key_hash for _, binding in bindings],
    }
    return {row[0]: _existing(row[0], row[1:]) for row in _execute(alias, FIND_BINDINGS, params)}


def purge_queued(alias: str, *, queue: str | None, job_ids: Sequence[int] | None) -> int:
    """Run PURGE_QUEUED; return how many jobs were deleted."""
    return _run(alias, PURGE_QUEUED, {"queue": queue, "job_ids": list(job_ids) if job_ids is not None else None})


def prune_expired_bindings(alias: str, *, limit: int) -> int:
    """Run PRUNE_EXPIRED_BINDINGS once; return how many bindings were deleted."""
    return _run(alias, PRUNE_EXPIRED_BINDINGS, {"limit": limit})


def _execute(alias: str, statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with _cursor(alias) as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall())


class _PreparedCursor(psycopg.Cursor[Any]):
    """A server-side-binding cursor that always uses a prepared statement.

    The enqueue statements are large CTEs whose planning costs more than running them; preparing
    them once per connection roughly halves the time of an enqueue.
    """

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
    ) -> Any:
        return super().execute(query, params, prepare=True, binary=binary)


def _cursor(alias: str) -> CursorWrapper:
    """Return a Django cursor wrapper (query logging, execute wrappers, error translation) for ``alias``.

    With WORKHORSE_PREPARED_STATEMENTS it wraps a prepared-statement cursor over Django's own
    connection, so the statement still joins the caller's transaction.
    """
    connection = connections[alias]
    if not app_settings.PREPARED_STATEMENTS:
        return connection.cursor()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        if connection.connection.prepare_threshold is None:
            # Django disables preparing by default; a threshold this high prepares only what
            # asks for it explicitly, as _PreparedCursor does.
            connection.connection.prepare_threshold = 2**31 - 1
        raw = _PreparedCursor(connection.connection)
    return cast(CursorWrapper, connection._prepare_cursor(raw))  # type: ignore[attr-defined]


def _request_values(ordinal: int, job: PreparedJob) -> tuple[Any, ...]:
    """Return one request's values in _REQUEST_COLUMNS order (jsonb columns as JSON text)."""
    binding = job.binding
    return (
        ordinal, job.job_type, job.queue, job.payload_json, job.priority, job.run_at, job.delay,
        json.dumps(job.tags), job.max_attempts, job.retry_policy_json, job.deadline, job.timeout,
        job.concurrency_key, job.concurrency_limit, binding and binding.scope, binding and binding.key_hash,
        binding and binding.key_preview, binding and binding.mode.value, binding and binding.request_digest,
        binding and json.dumps(binding.field_digests, sort_keys=True), binding and binding.lifetime,
    )  # fmt: skip


def _one_request_params(row: tuple[int, PreparedJob], channel: str) -> dict[str, Any]:
    return {**dict(zip(_COLUMNS, _request_values(*row), strict=True)), "channel": channel}


def _request_params(rows: Sequence[tuple[int, PreparedJob]], channel: str) -> dict[str, Any]:
    """Encode a batch as one JSON array of arrays, read back by _MANY_REQUESTS_CTE."""
    return {"rows": "[" + ",".join(_json_row(ordinal, job) for ordinal, job in rows) + "]", "channel": channel}


def _json_row(ordinal: int, job: PreparedJob) -> str:
    """Return one request as a JSON array in _REQUEST_COLUMNS order (hot path: no per-value dispatch)."""
    quote, binding = _quote, job.binding
    head = (
        f"[{ordinal},{quote(job.job_type)},{quote(job.queue)},{job.payload_json},{job.priority},"
        f"{_json_time(job.run_at)},{_json_micros(job.delay)},[{','.join(map(quote, job.tags))}],"
        f"{job.max_attempts},{job.retry_policy_json},{_json_time(job.deadline)},{_json_micros(job.timeout)},"
        f"{'null' if job.concurrency_key is None else quote(job.concurrency_key)},"
        f"{'null' if job.concurrency_limit is None else job.concurrency_limit},"
    )
    if binding is None:
        return head + "null,null,null,null,null,null,null]"
    return head + (
        f'{quote(binding.scope)},"{binding.key_hash.hex()}",{quote(binding.key_preview)},"{binding.mode.value}",'
        f'"{binding.request_digest.hex()}",{_json_digests(binding.field_digests)},{_json_micros(binding.lifetime)}]'
    )


def _json_digests(digests: dict[str, str]) -> str:
    # Field names are ours and digests are hex: nothing needs escaping.
    return "{" + ",".join(f'"{name}":"{digest}"' for name, digest in digests.items()) + "}"


# JSON string quoting without json.dumps' per-call set-up (the C function json.dumps itself uses).
_quote: Callable[[str], str] = json.encoder.encode_basestring


def _json_time(value: datetime | None) -> str:
    return "null" if value is None else f'"{value.isoformat()}"'


def _json_micros(value: timedelta | None) -> str:
    return "null" if value is None else str(value // timedelta(microseconds=1))


def _existing(ordinal: int, values: Sequence[Any]) -> ExistingBinding:
    job_id, mode, digest, field_digests, free, job_state = values
    if isinstance(field_digests, str):
        field_digests = json.loads(field_digests)
    return ExistingBinding(
        ordinal=ordinal,
        job_id=job_id,
        mode=mode,
        request_digest=bytes(digest),
        field_digests=field_digests,
        free=bool(free),
        job_state=job_state,
    )


# run_now: make scheduled queued jobs due now (an operator's "run now"), record who asked, and
# wake the workers of their queues at commit.
RUN_NOW = """
WITH moved AS (
    UPDATE workhorse_job SET run_at = clock_timestamp()
    WHERE id = ANY(%(job_ids)s::bigint[]) AND status = 'queued' AND run_at > clock_timestamp()
    RETURNING id, attempt, queue
),
events AS (
    INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
    SELECT id, 'run_now', attempt, clock_timestamp(), jsonb_build_object('requested_by', %(requested_by)s::text)
    FROM moved
),
notified AS (SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM moved) AS queues)
SELECT id FROM moved CROSS JOIN (SELECT count(*) FROM notified) AS n
"""

# release_binding: free a key at once (an operator's "release"), recording who did it on the job
# the key named. Returns the job ids whose keys were released.
RELEASE_BINDINGS = """
WITH released AS (
    DELETE FROM workhorse_binding WHERE id = ANY(%(binding_ids)s::bigint[])
    RETURNING job_id, mode, scope, encode(substring(key_hash from 1 for 6), 'hex') AS key_digest
)
INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
SELECT released.job_id, 'key_released', job.attempt, clock_timestamp(), jsonb_build_object(
    'requested_by', %(requested_by)s::text, 'mode', released.mode, 'scope', released.scope,
    'key_digest', released.key_digest)
FROM released JOIN workhorse_job AS job ON job.id = released.job_id
RETURNING job_id
"""


def run_now(alias: str, job_ids: Sequence[int], requested_by: str, channel: str) -> list[int]:
    """Run RUN_NOW; return the ids of the jobs moved."""
    params = {"job_ids": list(job_ids), "requested_by": requested_by, "channel": channel}
    return [row[0] for row in _execute(alias, RUN_NOW, params)]


def release_bindings(alias: str, binding_ids: Sequence[int], requested_by: str) -> list[int]:
    """Run RELEASE_BINDINGS; return the ids of the jobs whose keys were released."""
    params = {"binding_ids": list(binding_ids), "requested_by": requested_by}
    return [row[0] for row in _execute(alias, RELEASE_BINDINGS, params)]


# claim_effect: claim an operation of the effect ledger in the caller's transaction, or find the
# entry that has it. ON CONFLICT DO NOTHING on workhorse_effect_scope_key_hash_uniq waits for an
# in-flight claimant to commit (then conflicts) or roll back (then this insert goes ahead), and
# never raises: the caller's transaction stays usable. Returns (true, id, NULL, true) for a new
# claim, or (false, id, result, live) for an entry this statement's snapshot can see; no row at all
# means the entry was committed after that snapshot (read it with FIND_EFFECT). The result is read
# as text so that a stored JSON string is not mistaken for already-decoded JSON.
CLAIM_EFFECT = """
WITH claimed AS (
    INSERT INTO workhorse_effect (scope, key_hash, key_preview, result, created_at, completed_at, expires_at)
    VALUES (%(scope)s::text, %(key_hash)s::bytea, %(key_preview)s::text, NULL, statement_timestamp(), NULL,
            statement_timestamp() + %(retention)s::interval)
    ON CONFLICT (scope, key_hash) DO NOTHING
    RETURNING id
)
SELECT true, id, NULL::text, true FROM claimed
UNION ALL
SELECT false, effect.id, effect.result::text, effect.expires_at > statement_timestamp()
FROM workhorse_effect AS effect
WHERE effect.scope = %(scope)s::text AND effect.key_hash = %(key_hash)s::bytea
  AND NOT EXISTS (SELECT 1 FROM claimed)
"""

# find_effect: read a ledger entry by key in a fresh snapshot, for an entry CLAIM_EFFECT found
# taken by a transaction that committed after its snapshot (workhorse_effect_scope_key_hash_uniq).
FIND_EFFECT = """
SELECT false, effect.id, effect.result::text, effect.expires_at > statement_timestamp()
FROM workhorse_effect AS effect
WHERE effect.scope = %(scope)s::text AND effect.key_hash = %(key_hash)s::bytea
"""

# take_over_effect: claim an entry past its retention for a new run of the effect, compare-and-swap
# on the entry seen expired. The row lock of the UPDATE serializes racing takers; PostgreSQL
# re-checks the locked row, so a taker that lost the race (the entry is live again) gets no row
# back and reads the winner's entry instead. A pruned entry gives no row either: claim again.
TAKE_OVER_EFFECT = """
UPDATE workhorse_effect
SET key_preview = %(key_preview)s::text, result = NULL, created_at = statement_timestamp(), completed_at = NULL,
    expires_at = statement_timestamp() + %(retention)s::interval
WHERE id = %(seen_id)s::bigint AND expires_at <= statement_timestamp()
RETURNING id
"""

# store_effect: record the result of a claimed operation, in the transaction that claimed it and
# ran the effect; the retention window starts now, when the effect is done.
STORE_EFFECT = """
UPDATE workhorse_effect
SET result = %(result)s::jsonb, completed_at = statement_timestamp(),
    expires_at = statement_timestamp() + %(retention)s::interval
WHERE id = %(id)s::bigint
"""

# prune_expired_effects: delete up to %(limit)s ledger entries past their retention; uses
# workhorse_effect_expires_idx. An entry being taken over right now is locked, and skipped.
PRUNE_EXPIRED_EFFECTS = """
DELETE FROM workhorse_effect
WHERE id IN (
    SELECT id FROM workhorse_effect
    WHERE expires_at <= statement_timestamp()
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
"""


@dataclass(frozen=True)
class EffectEntry:
    """A ledger entry as a statement saw it: ``claimed`` by this transaction, or someone else's."""

    claimed: bool
    id: int
    result_json: str | None  # the stored result as JSON text (None while in flight)
    live: bool  # within its retention window; an entry that is not live may be taken over


def claim_effect(
    alias: str, *, scope: str, key_hash: bytes, key_preview: str, retention: timedelta
) -> EffectEntry | None:
    """Run CLAIM_EFFECT; return the new claim or the entry seen, or None if the entry is not visible yet."""
    params = {"scope": scope, "key_hash": key_hash, "key_preview": key_preview, "retention": retention}
    rows = _execute(alias, CLAIM_EFFECT, params)
    return EffectEntry(*rows[0]) if rows else None


def find_effect(alias: str, *, scope: str, key_hash: bytes) -> EffectEntry | None:
    """Run FIND_EFFECT; return the entry, or None if there is none."""
    rows = _execute(alias, FIND_EFFECT, {"scope": scope, "key_hash": key_hash})
    return EffectEntry(*rows[0]) if rows else None


def take_over_effect(alias: str, *, seen_id: int, key_preview: str, retention: timedelta) -> bool:
    """Run TAKE_OVER_EFFECT; return whether this transaction now holds the operation."""
    params = {"seen_id": seen_id, "key_preview": key_preview, "retention": retention}
    return bool(_execute(alias, TAKE_OVER_EFFECT, params))


def store_effect(alias: str, *, entry_id: int, result_json: str, retention: timedelta) -> int:
    """Run STORE_EFFECT; return how many entries were updated (1)."""
    return _run(alias, STORE_EFFECT, {"id": entry_id, "result": result_json, "retention": retention})


def prune_expired_effects(alias: str, *, limit: int) -> int:
    """Run PRUNE_EXPIRED_EFFECTS once; return how many ledger entries were deleted."""
    return _run(alias, PRUNE_EXPIRED_EFFECTS, {"limit": limit})
