"""Key rotation (decision 0024): find stored envelopes by the key id in their clear header, lock
chunks of them, write them back re-encrypted, and count them by key id.

Every sealed value is text that starts ``wh1:<key id>:`` somewhere in its row: a ``jsonb`` string
(``col #>> '{}'``), the field of a sealed object (``{"workhorse:sealed": "<envelope>"}``), an
event's ``details`` field, ``last_error`` as it is, or ``response_body``'s ASCII bytes. Each table
is described once (``TABLES``): its slots, one per place a value may be sealed, each with the
expression that reads it as text and the one that writes new text back. The statements are built
from these constants; every value is a bound parameter.

No index serves these scans: the walk goes by primary key (``id > %(after)s ORDER BY id``), and the
census and the check read each table once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_workhorse.encryption.envelope import FORMAT
from django_workhorse.encryption.sealed_json import SEALED_FIELD
from django_workhorse.sql.connection import execute

ENVELOPE_PATTERN = f"{FORMAT}:%"


@dataclass(frozen=True)
class Slot:
    """One place a row may hold an envelope: its name, how to read it (text) and write it (from ``change.new``)."""

    name: str
    read: str
    write: str


@dataclass(frozen=True)
class Table:
    """A table holding envelopes: its name, what its rows join and must match, the columns that
    build each value's associated data, and its slots."""

    name: str
    joins: str
    where: str
    context: str
    slots: tuple[Slot, ...]


def _sealed_field(column: str) -> str:
    """A sealed object's envelope (``{"workhorse:sealed": ...}`` and nothing else); NULL otherwise.

    Nested CASEs: ``jsonb - text`` fails on a scalar, and only CASE fixes the order of evaluation.
    """
    return (
        f"CASE WHEN jsonb_typeof(t.{column}) = 'object' THEN CASE WHEN t.{column} - '{SEALED_FIELD}' = '{{}}'::jsonb "
        f"THEN t.{column} ->> '{SEALED_FIELD}' END END"
    )


def _json_string(column: str) -> Slot:
    return Slot(column, f"(t.{column} #>> '{{}}')", f"{column} = to_jsonb(change.new)")


def _detail(field: str) -> Slot:
    return Slot(
        f"details.{field}",
        f"(t.details ->> '{field}')",
        f"details = jsonb_set(details, '{{{field}}}', to_jsonb(change.new))",
    )


_SEALED_OBJECT = f"jsonb_build_object('{SEALED_FIELD}', change.new)"
# A sealed record's body is an envelope: ASCII, so its 'escape' encoding is the envelope's text.
_BODY = f"CASE WHEN ({_sealed_field('response_headers')}) IS NOT NULL THEN encode(t.response_body, 'escape') END"
_ENCRYPTED_JOB = "JOIN workhorse_job AS job ON job.id = t.job_id"

JOBS = Table(
    "workhorse_job",
    "",
    "t.cipher_salt IS NOT NULL",
    "t.cipher_salt",
    (_json_string("payload"), _json_string("result"), Slot("last_error", "t.last_error", "last_error = change.new")),
)
EVENTS = Table(
    "workhorse_job_event",
    _ENCRYPTED_JOB,
    "job.cipher_salt IS NOT NULL",
    "job.cipher_salt",
    (_detail("error"), _detail("reason")),
)
CHECKPOINTS = Table(
    "workhorse_checkpoint",
    _ENCRYPTED_JOB,
    "job.cipher_salt IS NOT NULL",
    "job.cipher_salt, t.name",
    (_json_string("value"),),
)
EFFECTS = Table(
    "workhorse_effect",
    "",
    "TRUE",
    "t.kind, t.scope, t.owner, t.key_hash, t.key_preview",
    (
        Slot("result", _sealed_field("result"), f"result = {_SEALED_OBJECT}"),
        Slot("response_headers", _sealed_field("response_headers"), f"response_headers = {_SEALED_OBJECT}"),
        Slot("response_body", _BODY, "response_body = convert_to(change.new, 'UTF8')"),
    ),
)
TABLES = (JOBS, EVENTS, CHECKPOINTS, EFFECTS)


def _stale(read: str) -> str:
    """Whether a slot holds an envelope under another key than the active one (``%(current)s``:
    ``wh1:<active id>:%``, its ``_`` escaped)."""
    return f"({read} LIKE '{FORMAT}:%%' AND {read} NOT LIKE %(current)s)"


# lock_stale_chunk: the next chunk (by id, after the cursor) of rows holding a value under another
# key, locked; rows another transaction holds are skipped (a later pass revisits them), and so are
# the rows the caller could not open. No index: the walk is by primary key.
def lock_statement(table: Table) -> str:
    """The statement that locks the next chunk of ``table``'s rows with a value under another key."""
    reads = ", ".join(slot.read for slot in table.slots)
    stale = " OR ".join(_stale(slot.read) for slot in table.slots)
    return f"""
SELECT t.id, {table.context}, {reads}
FROM {table.name} AS t {table.joins}
WHERE t.id > %(after)s AND {table.where} AND NOT (t.id = ANY(%(skip)s::bigint[])) AND ({stale})
ORDER BY t.id
LIMIT %(batch)s
FOR UPDATE OF t SKIP LOCKED
"""


