"""HTTP idempotency records on the effect ledger's table: claim a key for a request, store its response.

A record is a ``workhorse_effect`` row of kind ``http``; ``workhorse_effect_scope_key_hash_uniq``
arbitrates it as it does ``once()`` effects. A request holds its key's transaction-level advisory
lock while its view runs and writes its record, with the response, when the view is done: a second
request with the key learns that the first is still running (a lock it cannot take) instead of
waiting on the unique index until the first commits, and a record is written once, not claimed
and then updated. The claim travels with the transaction's BEGIN and the record with its COMMIT,
so a keyed request makes as many round trips as the view alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, connections

from django_workhorse.models import EFFECT_KEY_UNIQ
from django_workhorse.sql.connection import constraint_name, decode_json, execute, execute_first, execute_last

KIND = "http"  # workhorse_effect.kind of these records (EffectKind.HTTP)
CLAIM_FUNCTION = "workhorse_http_claim"
_RECORD_COLUMNS = (
    "held boolean, id bigint, kind text, request_digest bytea, field_digests text, status_code smallint, "
    "response_headers text, response_body bytea, live boolean"
)

# workhorse_http_claim: try the key's advisory lock (transaction-scoped, so it means the same through
# a transaction pooler); holding it, read the key's record. The read is a statement of its own in a
# VOLATILE function, so its snapshot is taken after the lock: it sees the record of every request
# that held the lock before (a request writes its record before it lets the lock go, at commit).
# One row: held = false (another request with the key is running), or held and the record's
# columns (all NULL when there is none). workhorse_effect_scope_key_hash_uniq finds the record.
CREATE_CLAIM_FUNCTION = f"""
CREATE OR REPLACE FUNCTION {CLAIM_FUNCTION}(p_lock_id bigint, p_scope text, p_key_hash bytea)
RETURNS TABLE ({_RECORD_COLUMNS})
LANGUAGE plpgsql VOLATILE AS $function$
#variable_conflict use_column
BEGIN
    IF NOT pg_try_advisory_xact_lock(p_lock_id) THEN
        RETURN QUERY SELECT false, NULL::bigint, NULL::text, NULL::bytea, NULL::text, NULL::smallint, NULL::text,
                            NULL::bytea, NULL::boolean;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT true, effect.id, effect.kind::text, effect.request_digest, effect.field_digests::text,
           effect.status_code::smallint, effect.response_headers::text, effect.response_body,
           effect.expires_at > statement_timestamp()
    FROM workhorse_effect AS effect
    WHERE effect.scope = p_scope AND effect.key_hash = p_key_hash;
    IF NOT FOUND THEN
        RETURN QUERY SELECT true, NULL::bigint, NULL::text, NULL::bytea, NULL::text, NULL::smallint, NULL::text,
                            NULL::bytea, NULL::boolean;
    END IF;
END
$function$
"""
DROP_CLAIM_FUNCTION = f"DROP FUNCTION IF EXISTS {CLAIM_FUNCTION}(bigint, text, bytea)"
CLAIM_HTTP_RECORD = f"SELECT * FROM {CLAIM_FUNCTION}(%(lock_id)s::bigint, %(scope)s::text, %(key_hash)s::bytea)"


# insert_http_record: write the record of a request whose view ran, with its response, in the view's
# transaction and under the key's advisory lock (so no other request inserts it meanwhile), when the
# claim saw no record. The retention window starts now; created_at is when the transaction began.
# workhorse_effect_scope_key_hash_uniq refuses it only when this transaction wrote the record
# already: an @idempotent view nested in another with the same key.
INSERT_HTTP_RECORD = f"""
INSERT INTO workhorse_effect (
    kind, scope, owner, key_hash, key_preview, request_digest, field_digests, status_code, response_headers,
    response_body, created_at, completed_at, expires_at)
VALUES ('{KIND}', %(scope)s::text, %(owner)s::text, %(key_hash)s::bytea, %(key_preview)s::text,
        %(request_digest)s::bytea, %(field_digests)s::jsonb, %(status_code)s::smallint, %(headers)s::jsonb,
        %(body)s::bytea, transaction_timestamp(), statement_timestamp(), statement_timestamp() + %(ttl)s::interval)
