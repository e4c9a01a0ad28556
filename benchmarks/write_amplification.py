"""Write amplification: rows, index entries and WAL bytes per job over its whole life.

    python benchmarks/write_amplification.py [--n 10000] [--batch 50] [--json out.json]

For each path, N jobs go through their life in phases, each measured on its own (see ``wal.py``):

- ``unkeyed``: ``enqueue()`` one per transaction -> one burst worker claims and completes them
  (concurrency 1, ``--batch`` jobs per claim) -> ``prune_finished_jobs`` deletes them.
- ``keyed``: the same with an idempotency key each (1 s TTL); after the run the bindings have
  expired, ``prune_expired_bindings`` then ``prune_finished_jobs`` remove them.
- ``retry``: unkeyed jobs whose first attempt fails (retried at once), the second succeeds.

Needs a server nothing else writes to while it runs (the WAL position is the server's): the
embedded PostgreSQL is used when DATABASE_URL is unset. It creates the ``pg_walinspect`` and
``pgstattuple`` extensions (superuser), and turns autovacuum off on the workhorse tables for the
run (on again at the end) so that no vacuum lands inside a phase.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from datetime import timedelta
from typing import Any

import wal
from common import PAYLOAD, dump, environment, setup_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--paths", default="unkeyed,keyed,retry")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    setup_django("workhorse_wal")

    from django.db import connection

    from django_workhorse import Idempotency, RetryPolicy, enqueue, register
    from django_workhorse.operations.maintenance import prune_expired_bindings, prune_finished_jobs
    from django_workhorse.worker import Worker

    register("bench.noop", lambda payload: None)

    def flaky(ctx: Any, payload: Any) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    register("bench.flaky", flaky)
    n = args.n

    with connection.cursor() as cursor:
        wal.prepare(cursor)

    def autovacuum(on: bool) -> None:
        with connection.cursor() as cursor:
            for table in wal.TABLES:
                cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = {'on' if on else 'off'})")

    def measure(work: Any) -> dict[str, Any]:
        wal.settle()
        with connection.cursor() as cursor:
            before = wal.Probe.take(cursor)
        began = time.perf_counter()
        work()
        seconds = time.perf_counter() - began
        wal.settle()
        with connection.cursor() as cursor:
            written = wal.between(cursor, before, wal.Probe.take(cursor))
        return {"seconds": round(seconds, 2), **written.per(n)}

    def run_worker() -> None:
        while True:  # a burst worker may stop in the millisecond before a retry is due
            Worker(
                concurrency=1, batch=args.batch, burst=True, listen_using=None, poll_interval=0.05, scheduler=False
            ).run()
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM workhorse_job WHERE status IN ('queued', 'running')")
                if not cursor.fetchone()[0]:
                    return

    def life(path: str) -> dict[str, Any]:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE workhorse_job, workhorse_worker CASCADE")
            cursor.execute("CHECKPOINT")
        prefix = uuid.uuid4().hex
        job_type = "bench.flaky" if path == "retry" else "bench.noop"
        options: dict[str, Any] = (
            {"retry_policy": RetryPolicy.fixed(timedelta(milliseconds=1))} if path == "retry" else {}
        )

        def enqueue_all() -> None:
            for i in range(n):
                key = {"idempotency": Idempotency(f"{prefix}-{i}", ttl=timedelta(seconds=1))} if path == "keyed" else {}
                enqueue(job_type, PAYLOAD, **options, **key)

        def prune() -> None:
            if path == "keyed":
                prune_expired_bindings()
            prune_finished_jobs(older_than=timedelta(0))

        phases = {"enqueue": measure(enqueue_all), "claim and complete": measure(run_worker)}
        time.sleep(1.0)  # the keys' TTL
        phases["prune"] = measure(prune)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM workhorse_job")
            assert cursor.fetchone()[0] == 0, "prune left jobs behind"
        return phases

    autovacuum(False)
    try:
        results = {path: life(path) for path in args.paths.split(",")}
    finally:
        autovacuum(True)
    env = environment()
    print(json.dumps(env))
    for path, phases in results.items():
        print(f"\n### {path} ({n:,} jobs, batch {args.batch}), per job")
        print("\n| phase | WAL bytes | WAL records | FPI | commits | rows ins/upd(HOT)/del | index entries |")
        print("|---|---|---|---|---|---|---|")
        total = {"wal_bytes": 0.0, "wal_records": 0.0, "index": 0.0}
        for phase, p in phases.items():
            rows = "; ".join(
                f"{t.removeprefix('workhorse_')} {c.get('inserted', 0):g}/{c.get('updated', 0):g}"
                f"({c.get('hot_updated', 0):g})/{c.get('deleted', 0):g}"
                for t, c in p["rows"].items()
            )
            print(
                f"| {phase} | {p['wal_bytes']:,.0f} | {p['wal_records']:.1f} | {p['wal_fpi']:.2f} | "
                f"{p['commits']:.2f} | {rows} | {p['index_entries_total']:.2f} |"
            )
            total["wal_bytes"] += p["wal_bytes"]
            total["wal_records"] += p["wal_records"]
            total["index"] += p["index_entries_total"]
        print(
            f"| **life** | **{total['wal_bytes']:,.0f}** | {total['wal_records']:.1f} | | | | "
            f"**{total['index']:.2f}** |"
        )
        for phase, p in phases.items():
            print(f"\n{phase}: index entries {json.dumps(p['index_entries'])}")
            print(f"{phase}: heap records {json.dumps(p['heap_records'])}")
            print(f"{phase}: WAL bytes by relation {json.dumps(p['wal_bytes_by_relation'])}")
    dump(args.json, {"environment": env, "n": n, "batch": args.batch, "paths": results})


if __name__ == "__main__":
    main()
