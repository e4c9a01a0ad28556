"""Enqueue: insert jobs and bind their keys in one statement, take free keys over, replace
debounced jobs, and read bindings in a fresh snapshot."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections

from django_workhorse.enqueueing.prepared import PreparedJob
from django_workhorse.models import JOB_ID_SEQUENCE
from django_workhorse.sql.connection import execute
from django_workhorse.sql.enqueue_rows import (
    KINDS,
    REQUEST_COLUMNS,
    function_params,
    one_request_params,
    request_params,
)
from django_workhorse.sql.keys import BINDING_COLUMNS, FREE, JOB_STATE

# Job ids are drawn up front so a binding can name its job in the same statement.
DRAWN = f"nextval('{JOB_ID_SEQUENCE}') AS job_id, statement_timestamp() AS now"
# One request as scalar parameters: planning a one-row statement is cheap.
_ONE_REQUEST_CTE = "requests AS (SELECT {}, {})".format(
    ", ".join(f"%({name})s::{kind} AS {name}" for name, kind in REQUEST_COLUMNS), DRAWN
)
# How a batch row (a JSON array) yields each column: one text parameter carries the whole batch,
# which costs far less to send than twenty arrays, and payloads arrive as jsonb without a re-parse.
FROM_JSON = {
    "int": "({r}->>{i})::int",
    "text": "{r}->>{i}",
    "jsonb": "{r}->{i}",
    "timestamptz": "({r}->>{i})::timestamptz",
    "interval": "({r}->>{i})::bigint * interval '1 microsecond'",
    "bytea": "decode({r}->>{i}, 'hex')",
}
_MANY_REQUESTS_CTE = "requests AS (SELECT {}, {} FROM jsonb_array_elements(%(rows)s::jsonb) AS r)".format(
    ", ".join(f"{FROM_JSON[kind].format(r='r', i=i)} AS {name}" for i, (name, kind) in enumerate(REQUEST_COLUMNS)),
    DRAWN,
)
# A batch without keys sends only the columns a job needs (no NULLs for the binding's seven):
# shorter rows to build, send and unpack.
_KEY_COLUMNS = ("scope", "key_hash", "key_preview", "mode", "request_digest", "field_digests", "lifetime")
UNKEYED_REQUEST_COLUMNS = tuple(column for column in REQUEST_COLUMNS if column[0] not in _KEY_COLUMNS)
_MANY_UNKEYED_REQUESTS_CTE = "requests AS (SELECT {}, {} FROM jsonb_array_elements(%(rows)s::jsonb) AS r)".format(
    ", ".join(
        f"{FROM_JSON[kind].format(r='r', i=i)} AS {name}" for i, (name, kind) in enumerate(UNKEYED_REQUEST_COLUMNS)
    ),
    DRAWN,
)


# The job columns before migration 0025 (cipher_salt), for the enqueue function that migration replaces
# when it is reversed.
UNSALTED_JOB_COLUMNS = (
    "id, job_type, queue, payload, status, priority, run_at, attempt, max_attempts, retry_policy, deadline, "
    "timeout, concurrency_key, concurrency_limit, tags, created_at, last_error, scheduled_for, trace_context, "
    "breaker_key, rate_limit, rate_partition, partition_key"
)
JOB_COLUMNS = UNSALTED_JOB_COLUMNS + ", cipher_salt"


def job_values(
    value: Callable[[str], str], job_id: str, now: str, status: str = "'queued'", *, cipher_salt: bool = True
) -> str:
    """What a new job row holds, in JOB_COLUMNS order (UNSALTED_JOB_COLUMNS without ``cipher_salt``);
    ``value(name)`` reads a request column and ``status`` is the SQL of its status (a workflow's steps
    with parents start ``waiting``)."""
    run_at = f"coalesce({value('run_at')}, {now} + coalesce({value('delay')}, interval '0'))"
    return (
        f"{job_id}, {value('job_type')}, {value('queue')}, {value('payload')}, {status}, {value('priority')}, "
        f"{run_at}, 0, {value('max_attempts')}, {value('retry_policy')}, {value('deadline')}, {value('timeout')}, "
        f"{value('concurrency_key')}, {value('concurrency_limit')}, {value('tags')}, {now}, '', "
        f"{value('scheduled_for')}, {value('trace_context')}, {value('breaker_key')}, {value('rate_limit')}, "
        f"{value('rate_partition')}, {value('partition_key')}" + (f", {value('cipher_salt')}" if cipher_salt else "")
    )


def _jobs_ctes(only: str = "") -> str:
    """Insert the jobs of ``requests`` (filtered by ``only``) and send one NOTIFY per queue for work that
    is ready now (PostgreSQL delivers it at commit, drops it on rollback). The job row's
    ``created_at`` is the enqueue's record: no event row is written for it (decision 0013)."""
    return f"""
jobs AS (
    INSERT INTO workhorse_job ({JOB_COLUMNS})
    SELECT {job_values(str, "job_id", "now")}
    FROM requests
    {only}
    RETURNING id, queue, run_at, created_at
),
notified AS (
    SELECT pg_notify(%(channel)s, queue)
    FROM (SELECT DISTINCT queue FROM jobs WHERE run_at <= created_at) AS ready
)"""


