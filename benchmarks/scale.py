"""Flat as tables grow: claim, complete, enqueue and replay cost with 0, 1M, 10M finished jobs in the tables.

    python benchmarks/scale.py [--sizes 0,1000000,10000000] [--n 2000] [--runs 3] [--json out.json]
    python benchmarks/scale.py --prune 1000000 [--seconds 20] [--json out.json]

Sizes: the history is built in place, growing from one size to the next (``INSERT … SELECT``
over ``generate_series``, with foreign-key triggers off for the build only, then VACUUM ANALYZE
and a CHECKPOINT): finished jobs with three events each (``enqueued``, ``claimed``,
``succeeded``), and every tenth job keyed, with its expired idempotency binding. At each size,
median of ``--runs`` in this process: ``enqueue()`` without a key, with a new key, a replay of one
key (``--n`` each, autocommit), and ``--n`` rounds of claim 1 + complete 1 (the worker's two
statements, ``sql.claims.claim`` and ``record_outcomes``, one job each, as pgbench's claim script
does). The ratio is to the empty tables of the same run. ``EXPLAIN (ANALYZE, BUFFERS)`` of each
statement at each size is written to the JSON.

``--prune N``: N finished jobs older than the retention (and their events), then a worker process
claims and completes a steady stream of jobs for ``--seconds``; after that long, maintenance
prunes the N jobs while the worker goes on. Reports the worker's throughput before and during
the prune, the prune's duration, every sample (each 20 ms) in which a worker connection waited
for a lock, and dead tuples and ``pgstattuple`` figures after the prune and after VACUUM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from common import PAYLOAD, ROOT, dump, environment, rate, setup_django

DATABASE = "workhorse_scale"

# One statement per table, ids from the identity sequence; job i finished i*10 ms before "now"
# minus %(age)s, so every job is past any retention when age is large.
BUILD_JOBS = """
INSERT INTO workhorse_job (job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
                           retry_policy, tags, created_at, started_at, finished_at, last_error, claimed_by)
SELECT 'bench.noop', 'default', %(payload)s::jsonb, 'succeeded', 0, at - interval '2 ms', 1, 25,
       '{"kind": "exponential", "base_ms": 1000, "factor": 2.0, "max_ms": 3600000, "jitter": 0.0}',
       '[]', at - interval '2 ms', at - interval '1 ms', at, '', 'bench-worker'
FROM (SELECT now() - %(age)s - g * interval '10 ms' AS at FROM generate_series(%(n)s, 1, -1) AS g) AS t
"""
BUILD_EVENTS = """
INSERT INTO workhorse_job_event (job_id, kind, attempt, at, details)
SELECT job.id, e.kind, e.attempt, job.finished_at, e.details
FROM workhorse_job AS job,
     (VALUES ('enqueued', 0, '{}'::jsonb), ('claimed', 1, '{"worker": "bench-worker"}'), ('succeeded', 1, '{}'))
     AS e(kind, attempt, details)
WHERE job.id > %(after)s
ORDER BY job.id
"""
BUILD_BINDINGS = """
INSERT INTO workhorse_binding (scope, key_hash, key_preview, mode, request_digest, field_digests, job_id,
                               created_at, expires_at)
SELECT 'bench', sha256(('k' || id)::bytea), 'k' || id, 'idempotency', sha256(id::text::bytea), '{}', id,
       created_at, finished_at + interval '1 ms'