# update_slot: write re-encrypted values back, each guarded by the value it replaces (a row rewritten
# since it was read keeps the newer value); rows found by primary key.
def update_statement(table: Table, slot: Slot) -> str:
    """The guarded update of one slot of ``table``, for arrays of ids, old and new envelopes."""
    return f"""
UPDATE {table.name} AS t SET {slot.write}
FROM unnest(%(ids)s::bigint[], %(old)s::text[], %(new)s::text[]) AS change(id, old, new)
WHERE t.id = change.id AND {slot.read} = change.old
RETURNING t.id
"""


# census: every envelope of a table, counted by slot and key id (one scan; the values of a slot are
# listed with LATERAL VALUES). Rows in %(skip)s are left out; %(stale_only)s keeps only those under
# another key than %(active)s.
def census_statement(table: Table) -> str:
    """The statement counting ``table``'s envelopes by slot and key id."""
    values = ", ".join(f"('{slot.name}', {slot.read})" for slot in table.slots)
    return f"""
SELECT found.slot, split_part(found.value, ':', 2) AS key_id, count(*)
FROM {table.name} AS t {table.joins}
CROSS JOIN LATERAL (VALUES {values}) AS found(slot, value)
WHERE {table.where} AND found.value LIKE '{FORMAT}:%%' AND NOT (t.id = ANY(%(skip)s::bigint[]))
  AND (NOT %(stale_only)s OR split_part(found.value, ':', 2) <> %(active)s)
GROUP BY 1, 2
"""


# unknown_key_ids: up to %(cap)s envelopes under a key id not among %(ids)s, counted by key id (a
# LIMIT in the subquery stops the scan at the cap; with none found it reads the table once).
def unknown_statement(table: Table) -> str:
    """The statement finding ``table``'s envelopes under key ids that are not configured, up to a cap."""
    values = ", ".join(f"({slot.read})" for slot in table.slots)
    return f"""
SELECT found.key_id, count(*) FROM (
    SELECT split_part(slot.value, ':', 2) AS key_id
    FROM {table.name} AS t {table.joins}
    CROSS JOIN LATERAL (VALUES {values}) AS slot(value)
    WHERE {table.where} AND slot.value LIKE '{FORMAT}:%%'
      AND NOT (split_part(slot.value, ':', 2) = ANY(%(ids)s::text[]))
    LIMIT %(cap)s
) AS found
GROUP BY 1
ORDER BY 1
"""


def like_prefix(key_id: str) -> str:
    """The ``LIKE`` pattern of the envelopes under ``key_id``, its ``_``, ``%`` and ``\\`` escaped."""
    escaped = key_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"{FORMAT}:{escaped}:%"


def lock_stale_chunk(
    alias: str, table: Table, *, active: str, after: int, batch: int, skip: Sequence[int]
) -> list[tuple[Any, ...]]:
    """Lock and return the next ``batch`` rows of ``table`` after id ``after`` holding a value under
    another key than ``active`` (rows held elsewhere, and those in ``skip``, left out): each row is
    its id, its associated data's columns, then its slots' text."""
    params = {"current": like_prefix(active), "after": after, "batch": batch, "skip": list(skip)}
    return execute(alias, lock_statement(table), params)


def update_slot(alias: str, table: Table, slot: Slot, changes: Sequence[tuple[int, str, str]]) -> int:
    """Write ``(id, old, new)`` envelopes into ``slot`` of ``table``, each only where the row still
    holds ``old``; return how many were written."""
    if not changes:
        return 0
    ids, old, new = (list(column) for column in zip(*changes, strict=True))
    return len(execute(alias, update_statement(table, slot), {"ids": ids, "old": old, "new": new}))


def census(
    alias: str, table: Table, *, active: str = "", stale_only: bool = False, skip: Sequence[int] = ()
) -> dict[tuple[str, str], int]:
    """Count ``table``'s envelopes by (slot, key id); with ``stale_only``, only those under another
    key than ``active``; rows in ``skip`` left out."""
    params = {"active": active, "stale_only": stale_only, "skip": list(skip)}
    return {(slot, key_id): count for slot, key_id, count in execute(alias, census_statement(table), params)}


def unknown_key_ids(alias: str, table: Table, *, configured: Sequence[str], cap: int) -> dict[str, int]:
    """Return, for up to ``cap`` of ``table``'s envelopes under a key id not in ``configured``, the
    count by key id."""
    rows = execute(alias, unknown_statement(table), {"ids": list(configured), "cap": cap})
    return {str(key_id): int(count) for key_id, count in rows}