# A single job notifies its queue from RETURNING when it is ready now: the statement has no other
# node to plan or start. Callers return the column (`notified`), so it is computed.
_NOTIFY_ONE = "CASE WHEN run_at <= created_at THEN pg_notify({channel}, queue) IS NULL END AS notified"


# The accepted requests; referencing `notified` makes PostgreSQL run it.
_ACCEPTED = """
SELECT requests.ordinal, requests.job_id, true, NULL::text, NULL::bytea, NULL::jsonb, NULL::boolean, NULL::text
FROM requests JOIN jobs ON jobs.id = requests.job_id
CROSS JOIN (SELECT count(*) FROM notified) AS notifications"""


# enqueue_unkeyed: requests without a key only ever insert; skipping the binding CTEs makes the
# statement noticeably cheaper to run, and a single one is a plain INSERT .. VALUES.
ENQUEUE_ONE_UNKEYED = f"""
INSERT INTO workhorse_job ({JOB_COLUMNS})
VALUES ({job_values(lambda name: f"%({name})s::{KINDS[name]}", f"nextval('{JOB_ID_SEQUENCE}')", "statement_timestamp()")})
RETURNING %(ordinal)s::int, id, true, {_NOTIFY_ONE.format(channel="%(channel)s")}"""
ENQUEUE_MANY_UNKEYED = f"WITH {_MANY_UNKEYED_REQUESTS_CTE},{_jobs_ctes()}{_ACCEPTED}"


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
    columns=BINDING_COLUMNS.replace("binding.job_id,", "binding.job_id, false,").format(
        free=FREE.format(now="requests.now"), state=JOB_STATE.format(now="requests.now")
    )
)
_ONLY_UNKEYED_OR_BOUND = "WHERE key_hash IS NULL OR job_id IN (SELECT job_id FROM bound)"

# enqueue_one: one keyed request, in the PL/pgSQL function workhorse_enqueue_one (decision 0014),
# so that a replay costs what a lookup costs: the statement that inserts is planned and started only
# when the key is not seen. The function runs three statements, each in a fresh snapshot under READ
# COMMITTED: look the key up (a probe of workhorse_binding_scope_key_hash_uniq; a binding found is
# returned as it is, nothing drawn, inserted or locked); otherwise draw a job id and bind it as
# ENQUEUE does (ON CONFLICT DO NOTHING, waiting for an in-flight owner); if another transaction bound
# the key in between, look again and return its binding. No row at all means the binding vanished
# meanwhile (pruned, purged): find_bindings and the caller's next round deal with it, as for a batch.
# Besides the key it looks up, the request arrives as one JSON text in REQUEST_COLUMNS order (a
# batch's row), parsed only by the insert: a replay parses none of it (binding twenty typed
# parameters cost a replay about as much as its lookup).
_FUNCTION_PARAMS = (("p_ordinal", "int"), ("p_scope", "text"), ("p_key_hash", "bytea"), ("p_request", "text"),
                    ("p_channel", "text"))  # fmt: skip
_LOOKUP = """
    SELECT p_ordinal, {columns}
    FROM workhorse_binding AS binding
    JOIN workhorse_job AS job ON job.id = binding.job_id
    WHERE binding.scope = p_scope AND binding.key_hash = p_key_hash""".format(
    columns=BINDING_COLUMNS.replace(
        "binding.job_id, binding.mode,", "binding.job_id, false, binding.mode::text,"
    ).format(free=FREE.format(now="statement_timestamp()"), state=JOB_STATE.format(now="statement_timestamp()"))
)