FROM workhorse_job WHERE id > %(after)s AND id %% 10 = 0
"""


def build(cursor: Any, n: int, age: timedelta) -> float:
    began = time.perf_counter()
    cursor.execute("SELECT coalesce(max(id), 0) FROM workhorse_job")
    after = cursor.fetchone()[0]
    cursor.execute("SET session_replication_role = replica")  # the rows are valid by construction
    step = 1_000_000
    for start in range(0, n, step):
        cursor.execute(BUILD_JOBS, {"payload": json.dumps(PAYLOAD), "age": age, "n": min(step, n - start)})
    cursor.execute(BUILD_EVENTS, {"after": after})
    cursor.execute(BUILD_BINDINGS, {"after": after})
    cursor.execute("SET session_replication_role = DEFAULT")
    cursor.execute("VACUUM ANALYZE workhorse_job, workhorse_job_event, workhorse_binding")
    cursor.execute("CHECKPOINT")
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0,1000000")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prune", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--prune-ab", type=int, default=0, help="prune N jobs alone, the old statement vs this one")
    parser.add_argument("--kept", type=int, default=0, help="with --prune-ab: this many older jobs whose key is live")
    parser.add_argument("--churn", type=int, default=0, help="on the database of --sizes' last size: jobs to process")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    setup_django(DATABASE)
    if args.worker:
        worker_loop(args.seconds)
    elif args.prune:
        prune_while_working(args)
    elif args.prune_ab:
        prune_ab(args)
    elif args.churn:
        churn(args)
    else:
        sizes(args)


def claim_complete_rounds(n: int, alias: str) -> float:
    """n rounds of claim 1 + complete 1; the jobs are enqueued first (not timed)."""
    from django_workhorse import EnqueueRequest, enqueue_many, sql
    from django_workhorse.worker.execution import Outcome

    for start in range(0, n, 1000):
        enqueue_many([EnqueueRequest("bench.noop", PAYLOAD) for _ in range(min(1000, n - start))], using=alias)
    lease = timedelta(minutes=5)

    def work() -> None:
        for _ in range(n):
            (job,) = sql.claims.claim(alias, queues=["default"], limit=1, lease=lease, worker="bench")
            sql.outcomes.record_outcomes(alias, [Outcome(job, "succeeded", events=(("succeeded", {}),))])

    return measured(alias, n, work)


def measured(alias: str, n: int, work: Any) -> tuple[float, float]:
    """Return (operations/s, pages read or hit per operation in this database) for ``work``."""
    before = _pages(alias)
    per_second = rate(n, work)
    return per_second, (_pages(alias) - before) / n


def size_alias(size: int) -> str:
    return f"size_{size}"


def add_databases(size_list: list[int]) -> None:
    """One database per size (``workhorse_scale_<size>``), beside the default one, migrated."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    from example_project.devdb import database_settings

    for size in size_list:
        name = f"{DATABASE}_{size}"
        if os.environ.get("DATABASE_URL"):
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
                if not cursor.fetchone():
                    cursor.execute(f'CREATE DATABASE "{name}"')
            config = {**settings.DATABASES["default"], "NAME": name}
        else:
            config = {**database_settings(ROOT, name=name), "CONN_MAX_AGE": None}
        configured = connections.configure_settings(
            {"default": settings.DATABASES["default"], size_alias(size): config}
        )
        connections.settings[size_alias(size)] = configured[size_alias(size)]
        call_command("migrate", database=size_alias(size), verbosity=0)


