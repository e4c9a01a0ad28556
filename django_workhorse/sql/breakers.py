"""Circuit breakers' state: record attempts' verdicts, open a breaker until an instant, reset it.

The claim (``sql.claims.CLAIM``) reads these rows and takes canary slots; the statements here
write the rest. Each locks its breaker rows first (in key order), then the held jobs it gives back
with SKIP LOCKED: a claim locks job rows before the breaker row, so waiting here for a job row
could deadlock with it. A held job a claim has locked is being claimed or held again anyway.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_workhorse.conf import MAX_BREAKER_TRANSITIONS
from django_workhorse.sql.connection import execute


def appended_transition(transitions: str, from_state: str, to_state: str, reason: str) -> str:
    """The SQL of ``transitions`` (a jsonb list) with one {from, to, at, reason} entry appended,
    keeping the latest MAX_BREAKER_TRANSITIONS."""
    appended = (
        f"({transitions} || jsonb_build_array(jsonb_build_object('from', {from_state}, 'to', {to_state}, "
        f"'at', clock_timestamp(), 'reason', {reason})))"
    )
    return (
        f"(SELECT coalesce(jsonb_agg(entry ORDER BY n), '[]'::jsonb) FROM jsonb_array_elements({appended}) "
        f"WITH ORDINALITY AS kept(entry, n) WHERE n > jsonb_array_length({appended}) - {MAX_BREAKER_TRANSITIONS})"
    )


# give_back: the held jobs of the breakers in ``{keys}`` back to the queue at once, through the
# partial index workhorse_job_breaker_held_idx (queued and held only), locked in id order, skipping
# those a claim holds.
_GIVE_BACK = """
due AS MATERIALIZED (
    SELECT id FROM workhorse_job
    WHERE status = 'queued' AND held_since IS NOT NULL AND breaker_key IN ({keys})
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
),
released AS (
    UPDATE workhorse_job AS job SET run_at = clock_timestamp(), held_since = NULL
    FROM due WHERE job.id = due.id
    RETURNING job.breaker_key
)"""

# record_verdicts: apply one batch of attempts' verdicts, one entry per key ({key, failures,
# succeeded, policy}). A failure while closed appends now (epoch seconds) to recent_failures, which
# keeps the last policy.failures entries: when it holds that many, all within policy.within, the
# breaker opens for policy.cooldown. A failure while half-open opens it again for twice its cooldown
# (at most policy.max_cooldown). A success while open or half-open closes it and gives its held
# jobs back. A key with only successes and no row writes nothing. Returns one row per transition.
_COOLDOWN = "make_interval(secs => (policy->>'cooldown')::float8)"
RECORD_VERDICTS = f"""
WITH batch AS (
    SELECT b->>'key' AS key, (b->>'failures')::int AS failures, (b->>'succeeded')::boolean AS succeeded,
           b->'policy' AS policy, clock_timestamp() AS now
    FROM jsonb_array_elements(%(batch)s::jsonb) AS b
),
locked AS MATERIALIZED (
    SELECT breaker.* FROM workhorse_breaker AS breaker JOIN batch USING (key)
    ORDER BY breaker.key
    FOR NO KEY UPDATE OF breaker
),
seen AS (
    SELECT batch.*, coalesce(locked.state, 'closed') AS state, coalesce(locked.recent_failures, '[]') AS recent,
           coalesce(locked.transitions, '[]') AS transitions, locked.cooldown, locked.opened_at, locked.open_until,
           locked.probes_admitted
    FROM batch LEFT JOIN locked USING (key)
),
windowed AS (
    SELECT seen.*, CASE WHEN state = 'closed' THEN kept.recent ELSE seen.recent END AS fails
    FROM seen, LATERAL (
        SELECT coalesce(jsonb_agg(entry.epoch ORDER BY entry.n), '[]'::jsonb) AS recent
        FROM (SELECT epoch, n, count(*) OVER () AS total
              FROM jsonb_array_elements(seen.recent || to_jsonb(array_fill(
                  extract(epoch FROM seen.now)::float8, ARRAY[seen.failures]))) WITH ORDINALITY AS e(epoch, n)
             ) AS entry
        WHERE entry.n > entry.total - (seen.policy->>'failures')::int
    ) AS kept
),
decided AS (
    SELECT windowed.*,
           CASE WHEN state <> 'closed' AND succeeded THEN 'closed'
                WHEN state = 'half_open' AND failures > 0 THEN 'open'
                WHEN state = 'closed' AND failures > 0
                     AND jsonb_array_length(fails) >= (policy->>'failures')::int
                     AND extract(epoch FROM now) - (fails->>0)::float8 <= (policy->>'within')::float8 THEN 'open'
                ELSE state END AS next_state,
           CASE WHEN state = 'half_open' AND succeeded THEN 'a canary succeeded'
                WHEN state = 'open' AND succeeded THEN 'an attempt succeeded'
                WHEN state = 'half_open' THEN 'a canary failed'
                ELSE format('%%s failures within %%s s', policy->>'failures', (policy->>'within')::float8) END AS reason,
           CASE WHEN state = 'half_open'
                THEN least(coalesce(cooldown, {_COOLDOWN}) * 2, make_interval(secs => (policy->>'max_cooldown')::float8))
                ELSE {_COOLDOWN} END AS next_cooldown
    FROM windowed
),
written AS (
    INSERT INTO workhorse_breaker AS breaker (
        key, state, recent_failures, opened_at, open_until, cooldown, probes, probes_admitted, policy,
        transitions, changed_at)
    SELECT key, next_state,
           CASE WHEN next_state = 'closed' AND state <> 'closed' THEN '[]'::jsonb ELSE fails END,
           CASE WHEN next_state = 'open' AND state <> 'open' THEN now ELSE opened_at END,
           CASE WHEN next_state = 'open' AND state <> 'open' THEN now + next_cooldown
                WHEN next_state = 'closed' THEN NULL ELSE open_until END,
           CASE WHEN next_state = 'open' AND state <> 'open' THEN next_cooldown ELSE cooldown END,
           (policy->>'probes')::smallint, CASE WHEN next_state = state THEN coalesce(probes_admitted, 0) ELSE 0 END,
           policy,
           CASE WHEN next_state = state THEN transitions
                ELSE {appended_transition("transitions", "state", "next_state", "reason")} END,
           now
    FROM decided
    WHERE (state = 'closed' AND failures > 0) OR next_state <> state
    ON CONFLICT (key) DO UPDATE
    SET state = EXCLUDED.state, recent_failures = EXCLUDED.recent_failures, opened_at = EXCLUDED.opened_at,
        open_until = EXCLUDED.open_until, cooldown = EXCLUDED.cooldown, probes = EXCLUDED.probes,
        probes_admitted = EXCLUDED.probes_admitted, policy = EXCLUDED.policy, transitions = EXCLUDED.transitions,
        changed_at = EXCLUDED.changed_at
    RETURNING breaker.key
),
{_GIVE_BACK.format(keys="SELECT key FROM decided WHERE next_state = 'closed' AND state <> 'closed'")}
SELECT decided.key, decided.state, decided.next_state, decided.reason, decided.next_cooldown,
       (SELECT count(*) FROM released WHERE released.breaker_key = decided.key)