_INDEX = {name: i for i, (name, _) in enumerate(REQUEST_COLUMNS)}


def _from_request(name: str) -> str:
    """Read column ``name`` of the function's request (the JSON variable ``v_request``)."""
    return FROM_JSON[KINDS[name]].format(r="v_request", i=_INDEX[name])


# The key's binding and its job, one row each: the job is inserted only if the binding was.
_BIND_ONE = """WITH bound AS (
        INSERT INTO workhorse_binding (
            scope, key_hash, key_preview, mode, request_digest, field_digests, job_id, created_at, expires_at)
        VALUES (p_scope, p_key_hash, {key_preview}, {mode},
                {request_digest}, {field_digests}, nextval('{sequence}'),
                statement_timestamp(), statement_timestamp() + {lifetime})
        ON CONFLICT (scope, key_hash) DO NOTHING
        RETURNING job_id
    ),
    jobs AS (
        INSERT INTO workhorse_job ({job_columns})
        SELECT {job_values} FROM bound
        RETURNING id, {notify_one}
    )
    SELECT p_ordinal, id, true, NULL::text, NULL::bytea, NULL::jsonb, notified, NULL::text FROM jobs"""
ENQUEUE_ONE_FUNCTION = "workhorse_enqueue_one"
_CREATE_ENQUEUE_ONE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION {ENQUEUE_ONE_FUNCTION}({", ".join(f"{name} {kind}" for name, kind in _FUNCTION_PARAMS)})
RETURNS TABLE (ordinal int, job_id bigint, accepted boolean, mode text, request_digest bytea,
               field_digests jsonb, free boolean, state text)
LANGUAGE plpgsql VOLATILE AS $function$
#variable_conflict use_column
DECLARE
    v_request jsonb;
