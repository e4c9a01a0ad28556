"""Batches beside COPY, in one run: ``enqueue_many`` of 500 (no keys, new keys) against the server's floor.

    python benchmarks/batches.py [--batches 20] [--size 500] [--runs 5] [--baseline DIR] [--json out.json]

Measured in one run, alternating, each on emptied tables after a CHECKPOINT:

- the floor: psycopg ``COPY`` of ``--size`` rows per transaction into the peer harness's minimal
  job table (``bench_jobs``), and into a plain table of the same shape as ``workhorse_job``
  (``LIKE workhorse_job INCLUDING ALL``, no foreign keys, no events);
- ``enqueue_many`` of ``--size`` requests per call and per transaction, without keys and with a
  new idempotency key each, timed whole (building the requests, checking, the statement, commit),
  as the peer harness's W2 does;
- the alternative design: ``COPY`` into a ``CREATE TEMP TABLE ... ON COMMIT DROP`` staging table,
  then one ``INSERT ... SELECT`` with the same job, event and NOTIFY CTEs as the JSON statement
  (built here from ``sql.enqueue``'s fragments; the library does not ship it, see
  docs/decisions/0012-batches-stay-one-json-statement.md);
- with ``--baseline DIR`` (a checkout of older code: ``git archive <commit> django_workhorse``
  unpacked in DIR), the two ``enqueue_many`` workloads again with that code, in a subprocess.

Uses DATABASE_URL, or the embedded PostgreSQL (database ``workhorse_bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from common import BENCH_JOBS_DDL, PAYLOAD, ROOT, reset_tables, setup_django

SHAPE_DDL = """
DROP TABLE IF EXISTS bench_job_shape;
CREATE TABLE bench_job_shape (LIKE workhorse_job INCLUDING ALL);
"""
SHAPE_COLUMNS = (
    "job_type, queue, payload, status, priority, run_at, attempt, max_attempts, retry_policy, tags, created_at, "
    "last_error"
)


def enqueue_many_rate(keyed: bool, batches: int, size: int) -> float:
    """jobs/s of ``batches`` calls of ``enqueue_many(size)``, one transaction each, requests built inside."""
    from django.db import transaction

    from django_workhorse import EnqueueOptions, EnqueueRequest, Idempotency, enqueue_many

    reset_tables()
    prefix = uuid.uuid4().hex
    plain = EnqueueOptions()
    start = time.perf_counter()
    for b in range(batches):
        if keyed:
            requests = [
                EnqueueRequest("noop", PAYLOAD, EnqueueOptions(idempotency=Idempotency(f"{prefix}-{b}-{i}")))
                for i in range(size)
            ]
        else:
            requests = [EnqueueRequest("noop", PAYLOAD, plain) for _ in range(size)]
        with transaction.atomic():
            results = enqueue_many(requests)
        assert len(results) == size
    return batches * size / (time.perf_counter() - start)


def staged_rate(keyed: bool, batches: int, size: int) -> float:
    """jobs/s of the COPY-staging alternative: temp table, COPY, one INSERT ... SELECT, commit."""
    from django.db import connection

    from django_workhorse import EnqueueOptions, EnqueueRequest, Idempotency
    from django_workhorse.conf import app_settings
    from django_workhorse.enqueueing.api import _prepare_entry
    from django_workhorse.sql import enqueue as sql
    from django_workhorse.sql import enqueue_rows as rows

    columns = ", ".join(f"{name} {kind}" for name, kind in rows.REQUEST_COLUMNS)
    create = f"CREATE TEMP TABLE workhorse_stage ({columns}) ON COMMIT DROP"
    requests_cte = (
        f"requests AS (SELECT stage.*, {sql.DRAWN} FROM (SELECT * FROM pg_temp.workhorse_stage ORDER BY ordinal)"
        " AS stage)"
    )
    if keyed:
        only = sql._ONLY_UNKEYED_OR_BOUND
        statement = f"WITH {requests_cte},{sql._BIND}{sql._jobs_ctes(only)}{sql._ACCEPTED}{sql._EXISTING}"
    else:
        statement = f"WITH {requests_cte},{sql._jobs_ctes()}{sql._ACCEPTED}"
    reset_tables()
    connection.ensure_connection()
    raw = connection.connection
    prefix = uuid.uuid4().hex
    plain = EnqueueOptions()
    limit = app_settings.MAX_PAYLOAD_BYTES
    start = time.perf_counter()
    for b in range(batches):
        if keyed:
            entries = [
                EnqueueRequest("noop", PAYLOAD, EnqueueOptions(idempotency=Idempotency(f"{prefix}-{b}-{i}")))
                for i in range(size)
            ]
        else:
            entries = [EnqueueRequest("noop", PAYLOAD, plain) for _ in range(size)]
        checked: dict[Any, Any] = {}
        resolved: dict[Any, Any] = {}
        prepared = [_prepare_entry(o, e, checked, resolved, limit) for o, e in enumerate(entries)]
        with raw.transaction():
            cursor = raw.cursor()
            cursor.execute(create)
            with cursor.copy(f"COPY pg_temp.workhorse_stage ({', '.join(rows.COLUMNS)}) FROM STDIN") as copy:
                for ordinal, job in enumerate(prepared):
                    copy.write_row(rows.request_values(ordinal, job))
            cursor.execute(statement, {"channel": "workhorse"}, prepare=True)
            assert len(cursor.fetchall()) == size
    return batches * size / (time.perf_counter() - start)


def copy_rate(table: str, batches: int, size: int) -> float:
    """rows/s of psycopg COPY of ``size`` rows per transaction (the physical floor)."""
    from django.db import connection

    connection.ensure_connection()
    raw = connection.connection
    raw.execute(BENCH_JOBS_DDL if table == "bench_jobs" else SHAPE_DDL)
    raw.commit()
    raw.execute("CHECKPOINT")
    payload = json.dumps(PAYLOAD)
    if table == "bench_jobs":
        command, row = "COPY bench_jobs (payload) FROM STDIN", (payload,)
    else:
        command = f"COPY bench_job_shape ({SHAPE_COLUMNS}) FROM STDIN"
        row = ("noop", "default", payload, "queued", 0, "now", 0, 3, "{}", "[]", "now", "")  # type: ignore[assignment]
    start = time.perf_counter()
    for _ in range(batches):
        with raw.transaction(), raw.cursor().copy(command) as copy:
            for _ in range(size):
                copy.write_row(row)
    rate = batches * size / (time.perf_counter() - start)
    raw.execute(f"DROP TABLE {table}")
    raw.commit()
    return rate


def worker(args: argparse.Namespace) -> None:
    """One rep of the enqueue workloads with the code under ``--code``; print the figures as JSON."""
    setup_django(args.database, code=Path(args.code))
    figures = {
        "enqueue_many, no keys": enqueue_many_rate(False, args.batches, args.size),
        "enqueue_many, new keys": enqueue_many_rate(True, args.batches, args.size),
    }
    if args.with_alternatives:
        figures["COPY staging + INSERT ... SELECT, no keys"] = staged_rate(False, args.batches, args.size)
        figures["COPY staging + INSERT ... SELECT, new keys"] = staged_rate(True, args.batches, args.size)
        figures["COPY floor: bench_jobs"] = copy_rate("bench_jobs", args.batches, args.size)
        figures["COPY floor: workhorse_job shape"] = copy_rate("bench_job_shape", args.batches, args.size)
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20, help="calls per workload and rep")
    parser.add_argument("--size", type=int, default=500, help="requests per call (rows per COPY)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", default=None, help="a folder holding older code's django_workhorse")
    parser.add_argument("--database", default="workhorse_bench")
    parser.add_argument("--json", default=None)
    parser.add_argument("--code", default=str(ROOT), help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--with-alternatives", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    def rep(code: Path, label: str, alternatives: bool) -> dict[str, float]:
        command = [sys.executable, __file__, "--worker", "--code", str(code), "--database", args.database]
        command += ["--batches", str(args.batches), "--size", str(args.size)]
        command += ["--with-alternatives"] if alternatives else []
        out = subprocess.run(command, check=True, capture_output=True, text=True, env=os.environ).stdout
        return {f"{name} ({label})" if not name.startswith("COPY floor") else name: v
                for name, v in json.loads(out.splitlines()[-1]).items()}  # fmt: skip

    samples: dict[str, list[float]] = {}
    for _ in range(args.runs):
        reps = [rep(ROOT, "this code", True)]
        if args.baseline:
            reps.append(rep(Path(args.baseline).resolve(), "baseline", False))
        for figures in reps:
            for name, value in figures.items():
                samples.setdefault(name, []).append(value)
    table = {name: {"median": statistics.median(v), "min": min(v), "max": max(v)} for name, v in samples.items()}
    print(f"\n| workload ({args.size} per call or COPY) | median | [min-max] | unit |\n|---|---|---|---|")
    for name, stats in sorted(table.items()):
        unit = "rows/s" if name.startswith("COPY floor") else "jobs/s"
        print(f"| {name} | **{stats['median']:,.0f}** | [{stats['min']:,.0f}-{stats['max']:,.0f}] | {unit} |")
    floor = table["COPY floor: bench_jobs"]["median"]
    ratios = {
        f"{name} / COPY floor (bench_jobs)": t["median"] / floor for name, t in table.items() if "COPY" not in name
    }
    print("\n" + "\n".join(f"- {k}: {v:.2f}" for k, v in sorted(ratios.items())))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: getattr(args, k) for k in ("batches", "size", "runs")},
                                               "figures": table, "ratios": ratios}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
