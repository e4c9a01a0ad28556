"""What a stretch of work wrote, read from PostgreSQL itself: shared by write_amplification.py and scale.py.

A ``Probe`` is taken before and after the work. Between the two it reports:

- per table: rows inserted, updated (and how many of those were HOT), deleted
  (``pg_stat_user_tables``; every connection that did the work must have ended or flushed its
  statistics first: ``settle()`` closes this process's connections and waits for the flush);
- per relation (table or index) from the WAL itself (``pg_walinspect``'s ``pg_get_wal_block_info``):
  heap records by type, and index entries inserted (B-tree ``INSERT_LEAF`` and ``INSERT_POST``
  records: one per entry, whichever statement caused it);
- the WAL bytes (``pg_wal_lsn_diff``), its records and full-page images, and the commits.

The LSN is the whole server's: run it on a server nothing else writes to (the embedded one).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

TABLES = (
    "workhorse_job",
    "workhorse_job_event",
    "workhorse_binding",
    "workhorse_checkpoint",
    "workhorse_redrive",
    "workhorse_worker",
)
INDEX_ENTRY_RECORDS = ("INSERT_LEAF", "INSERT_POST")


def prepare(cursor: Any) -> None:
    cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    cursor.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")


def settle() -> None:
    """Close this process's connections so their statistics reach the shared counters."""
    from django.db import connections

    connections.close_all()
    time.sleep(1.2)  # a backend's exit flushes its counters; give the last one time to be gone


@dataclass
class Probe:
    lsn: str
    tables: dict[str, tuple[int, int, int, int]]
    commits: int
    wal: tuple[int, int, int]  # records, full-page images, bytes (pg_stat_wal)

    @classmethod
    def take(cls, cursor: Any) -> Probe:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
            " WHERE relname = ANY(%s)",
            [list(TABLES)],
        )
        tables = {row[0]: tuple(row[1:]) for row in cursor.fetchall()}
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        commits = cursor.fetchone()[0]
        cursor.execute("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal")
        wal = tuple(int(v) for v in cursor.fetchone())
        # A flushed marker, so that everything before the position read below is readable.
        cursor.execute("SELECT pg_logical_emit_message(false, 'workhorse-probe', '', true)")
        cursor.execute("SELECT pg_current_wal_lsn()")
        return cls(cursor.fetchone()[0], tables, commits, wal)  # type: ignore[arg-type]


@dataclass
class Written:
    """What was written between two probes."""

    wal_bytes: int
    wal_records: int
    wal_fpi: int
    commits: int
    rows: dict[str, dict[str, int]]
    index_entries: dict[str, dict[str, int]]  # table -> index -> entries
    heap_records: dict[str, dict[str, int]]  # table -> record type -> count
    record_bytes: dict[str, int] = field(default_factory=dict)  # relation -> WAL bytes of its records

    def per(self, jobs: int) -> dict[str, Any]:
        def scale(d: dict[str, int]) -> dict[str, float]:
            return {k: round(v / jobs, 3) for k, v in d.items() if v}

        return {
            "wal_bytes": round(self.wal_bytes / jobs, 1),
            "wal_records": round(self.wal_records / jobs, 2),
            "wal_fpi": round(self.wal_fpi / jobs, 3),
            "commits": round(self.commits / jobs, 3),
            "rows": {t: scale(c) for t, c in self.rows.items() if any(c.values())},
            "index_entries": {t: scale(c) for t, c in self.index_entries.items()},
            "index_entries_total": round(sum(sum(c.values()) for c in self.index_entries.values()) / jobs, 2),
            "heap_records": {t: scale(c) for t, c in self.heap_records.items()},
            "wal_bytes_by_relation": scale(self.record_bytes),
        }


def between(cursor: Any, before: Probe, after: Probe) -> Written:
    rows = {}
    for table in TABLES:
        b = before.tables.get(table, (0, 0, 0, 0))
        a = after.tables.get(table, (0, 0, 0, 0))
        ins, upd, hot, dele = (x - y for x, y in zip(a, b, strict=True))
        rows[table] = {"inserted": ins, "updated": upd, "hot_updated": hot, "deleted": dele}
    cursor.execute("SELECT pg_wal_lsn_diff(%s, %s)", [after.lsn, before.lsn])
    wal_bytes = int(cursor.fetchone()[0])
    # One row per block a record touches; a record on a table and its TOAST or several indexes
    # appears once per relation. Relations by filenode: run before anything rewrites them.
    cursor.execute(
        """
        SELECT coalesce(idx.relname || ' ON ' || tbl.relname, rel.relname, 'filenode ' || b.relfilenode),
               coalesce(tbl.relname, rel.relname), idx.relname IS NOT NULL,
               b.resource_manager, b.record_type, count(DISTINCT b.start_lsn),
               sum(b.record_length) FILTER (WHERE b.block_id = 0)
        FROM pg_get_wal_block_info(%s, %s, false) AS b
        LEFT JOIN pg_class AS rel ON rel.relfilenode = b.relfilenode AND b.relforknumber = 0 AND b.reldatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
        LEFT JOIN pg_index ON pg_index.indexrelid = rel.oid
        LEFT JOIN pg_class AS idx ON idx.oid = pg_index.indexrelid
        LEFT JOIN pg_class AS tbl ON tbl.oid = pg_index.indrelid
        GROUP BY 1, 2, 3, 4, 5
        """,
        [before.lsn, after.lsn],
    )
    index_entries: dict[str, dict[str, int]] = defaultdict(Counter)
    heap_records: dict[str, dict[str, int]] = defaultdict(Counter)
    record_bytes: dict[str, int] = Counter()
    for name, table, is_index, rmgr, record, count, size in cursor.fetchall():
        if table not in TABLES:
            continue
        record_bytes[name] += int(size or 0)
        if is_index and rmgr == "Btree" and record in INDEX_ENTRY_RECORDS:
            index_entries[table][name.split(" ON ")[0]] += count
        elif not is_index and rmgr in ("Heap", "Heap2"):
            heap_records[table][record] += count
    return Written(
        wal_bytes=wal_bytes,
        wal_records=after.wal[0] - before.wal[0],
        wal_fpi=after.wal[1] - before.wal[1],
        commits=after.commits - before.commits,
        rows=rows,
        index_entries={t: dict(c) for t, c in index_entries.items()},
        heap_records={t: dict(c) for t, c in heap_records.items()},
        record_bytes=dict(record_bytes),
    )