BEGIN
    RETURN QUERY {_LOOKUP};
    IF FOUND THEN
        RETURN;
    END IF;
    v_request := p_request::jsonb;
    RETURN QUERY {{bind_one}};
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY {_LOOKUP};
END
$function$"""


def create_enqueue_one_function(*, cipher_salt: bool = True) -> str:
    """The statement that creates (or replaces) ``workhorse_enqueue_one``; without ``cipher_salt`` its
    body as before migration 0025 (which reverses to it)."""
    bind_one = _BIND_ONE.format(
        key_preview=_from_request("key_preview"),
        mode=_from_request("mode"),
        request_digest=_from_request("request_digest"),
        field_digests=_from_request("field_digests"),
        sequence=JOB_ID_SEQUENCE,
        lifetime=_from_request("lifetime"),
        job_columns=JOB_COLUMNS if cipher_salt else UNSALTED_JOB_COLUMNS,
        job_values=job_values(_from_request, "bound.job_id", "statement_timestamp()", cipher_salt=cipher_salt),
        notify_one=_NOTIFY_ONE.format(channel="p_channel"),
    )
    return _CREATE_ENQUEUE_ONE_FUNCTION.replace("{bind_one}", bind_one)


CREATE_ENQUEUE_ONE_FUNCTION = create_enqueue_one_function()
DROP_ENQUEUE_ONE_FUNCTION = (
    f"DROP FUNCTION IF EXISTS {ENQUEUE_ONE_FUNCTION}({', '.join(kind for _, kind in _FUNCTION_PARAMS)})"
)
ENQUEUE_ONE = "SELECT * FROM {}({})".format(
    ENQUEUE_ONE_FUNCTION, ", ".join(f"%({name[2:]})s::{kind}" for name, kind in _FUNCTION_PARAMS)
)
ENQUEUE_MANY = f"WITH {_MANY_REQUESTS_CTE},{_BIND}{_jobs_ctes(_ONLY_UNKEYED_OR_BOUND)}{_ACCEPTED}{_EXISTING}"


# take_over: rebind a key that owns nothing any more (see FREE) to a new job, compare-and-swap
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
      AND {FREE.format(now="requests.now")}
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
        breaker_key = requests.breaker_key, rate_limit = requests.rate_limit,
        rate_partition = requests.rate_partition, partition_key = requests.partition_key,
        cipher_salt = requests.cipher_salt,
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
    columns=BINDING_COLUMNS.format(
        free=FREE.format(now="statement_timestamp()"), state=JOB_STATE.format(now="statement_timestamp()")
    )
)


@dataclass(slots=True)
class ExistingBinding:
    """A binding found in the way of a request (slotted, not frozen: one is built per replay)."""

    ordinal: int
    job_id: int
    mode: str
    request_digest: bytes
    # The stored field digests, as the connection returned them: JSON text is decoded only when a
    # conflict names the differing fields (a replay never needs them).
    stored_field_digests: dict[str, str] | str
    free: bool  # it owns nothing any more: the next request takes the key over
    job_state: str  # 'open', 'due' or 'started' (see JOB_STATE)

    @property
    def field_digests(self) -> dict[str, str]:
        digests = self.stored_field_digests
        return json.loads(digests) if isinstance(digests, str) else digests


@dataclass
class EnqueueRows:
    """What ENQUEUE did: accepted ordinals with their job ids, and the bindings it saw."""

    accepted: dict[int, int]
    existing: dict[int, ExistingBinding]


def enqueue_rows(alias: str, rows: Sequence[tuple[int, PreparedJob]], channel: str) -> EnqueueRows:
    """Run ENQUEUE for ``(ordinal, request)`` pairs."""
    result = EnqueueRows(accepted={}, existing={})
    keyed = any(request.binding is not None for _, request in rows)
    if len(rows) == 1 and keyed:
        statement, params = ENQUEUE_ONE, function_params(*rows[0], channel)
    elif len(rows) == 1:
        statement, params = ENQUEUE_ONE_UNKEYED, one_request_params(rows[0], channel)
    else:
        statement, params = ENQUEUE_MANY if keyed else ENQUEUE_MANY_UNKEYED, request_params(rows, channel, keyed)
    for row in execute(alias, statement, params):
        ordinal, job_id, accepted = row[0], row[1], row[2]
        if accepted:
            result.accepted[ordinal] = job_id
        else:
            result.existing[ordinal] = _existing(ordinal, (row[1], *row[3:]))
    return result


def take_over(alias: str, ordinal: int, request: PreparedJob, seen_job_id: int, channel: str) -> int | None:
    """Run TAKE_OVER for one request; return the new job id, or None if the key is no longer free
    or no longer names ``seen_job_id``."""
    params = {**one_request_params((ordinal, request), channel), "seen_job_id": seen_job_id}
    rows = execute(alias, TAKE_OVER, params)
    return rows[0][1] if rows else None


def replace_debounced(alias: str, ordinal: int, request: PreparedJob, seen_job_id: int) -> bool:
    """Run REPLACE_DEBOUNCED; return whether the pending job took the request's definition."""
    binding = request.binding
    assert binding is not None and binding.window is not None
    params = {
        **one_request_params((ordinal, request), ""),
        "seen_job_id": seen_job_id,
        "reset": binding.reset,
        "window": binding.window,
    }
    return bool(execute(alias, REPLACE_DEBOUNCED, params))


def install_functions(alias: str, *, cipher_salt: bool = True) -> None:
    """Create (or replace with this version's body) the functions enqueue calls, on ``alias``.

    Migration 0011 creates them; every ``migrate`` replaces them with the installed code's body
    (``post_migrate``), so a release that changes a body needs no migration of its own. Without
    ``cipher_salt`` (migration 0025 not applied) the body leaves that column alone.
    """
    with connections[alias].cursor() as cursor:
        cursor.execute(create_enqueue_one_function(cipher_salt=cipher_salt))


def find_bindings(alias: str, rows: Sequence[tuple[int, PreparedJob]]) -> dict[int, ExistingBinding]:
    """Run FIND_BINDINGS for keyed ``(ordinal, request)`` pairs."""
    bindings = [(ordinal, request.binding) for ordinal, request in rows if request.binding is not None]
    params = {
        "ordinal": [ordinal for ordinal, _ in bindings],
        "scope": [binding.scope for _, binding in bindings],
        "key_hash": [binding.key_hash for _, binding in bindings],
    }
    return {row[0]: _existing(row[0], row[1:]) for row in execute(alias, FIND_BINDINGS, params)}


def _existing(ordinal: int, values: Sequence[Any]) -> ExistingBinding:
    job_id, mode, digest, field_digests, free, job_state = values
    return ExistingBinding(ordinal, job_id, mode, bytes(digest), field_digests, bool(free), job_state)
