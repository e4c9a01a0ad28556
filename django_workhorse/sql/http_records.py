"""HTTP idempotency records on the effect ledger's table: claim a key for a request, store its response.

A record is a ``workhorse_effect`` row of kind ``http``; ``workhorse_effect_scope_key_hash_uniq``
arbitrates it as it does ``once()`` effects. A request holds its key's transaction-level advisory
lock while its view runs, so a second request with the key learns that the first is still running
(a lock it cannot take) instead of waiting on the unique index until the first commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django_workhorse.sql.connection import decode_json, execute, run

KIND = "http"  # workhorse_effect.kind of these records (EffectKind.HTTP)
_ENTRY_COLUMNS = """effect.id, effect.kind, effect.request_digest, effect.field_digests::text, effect.status_code,
       effect.response_headers::text, effect.response_body, effect.completed_at IS NOT NULL,
       effect.expires_at > statement_timestamp()"""

# claim_http_record: in one statement, try the key's advisory lock (transaction-scoped, so it means
# the same through a transaction pooler) and, holding it, insert the record or read the one there.
# 'busy': another transaction holds the lock, its request is still running. 'claimed': this
# transaction now holds a new record. 'found': the record another request committed (live or
# expired). No row: the record was committed after this statement's snapshot and before it took
# the lock; read again. ON CONFLICT never waits here: whoever inserts holds the lock until commit.
CLAIM_HTTP_RECORD = f"""
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(%(lock_id)s::bigint) AS held
), claimed AS (
    INSERT INTO workhorse_effect (
        kind, scope, owner, key_hash, key_preview, request_digest, field_digests, created_at, expires_at)
    SELECT 'http', %(scope)s::text, %(owner)s::text, %(key_hash)s::bytea, %(key_preview)s::text,
           %(request_digest)s::bytea, %(field_digests)s::jsonb, statement_timestamp(),
           statement_timestamp() + %(ttl)s::interval
    FROM lock WHERE lock.held
    ON CONFLICT (scope, key_hash) DO NOTHING
    RETURNING id
)
SELECT 'claimed', id, NULL::text, NULL::bytea, NULL::text, NULL::smallint, NULL::text, NULL::bytea, false, true
FROM claimed
UNION ALL
SELECT 'busy', NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, true FROM lock WHERE NOT lock.held
UNION ALL
SELECT 'found', {_ENTRY_COLUMNS}
FROM workhorse_effect AS effect, lock
WHERE lock.held AND effect.scope = %(scope)s::text AND effect.key_hash = %(key_hash)s::bytea
  AND NOT EXISTS (SELECT 1 FROM claimed)
"""


# take_over_http_record: reuse a record past its retention for a new run of the view, under the
# key's advisory lock; compare-and-swap on the entry seen expired (pruned meanwhile: no row).
TAKE_OVER_HTTP_RECORD = """
UPDATE workhorse_effect
SET kind = 'http', owner = %(owner)s::text, key_preview = %(key_preview)s::text,
    request_digest = %(request_digest)s::bytea, field_digests = %(field_digests)s::jsonb, result = NULL,
    status_code = NULL, response_headers = NULL, response_body = NULL, created_at = statement_timestamp(),
    completed_at = NULL, expires_at = statement_timestamp() + %(ttl)s::interval
WHERE id = %(seen_id)s::bigint AND expires_at <= statement_timestamp()
RETURNING id
"""


# store_http_response: record the view's response in the transaction that claimed the key and ran
# the view; the retention window starts now.
STORE_HTTP_RESPONSE = """
UPDATE workhorse_effect
SET status_code = %(status_code)s::smallint, response_headers = %(headers)s::jsonb,
    response_body = %(body)s::bytea, completed_at = statement_timestamp(),
    expires_at = statement_timestamp() + %(ttl)s::interval
WHERE id = %(id)s::bigint
"""


@dataclass(frozen=True)
class HttpRecord:
    """A record as one statement saw it: ``claimed`` by this transaction, ``busy`` elsewhere, or ``found``."""

    state: str
    id: int | None
    kind: str | None
    request_digest: bytes | None
    field_digests: dict[str, str] | None
    status_code: int | None
    headers: list[list[str]] | None
    body: bytes | None
    done: bool  # its response is stored
    live: bool  # within its retention window


@dataclass(frozen=True)
class RecordClaim:
    """What ``claim_http_record`` inserts for a request: its key, owner and fingerprint."""

    scope: str
    owner: str
    key_hash: bytes
    key_preview: str
    request_digest: bytes
    field_digests_json: str
    ttl: timedelta

    @property
    def lock_id(self) -> int:
        """The bigint advisory lock of this key: its hash's first eight bytes."""
        return int.from_bytes(self.key_hash[:8], "big", signed=True)

    def params(self) -> dict[str, Any]:
        return {
            "lock_id": self.lock_id,
            "scope": self.scope,
            "owner": self.owner,
            "key_hash": self.key_hash,
            "key_preview": self.key_preview,
            "request_digest": self.request_digest,
            "field_digests": self.field_digests_json,
            "ttl": self.ttl,
        }


def claim_http_record(alias: str, claim: RecordClaim) -> HttpRecord | None:
    """Run CLAIM_HTTP_RECORD; return what it saw, or None if the record is not visible yet."""
    rows = execute(alias, CLAIM_HTTP_RECORD, claim.params())
    if not rows:
        return None
    state, entry_id, kind, digest, digests, status, headers, body, done, live = rows[0]
    return HttpRecord(
        state=state,
        id=entry_id,
        kind=kind,
        request_digest=None if digest is None else bytes(digest),
        field_digests=None if digests is None else decode_json(digests),
        status_code=status,
        headers=None if headers is None else decode_json(headers),
        body=None if body is None else bytes(body),
        done=done,
        live=live,
    )


def take_over_http_record(alias: str, claim: RecordClaim, *, seen_id: int) -> bool:
    """Run TAKE_OVER_HTTP_RECORD; return whether this transaction now holds the record."""
    params = {**claim.params(), "seen_id": seen_id}
    del params["lock_id"], params["scope"], params["key_hash"]
    return bool(execute(alias, TAKE_OVER_HTTP_RECORD, params))


def store_http_response(
    alias: str, *, record_id: int, status_code: int, headers_json: str, body: bytes, ttl: timedelta
) -> int:
    """Run STORE_HTTP_RESPONSE; return how many records were updated (1)."""
    params = {"id": record_id, "status_code": status_code, "headers": headers_json, "body": body, "ttl": ttl}
    return run(alias, STORE_HTTP_RESPONSE, params)