FROM decided
WHERE decided.next_state <> decided.state AND decided.key IN (SELECT key FROM written)
ORDER BY decided.key
"""


# open_breaker: open a breaker until %(until)s, whatever its state (a handler knows the provider's
# quota resets then); an open breaker that already holds until later keeps the later instant.
# Upserts on the key (workhorse_breaker's primary key). Returns the state it was in.
OPEN_BREAKER = f"""
WITH before AS (SELECT state FROM workhorse_breaker WHERE key = %(key)s),
opened AS (
    INSERT INTO workhorse_breaker AS breaker (
        key, state, recent_failures, opened_at, open_until, cooldown, probes, probes_admitted, policy,
        transitions, changed_at)
    VALUES (%(key)s, 'open', '[]', clock_timestamp(), %(until)s, make_interval(secs => %(cooldown)s),
            %(probes)s, 0, %(policy)s::jsonb,
            {appended_transition("'[]'::jsonb", "'closed'", "'open'", "%(reason)s::text")}, clock_timestamp())
    ON CONFLICT (key) DO UPDATE
    SET state = 'open', opened_at = clock_timestamp(), probes_admitted = 0, changed_at = clock_timestamp(),
        open_until = CASE WHEN breaker.state = 'open' THEN greatest(breaker.open_until, EXCLUDED.open_until)
                          ELSE EXCLUDED.open_until END,
        cooldown = coalesce(breaker.cooldown, EXCLUDED.cooldown),
        transitions = CASE WHEN breaker.state = 'open' THEN breaker.transitions
                           ELSE {appended_transition("breaker.transitions", "breaker.state", "'open'", "%(reason)s::text")}
                      END
    RETURNING breaker.open_until
)
SELECT coalesce((SELECT state FROM before), 'closed'), (SELECT open_until FROM opened)
"""


# reset_breaker: close a breaker now (an operator's reset) and give its held jobs back, whether or
# not it has a row (jobs held by a row since deleted come back too). Returns the state it was in
# (NULL without a row) and how many jobs came back.
RESET_BREAKER = f"""
WITH reset AS (
    UPDATE workhorse_breaker AS breaker
    SET state = 'closed', recent_failures = '[]', open_until = NULL, probes_admitted = 0,
        changed_at = clock_timestamp(),
        transitions = {appended_transition("breaker.transitions", "breaker.state", "'closed'", "%(reason)s::text")}
    FROM (SELECT key, state FROM workhorse_breaker WHERE key = %(key)s FOR NO KEY UPDATE) AS before
    WHERE breaker.key = before.key
    RETURNING before.state
),
{_GIVE_BACK.format(keys="%(key)s")}
SELECT (SELECT state FROM reset), (SELECT count(*) FROM released)
"""


@dataclass(frozen=True)
class Transition:
    """A breaker's state change, as a statement here wrote it."""

    key: str
    from_state: str
    to_state: str
    reason: str
    released: int = 0  # held jobs given back (when it closed)
    cooldown_seconds: float | None = None


def record_verdicts(alias: str, batch: Sequence[dict[str, Any]]) -> list[Transition]:
    """Run RECORD_VERDICTS for entries ``{key, failures, succeeded, policy}``; return the transitions."""
    entries = sorted(batch, key=lambda entry: entry["key"])
    rows = execute(alias, RECORD_VERDICTS, {"batch": json.dumps(entries)})
    return [
        Transition(key, before, after, reason, int(released), cooldown.total_seconds() if cooldown else None)
        for key, before, after, reason, cooldown, released in rows
    ]


def open_breaker(alias: str, *, key: str, until: datetime, policy: dict[str, Any], reason: str) -> str:
    """Run OPEN_BREAKER; return the state the breaker was in."""
    params = {
        "key": key,
        "until": until,
        "cooldown": policy["cooldown"],
        "probes": policy["probes"],
        "policy": json.dumps(policy),
        "reason": reason,
    }
    return str(execute(alias, OPEN_BREAKER, params)[0][0])


def reset_breaker(alias: str, *, key: str, reason: str) -> tuple[str | None, int]:
    """Run RESET_BREAKER; return the state it was in (None without a row) and the jobs given back."""
    state, released = execute(alias, RESET_BREAKER, {"key": key, "reason": reason})[0]
    return state, int(released)