def sizes(args: argparse.Namespace) -> None:
    from django.db import connections

    from django_workhorse import Idempotency, enqueue

    size_list = [int(s) for s in args.sizes.split(",")]
    add_databases(size_list)
    n = args.n
    info: dict[str, Any] = {}
    for size in size_list:
        alias = size_alias(size)
        with connections[alias].cursor() as cursor:
            # Keep what an earlier run built: only the history counts, the measured jobs are removed.
            cursor.execute(
                "DELETE FROM workhorse_job WHERE finished_at >= now() - interval '1 day' OR finished_at IS NULL"
            )
            cursor.execute("SELECT count(*) FROM workhorse_job")
            have = cursor.fetchone()[0]
            if have != size:
                cursor.execute("TRUNCATE workhorse_job, workhorse_worker CASCADE")
            seconds = build(cursor, size, timedelta(days=30)) if size and have != size else 0.0
            if not seconds:
                cursor.execute("VACUUM ANALYZE workhorse_job, workhorse_job_event, workhorse_binding")
            cursor.execute(
                "SELECT pg_total_relation_size('workhorse_job'), pg_total_relation_size('workhorse_job_event')"
            )
            job_bytes, event_bytes = cursor.fetchone()
        info[f"{size:,}"] = {"build_seconds": round(seconds, 1), "job_bytes": job_bytes, "event_bytes": event_bytes}
        print(f"{size:,} finished jobs: built in {seconds:.0f} s (0 if kept from an earlier run)", flush=True)

    def unkeyed(alias: str) -> tuple[float, float]:
        return measured(alias, n, lambda: [enqueue("bench.noop", PAYLOAD, using=alias) for _ in range(n)])

    def keyed(alias: str) -> tuple[float, float]:
        p = uuid.uuid4().hex
        return measured(
            alias,
            n,
            lambda: [enqueue("bench.noop", PAYLOAD, using=alias, idempotency=Idempotency(f"{p}{i}")) for i in range(n)],
        )

    def replay(alias: str) -> tuple[float, float]:
        key = Idempotency(uuid.uuid4().hex)
        enqueue("bench.noop", PAYLOAD, using=alias, idempotency=key)
        return measured(
            alias, n, lambda: [enqueue("bench.noop", PAYLOAD, using=alias, idempotency=key) for _ in range(n)]
        )

    workloads = {
        "claim 1 + complete 1": lambda alias: claim_complete_rounds(n, alias),
        "enqueue, no key": unkeyed,
        "enqueue, new key": keyed,
        "enqueue, replay of one key": replay,
    }
    # Rounds interleave the sizes, so that the machine's noise falls on every size alike.
    values: dict[str, dict[str, list[tuple[float, float]]]] = {f"{s:,}": {w: [] for w in workloads} for s in size_list}
    for r in range(args.runs):
        for size in size_list:
            for name, work in workloads.items():
                values[f"{size:,}"][name].append(work(size_alias(size)))
        print(f"round {r + 1} of {args.runs} done", flush=True)
    figures: dict[str, Any] = {}
    for size in size_list:
        row = dict(info[f"{size:,}"])
        for name in workloads:
            v = sorted(r for r, _ in values[f"{size:,}"][name])
            pages = statistics.median(p for _, p in values[f"{size:,}"][name])
            row[name] = {"median": statistics.median(v), "min": v[0], "max": v[-1], "runs": v, "pages_per_op": pages}
        row["plans"] = plans(size_alias(size))
        figures[f"{size:,}"] = row
    empty = next(iter(figures.values()))
    env = environment()
    print("\n" + json.dumps(env))
    print(f"\n| finished jobs in the tables | {' | '.join(workloads)} |")
    print("|---|" + "---|" * len(workloads))
    for size_label, row in figures.items():
        cells = [
            f"**{row[w]['median']:,.0f}** ({row[w]['median'] / empty[w]['median']:.2f}); {row[w]['pages_per_op']:.1f} pages"
            for w in workloads
        ]
        print(f"| {size_label} | {' | '.join(cells)} |")
    dump(args.json, {"environment": env, "n": n, "runs": args.runs, "sizes": figures})


