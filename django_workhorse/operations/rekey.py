"""Key rotation (decision 0024): re-encrypt every stored value sealed under a key other than the active one.

Each table is walked in primary-key order, in chunks locked ``FOR UPDATE SKIP LOCKED`` (a row another
transaction holds is never waited for: a later pass revisits it), each chunk committed on its own.
A value is opened with the associated data it was sealed with and sealed again under the active key;
each update is guarded by the value read. The walk selects by key id, not by a saved position, so a
run that stops is resumed by running again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import router, transaction

from django_workhorse import sql
from django_workhorse.effects.ledger import result_associated_data
from django_workhorse.encryption import active_key_id
from django_workhorse.encryption.envelope import envelope_key_id, seal, unseal
from django_workhorse.encryption.jobs import CHECKPOINT_PREFIX, is_sealed_text
from django_workhorse.encryption.jobs import associated_data as job_associated_data
from django_workhorse.exceptions import DecryptionError
from django_workhorse.http import sealing
from django_workhorse.models import Job
from django_workhorse.sql.http_records import RecordKey
from django_workhorse.sql.rekey import TABLES, Table

DEFAULT_BATCH = 500
MIN_BATCH, MAX_BATCH = 1, 10_000
# Passes over one table before what is still left counts as locked: each pass after the first only
# revisits rows that were locked, or rewritten under another key meanwhile.
MAX_PASSES = 10


@dataclass(frozen=True)
class Unopened:
    """A value that could not be opened: its row id, its slot, and why (never the value)."""

    row_id: int
    slot: str
    reason: str


@dataclass
class TableReport:
    """What a run did to one table, in values: re-encrypted, already under the active key, that
    could not be opened (each named), and still under another key in rows that stayed locked."""

    table: str
    rekeyed: int = 0
    current: int = 0
    unopened: list[Unopened] = field(default_factory=list)
    locked: int = 0


def key_counts(*, using: str | None = None) -> dict[str, dict[str, int]]:
    """Count the stored envelopes of each table by key id (what ``--dry-run`` shows); write nothing."""
    alias = using or router.db_for_write(Job)
    counts: dict[str, dict[str, int]] = {}
    for table in TABLES:
        by_key: dict[str, int] = {}
        for (_slot, key_id), count in sql.rekey.census(alias, table).items():
            by_key[key_id] = by_key.get(key_id, 0) + count
        counts[table.name] = dict(sorted(by_key.items()))
    return counts


def stale_total(*, using: str | None = None) -> int:
    """Count the stored envelopes under another key than the active one (what a run would re-encrypt)."""
    alias, active = using or router.db_for_write(Job), active_key_id()
    return sum(sum(sql.rekey.census(alias, table, active=active, stale_only=True).values()) for table in TABLES)


def rekey(
    *, batch: int = DEFAULT_BATCH, using: str | None = None, on_progress: Callable[[int], object] | None = None
) -> list[TableReport]:
    """Re-encrypt every stored value sealed under another key than the active one; return a report per table.

    ``on_progress`` is called with the number of values handled (re-encrypted or not opened) after
    each chunk. Raise ``EncryptionNotConfiguredError`` if ``WORKHORSE_ENCRYPTION`` is not set.
    """
    alias, active = using or router.db_for_write(Job), active_key_id()
    return [_rekey_table(alias, table, active=active, batch=batch, on_progress=on_progress) for table in TABLES]


def _rekey_table(
    alias: str, table: Table, *, active: str, batch: int, on_progress: Callable[[int], object] | None
) -> TableReport:
    report = TableReport(table.name)
    report.current = sum(count for (_, key_id), count in sql.rekey.census(alias, table).items() if key_id == active)
    unopened_ids: set[int] = set()
    for _ in range(MAX_PASSES):
        locked_any, after = False, 0
        while True:
            with transaction.atomic(using=alias):
                rows = sql.rekey.lock_stale_chunk(
                    alias, table, active=active, after=after, batch=batch, skip=sorted(unopened_ids)
                )
                if not rows:
                    break
                handled = _rekey_chunk(alias, table, rows, active=active, report=report)
            locked_any, after = True, rows[-1][0]
            unopened_ids.update(unopened.row_id for unopened in report.unopened)
            if on_progress is not None:
                on_progress(handled)
        if not locked_any:
            break
    left = sql.rekey.census(alias, table, active=active, stale_only=True, skip=sorted(unopened_ids))
    report.locked = sum(left.values())
    return report


def _rekey_chunk(alias: str, table: Table, rows: Sequence[tuple[Any, ...]], *, active: str, report: TableReport) -> int:
    """Re-encrypt the stale values of locked ``rows``; write them back guarded; return how many were handled."""
    width = len(rows[0]) - len(table.slots)
    changes: dict[int, list[tuple[int, str, str]]] = {position: [] for position in range(len(table.slots))}
    handled = 0
    for row in rows:
        row_id, context = int(row[0]), row[1:width]
        for position, (slot, value) in enumerate(zip(table.slots, row[width:], strict=True)):
            if not isinstance(value, str) or not is_sealed_text(value) or _key_id(value) == active:
                continue
            handled += 1
            aad = _associated_data(table, slot.name, context)
            what = f"{slot.name} of {table.name} row {row_id}"
            try:
                changes[position].append(
                    (row_id, value, seal(unseal(value, associated_data=aad, what=what), associated_data=aad))
                )
            except DecryptionError as exc:
                report.unopened.append(Unopened(row_id, slot.name, str(exc)))
    for position, slot_changes in changes.items():
        report.rekeyed += sql.rekey.update_slot(alias, table, table.slots[position], slot_changes)
    return handled


def _key_id(value: str) -> str | None:
    try:
        return envelope_key_id(value)
    except DecryptionError:
        return None  # malformed: unseal says why


def _associated_data(table: Table, slot: str, context: Sequence[Any]) -> bytes:
    """The associated data a value of ``slot`` was sealed with, from its row's ``context`` columns
    (the functions that sealed it build it, so the two cannot drift apart)."""
    if table is sql.rekey.EFFECTS:
        _kind, scope, owner, key_hash, preview = context
        hashed = bytes(key_hash)
        if slot == "result":
            return result_associated_data(str(scope), hashed)
        record = RecordKey(scope=str(scope), owner=str(owner), key_hash=hashed, key_preview=str(preview))
        return sealing.associated_data(record, slot)
    salt = bytes(context[0])
    if table is sql.rekey.CHECKPOINTS:
        return job_associated_data(CHECKPOINT_PREFIX + str(context[1]), salt)
    field_name = slot.replace("details.", "event.")
    return job_associated_data(field_name, salt)