RETURNING id
"""

# take_over_http_record: the same, when the claim saw the key's record past its retention (not yet
# pruned): the record is taken over in place, by its primary key. No row comes back when it is live
# again: this transaction's own, from an @idempotent view nested in another with the same key.
TAKE_OVER_HTTP_RECORD = f"""
UPDATE workhorse_effect AS effect
SET kind = '{KIND}', owner = %(owner)s::text, key_preview = %(key_preview)s::text, result = NULL,
    request_digest = %(request_digest)s::bytea, field_digests = %(field_digests)s::jsonb,
    status_code = %(status_code)s::smallint, response_headers = %(headers)s::jsonb, response_body = %(body)s::bytea,
    created_at = transaction_timestamp(), completed_at = statement_timestamp(),
    expires_at = statement_timestamp() + %(ttl)s::interval
WHERE effect.id = %(id)s AND effect.expires_at <= statement_timestamp()
RETURNING effect.id
"""


@dataclass(frozen=True)
class HttpRecord:
    """What the claim saw: ``held`` (this transaction holds the key) and the key's record, if any."""

    held: bool
    id: int | None
    kind: str | None
    request_digest: bytes | None
    field_digests: dict[str, str] | None
    status_code: int | None
    headers: list[list[str]] | dict[str, str] | None  # a dict: sealed (http.sealing)
    body: bytes | None
    live: bool  # within its retention window


@dataclass(frozen=True)
class RecordKey:
    """Who a record answers: its scope, owner and key (as its hash and preview)."""

    scope: str
    owner: str
    key_hash: bytes
    key_preview: str

    @property
    def lock_id(self) -> int:
        """The bigint advisory lock of this key: its hash's first eight bytes."""
        return int.from_bytes(self.key_hash[:8], "big", signed=True)


def install_functions(alias: str) -> None:
    """Create (or replace with this version's body) the claim function, on ``alias`` (migration 0012
    creates it; every ``migrate`` replaces it, see ``apps.py``)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(CREATE_CLAIM_FUNCTION)


def claim_http_record(alias: str, key: RecordKey) -> HttpRecord:
    """Run CLAIM_HTTP_RECORD: take the key's lock if it is free, and read its record. As the first
    statement of a transaction it travels with the transaction's BEGIN (see ``execute_first``)."""
    params = {"lock_id": key.lock_id, "scope": key.scope, "key_hash": key.key_hash}
    row = execute_first(alias, CLAIM_HTTP_RECORD, params)[0]
    held, entry_id, kind, digest, digests, status, headers, body, live = row
    return HttpRecord(
        held=held,
        id=entry_id,
        kind=kind,
        request_digest=None if digest is None else bytes(digest),
        field_digests=None if digests is None else decode_json(digests),
        status_code=status,
        headers=None if headers is None else decode_json(headers),
        body=None if body is None else bytes(body),
        live=bool(live),
    )


def store_http_record(
    alias: str,
    key: RecordKey,
    *,
    expired_id: int | None,
    request_digest: bytes,
    field_digests_json: str,
    status_code: int,
    headers_json: str,
    body: bytes,
    ttl: timedelta,
) -> bool:
    """Write the record: INSERT_HTTP_RECORD, the transaction's last statement, which commits the
    outermost atomic() block with it (see ``execute_last``); or, over the expired record
    ``expired_id``, TAKE_OVER_HTTP_RECORD. Return False when this transaction wrote the key's
    record already; then nothing is committed."""
    params = {
        "scope": key.scope,
        "owner": key.owner,
        "key_hash": key.key_hash,
        "key_preview": key.key_preview,
        "request_digest": request_digest,
        "field_digests": field_digests_json,
        "status_code": status_code,
        "headers": headers_json,
        "body": body,
        "ttl": ttl,
    }
    if expired_id is not None:
        return bool(execute(alias, TAKE_OVER_HTTP_RECORD, {**params, "id": expired_id}))
    try:
        execute_last(alias, INSERT_HTTP_RECORD, params)
    except IntegrityError as exc:
        if constraint_name(exc) != EFFECT_KEY_UNIQ:
            raise
        return False
    return True
