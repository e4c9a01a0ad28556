"""The effect ledger: claim an operation, read or take over its entry, store its result, prune."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django_workhorse.sql.connection import execute, run

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


# release_effects: delete the given ledger entries (an operator's release), so their keys run again.
# An entry whose claim has not committed is invisible here and stays; RETURNING names what went.
RELEASE_EFFECTS = """
DELETE FROM workhorse_effect WHERE id = ANY(%(ids)s::bigint[])
RETURNING id
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
    rows = execute(alias, CLAIM_EFFECT, params)
    return EffectEntry(*rows[0]) if rows else None


def find_effect(alias: str, *, scope: str, key_hash: bytes) -> EffectEntry | None:
    """Run FIND_EFFECT; return the entry, or None if there is none."""
    rows = execute(alias, FIND_EFFECT, {"scope": scope, "key_hash": key_hash})
    return EffectEntry(*rows[0]) if rows else None


def take_over_effect(alias: str, *, seen_id: int, key_preview: str, retention: timedelta) -> bool:
    """Run TAKE_OVER_EFFECT; return whether this transaction now holds the operation."""
    params = {"seen_id": seen_id, "key_preview": key_preview, "retention": retention}
    return bool(execute(alias, TAKE_OVER_EFFECT, params))


def store_effect(alias: str, *, entry_id: int, result_json: str, retention: timedelta) -> int:
    """Run STORE_EFFECT; return how many entries were updated (1)."""
    return run(alias, STORE_EFFECT, {"id": entry_id, "result": result_json, "retention": retention})


def prune_expired_effects(alias: str, *, limit: int) -> int:
    """Run PRUNE_EXPIRED_EFFECTS once; return how many ledger entries were deleted."""
    return run(alias, PRUNE_EXPIRED_EFFECTS, {"limit": limit})


def release_effects(alias: str, ids: list[int]) -> list[int]:
    """Run RELEASE_EFFECTS; return the ids of the entries deleted."""
    return sorted(row[0] for row in execute(alias, RELEASE_EFFECTS, {"ids": ids}))