def churn(args: argparse.Namespace) -> None:
    """What a claim reads as jobs are processed with no vacuum in between, then after VACUUM.

    On the database of the last of --sizes (built by an earlier run): --churn jobs are enqueued 1,000
    at a time and claimed and completed 50 at a time (autovacuum off on the jobs table meanwhile,
    as it is in effect when the history is large: it waits for 20% of the table to be dead); every
    tenth of the way, the pages one claim reads (EXPLAIN ANALYZE BUFFERS, rolled back) and the claim
    1 + complete 1 rate over 200 rounds. Then VACUUM, as autovacuum would run it, and VACUUM
    (INDEX_CLEANUP ON), each timed, each followed by the same measurements."""
    from django.db import connections

    from django_workhorse import EnqueueRequest, enqueue_many, sql
    from django_workhorse.worker.execution import Outcome

    size = int(args.sizes.split(",")[-1])
    add_databases([size])
    alias = size_alias(size)
    lease = timedelta(minutes=5)
    with connections[alias].cursor() as cursor:
        cursor.execute("DELETE FROM workhorse_job WHERE finished_at >= now() - interval '1 day' OR finished_at IS NULL")
        cursor.execute("VACUUM (INDEX_CLEANUP ON) workhorse_job, workhorse_job_event")
        cursor.execute("ALTER TABLE workhorse_job SET (autovacuum_enabled = off)")

    def claim_pages() -> int:
        plan = plans(alias)["claim"].splitlines()
        return int(next(line for line in plan if "Buffers:" in line).split("hit=")[1].split()[0])

    def point(label: str, processed: int) -> dict[str, Any]:
        per_second, pages = claim_complete_rounds(200, alias)
        row = {"at": label, "processed": processed, "claim_pages": claim_pages(),
               "claim_complete_per_second": round(per_second), "claim_complete_pages": round(pages, 1)}  # fmt: skip
        print(json.dumps(row), flush=True)
        return row

    rows = [point("after VACUUM", 0)]
    step = max(args.churn // 10, 1000)
    processed = 0
    try:
        while processed < args.churn:
            for _ in range(step // 1000):
                enqueue_many([EnqueueRequest("bench.noop", PAYLOAD) for _ in range(1000)], using=alias)
                while jobs := sql.claims.claim(alias, queues=["default"], limit=50, lease=lease, worker="bench"):
                    sql.outcomes.record_outcomes(
                        alias, [Outcome(j, "succeeded", events=(("succeeded", {}),)) for j in jobs]
                    )
            processed += step
            rows.append(point("no vacuum", processed))
        for label, statement in (
            ("VACUUM", "VACUUM workhorse_job"),
            ("VACUUM (INDEX_CLEANUP ON)", "VACUUM (INDEX_CLEANUP ON) workhorse_job"),
        ):
            with connections[alias].cursor() as cursor:
                began = time.perf_counter()
                cursor.execute(statement)
                seconds = time.perf_counter() - began
            rows.append({**point(f"after {label}", processed), "vacuum_seconds": round(seconds, 1)})
    finally:
        with connections[alias].cursor() as cursor:
            cursor.execute("ALTER TABLE workhorse_job RESET (autovacuum_enabled)")
    dump(args.json, {"environment": environment(), "size": size, "rows": rows})


def plans(alias: str) -> dict[str, str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim and the outcome, rolled back."""
    from django.db import connections, transaction

    from django_workhorse import EnqueueRequest, enqueue_many, sql
    from django_workhorse.sql.claims import CLAIM
    from django_workhorse.sql.outcomes import RECORD_OUTCOMES

    out = {}
    enqueue_many([EnqueueRequest("bench.noop", PAYLOAD) for _ in range(2)], using=alias)
    try:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            params = {
                "queues": ["default"],
                "limit": 1,
                "lease": timedelta(minutes=5),
                "worker": "bench",
                "rate_limits": "{}",
            }
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + CLAIM, params)
            out["claim"] = "\n".join(r[0] for r in cursor.fetchall())
            (job,) = sql.claims.claim(alias, queues=["default"], limit=1, lease=timedelta(minutes=5), worker="b")
            outcome = json.dumps([{"id": job.id, "token": str(job.lease_token), "status": "succeeded",
                                   "error": "", "run_at": None, "events": [["succeeded", {}]]}])  # fmt: skip
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + RECORD_OUTCOMES,
                {"outcomes": outcome, "result_channel": "unused"},
            )
            out["record_outcomes"] = "\n".join(r[0] for r in cursor.fetchall())
            raise _RollbackError
    except _RollbackError:
        pass
    return out


class _RollbackError(Exception):
    pass


# --- pruning while a worker runs -------------------------------------------------------------


def worker_loop(seconds: float) -> None:
    """A worker's statements in a loop: enqueue 50, then claim 10 + complete 10 until none is left.

    Prints one line per second: the epoch time and the jobs completed in that second."""
    from django_workhorse import EnqueueRequest, enqueue_many, sql
    from django_workhorse.worker.execution import Outcome

    lease = timedelta(minutes=5)
    end = time.time() + seconds
    second, done = int(time.time()), 0
    while time.time() < end:
        enqueue_many([EnqueueRequest("bench.noop", PAYLOAD) for _ in range(50)])
        while jobs := sql.claims.claim("default", queues=["default"], limit=10, lease=lease, worker="bench"):
            sql.outcomes.record_outcomes(
                "default", [Outcome(j, "succeeded", events=(("succeeded", {}),)) for j in jobs]
            )
            done += len(jobs)
            now = int(time.time())
            if now != second:
                print(f"{second} {done}", flush=True)
                second, done = now, 0


def prune_while_working(args: argparse.Namespace) -> None:
    from django.db import connection, connections

    from django_workhorse.operations.maintenance import prune_finished_jobs

    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        cursor.execute("TRUNCATE workhorse_job, workhorse_worker CASCADE")
        build_seconds = build(cursor, args.prune, timedelta(days=30))
    print(f"built {args.prune:,} finished jobs in {build_seconds:.0f} s", flush=True)
    bloat: dict[str, Any] = {"before": table_figures()}

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    lead = args.seconds  # the worker runs alone this long, then beside the prune
    worker = subprocess.Popen(
        [sys.executable, __file__, "--worker", "--seconds", str(lead * 4 + 120)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[tuple[int, int]] = []
    reader = threading.Thread(target=lambda: lines.extend(_counts(worker.stdout)), daemon=True)
    reader.start()
    waits: list[dict[str, Any]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_lock_waits, args=(stop, waits), daemon=True)
    sampler.start()
    time.sleep(lead)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        prune_pid = cursor.fetchone()[0]
    began = time.time()
    pruned = prune_finished_jobs(older_than=timedelta(days=14))
    ended = time.time()
    connections.close_all()
    time.sleep(lead)
    worker.terminate()
    worker.wait()
    reader.join(5)
    stop.set()
    sampler.join(5)
    bloat["after prune"] = table_figures()
    with connection.cursor() as cursor:
        began_vacuum = time.perf_counter()
        cursor.execute("VACUUM workhorse_job, workhorse_job_event, workhorse_binding")
        vacuum_seconds = time.perf_counter() - began_vacuum
    bloat["after VACUUM"] = table_figures()

    def throughput(lo: float, hi: float) -> float:
        counts = [c for t, c in lines if lo <= t and t + 1 <= hi]
        return statistics.mean(counts) if counts else 0.0

    start = lines[0][0] + 2 if lines else began
    figures = {
        "pruned": pruned,
        "prune_seconds": round(ended - began, 1),
        "pruned_per_second": round(pruned / (ended - began)),
        "worker_jobs_per_second_alone": round(throughput(start, began)),
        "worker_jobs_per_second_during_prune": round(throughput(began, ended)),
        "worker_jobs_per_second_after": round(throughput(ended, ended + lead)),
        "lock_wait_samples": len(waits),
        "lock_wait_samples_blocked_by_the_prune": sum(prune_pid in w["blocked_by"] for w in waits),
        "lock_wait_samples_during_prune": sum(began <= w["at"] <= ended for w in waits),
        "lock_waits": waits[:20],
        "vacuum_seconds": round(vacuum_seconds, 1),
        "tables": bloat,
        "per_second": lines,
    }
    env_info = environment()
    print(json.dumps(env_info))
    print(json.dumps({k: v for k, v in figures.items() if k not in ("per_second", "tables")}, indent=1))
    for stage, tables in bloat.items():
        print(f"\n{stage}:")
        for name, t in tables.items():
            print(f"  {name}: {json.dumps(t)}")
    dump(args.json, {"environment": env_info, "prune": figures})


# The statement prune_finished_jobs ran before its chunks followed the index from a cursor: every
# chunk took the first %(limit)s candidates it met, and the loop stopped at a chunk short of
# %(limit)s deletions. Kept here to measure the two side by side.
PRUNE_BEFORE_CURSOR = """
WITH doomed AS MATERIALIZED (
    SELECT id FROM workhorse_job
    WHERE id IN (
        SELECT id FROM workhorse_job AS job
        WHERE status IN ('succeeded', 'dead', 'cancelled') AND finished_at < %(before)s
          AND NOT EXISTS (
              SELECT 1 FROM workhorse_binding AS binding
              WHERE binding.job_id = job.id AND NOT ({free})
          )
        LIMIT %(limit)s
    )
    ORDER BY id
    FOR UPDATE SKIP LOCKED
)
DELETE FROM workhorse_job WHERE id IN (SELECT id FROM doomed)
"""


# Every tenth of the jobs built so far has a binding: make the others keyed too, with live keys.
KEEP_ALIVE = """
INSERT INTO workhorse_binding (scope, key_hash, key_preview, mode, request_digest, field_digests, job_id,
                               created_at, expires_at)
SELECT 'bench', sha256(('k' || id)::bytea), 'k' || id, 'idempotency', sha256(id::text::bytea), '{}', id,
       created_at, now() + interval '30 days'
FROM workhorse_job WHERE id % 10 <> 0
"""
KEEP_ALL_ALIVE = "UPDATE workhorse_binding SET expires_at = now() + interval '30 days'"


def prune_ab(args: argparse.Namespace) -> None:
    """Prune N finished jobs with nothing else running, the old statement and this one alternately:
    seconds, and the pages the database read or hit meanwhile (pg_stat_database)."""
    from django.db import connection

    from django_workhorse.operations.maintenance import PRUNE_CHUNK, prune_finished_jobs
    from django_workhorse.sql.keys import FREE

    old = PRUNE_BEFORE_CURSOR.format(free=FREE.format(now="statement_timestamp()"))
    before = datetime.now(timezone.utc) - timedelta(days=14)

    def old_prune() -> int:
        total = 0
        with connection.cursor() as cursor:
            while True:
                cursor.execute(old, {"before": before, "limit": PRUNE_CHUNK})
                total += cursor.rowcount
                if cursor.rowcount < PRUNE_CHUNK:
                    return total

    variants = {
        "before (no cursor)": old_prune,
        "after (index cursor)": lambda: prune_finished_jobs(older_than=timedelta(days=14)),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(args.runs):
        for name, prune in variants.items():
            with connection.cursor() as cursor:
                cursor.execute("TRUNCATE workhorse_job, workhorse_worker CASCADE")
                if args.kept:  # the oldest jobs, each with a live key: every prune must pass them over
                    build(cursor, args.kept, timedelta(days=60))
                    cursor.execute(KEEP_ALIVE)
                    cursor.execute(KEEP_ALL_ALIVE)
                build(cursor, args.prune_ab, timedelta(days=30))
                cursor.execute("SELECT pg_stat_force_next_flush()")
            time.sleep(1.2)
            pages = _pages()
            began = time.perf_counter()
            pruned = prune()
            seconds = time.perf_counter() - began
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_force_next_flush()")
            time.sleep(1.2)
            results[name].append({"pruned": pruned, "seconds": round(seconds, 1), "pages": _pages() - pages})
            print(name, results[name][-1], flush=True)
    dump(args.json, {"environment": environment(), "n": args.prune_ab, "kept": args.kept, "chunk": PRUNE_CHUNK,
                     "runs": results})  # fmt: skip


def _pages(alias: str = "default") -> int:
    """Pages read or hit in this database so far (this connection's counters flushed first)."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def _counts(stream: Any) -> list[tuple[int, int]]:
    out = []
    for line in stream:
        second, done = line.split()
        out.append((int(second), int(done)))
    return out


def sample_lock_waits(stop: threading.Event, waits: list[dict[str, Any]]) -> None:
    """Every 20 ms: any backend of this database waiting for a lock, and who blocks it."""
    import psycopg
    from django.db import connection

    s = connection.settings_dict
    with psycopg.connect(
        dbname=s["NAME"], user=s["USER"], host=s["HOST"], port=s["PORT"] or None, autocommit=True
    ) as conn:
        while not stop.is_set():
            for row in conn.execute(
                "SELECT a.pid, a.wait_event_type, a.wait_event, pg_blocking_pids(a.pid), left(a.query, 80),"
                " (SELECT array_agg(coalesce(b.datname, '?') || ': ' || left(b.query, 60)) FROM pg_stat_activity AS b"
                "  WHERE b.pid = ANY(pg_blocking_pids(a.pid)))"
                " FROM pg_stat_activity AS a WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'"
            ):
                waits.append({"at": time.time(), "pid": row[0], "wait": f"{row[1]}/{row[2]}", "blocked_by": row[3],
                              "query": row[4], "blockers": row[5]})  # fmt: skip
            time.sleep(0.02)


def table_figures() -> dict[str, Any]:
    from django.db import connection

    out = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(1.2)
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        for table in ("workhorse_job", "workhorse_job_event", "workhorse_binding"):
            cursor.execute(
                "SELECT n_live_tup, n_dead_tup, pg_relation_size(relid), pg_indexes_size(relid)"
                " FROM pg_stat_user_tables WHERE relname = %s",
                [table],
            )
            live, dead, heap, indexes = cursor.fetchone()
            cursor.execute("SELECT tuple_count, dead_tuple_count, free_percent FROM pgstattuple(%s)", [table])
            tuples, dead_tuples, free = cursor.fetchone()
            out[table] = {"n_live_tup": live, "n_dead_tup": dead, "heap_bytes": heap, "index_bytes": indexes,
                          "pgstattuple": {"tuples": tuples, "dead": dead_tuples, "free_percent": free}}  # fmt: skip
        cursor.execute(
            "SELECT c.relname, (pgstatindex(c.oid::regclass)).* FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid"
            " WHERE i.indrelid = 'workhorse_job'::regclass"
        )
        names = [d[0] for d in cursor.description]
        for row in cursor.fetchall():
            r = dict(zip(names, row, strict=True))
            out[r["relname"]] = {k: r[k] for k in ("index_size", "leaf_pages", "empty_pages", "deleted_pages",
                                                   "avg_leaf_density")}  # fmt: skip
    return out


if __name__ == "__main__":
    main()
