"""Enqueue throughput beside the same server's own limits, in one run.

    python benchmarks/enqueue.py [--n 3000] [--batches 20] [--runs 3] [--json out.json]
    python benchmarks/enqueue.py --observability [--runs 10]

``--observability`` measures instead what metrics and tracing cost: each workload with neither,
with metrics, with metrics and every trace, with metrics and one trace in ten, interleaved in
one run (see ``common.observability``).

Uses DATABASE_URL, or the embedded PostgreSQL (database ``workhorse_bench``). Every workload is
measured ``--runs`` times after emptying the tables; the table shows the median and the spread.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import uuid

from common import (
    BENCH_JOBS_DDL,
    PAYLOAD,
    dump,
    environment,
    median_of,
    observability_costs,
    print_table,
    rate,
    reset_tables,
    setup_django,
)

LIMIT_INSERT = "INSERT INTO bench_jobs (payload) VALUES (%s::jsonb)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=3000, help="single enqueues per run")
    parser.add_argument("--batches", type=int, default=20, help="batches of 1,000 per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument(
        "--observability", action="store_true", help="measure enqueue with metrics and tracing off, then on"
    )
    args = parser.parse_args()
    setup_django()

    from django.db import connection, transaction

    from django_workhorse import EnqueueOptions, EnqueueRequest, Idempotency, enqueue, enqueue_many

    n, batches = args.n, args.batches

    def fresh(measure):
        def run() -> float:
            reset_tables()
            return measure()

        return run

    def one_per_txn(keyed: bool, *, atomic: bool = True) -> float:
        prefix = uuid.uuid4().hex
        wrap = transaction.atomic if atomic else contextlib.nullcontext

        def work() -> None:
            for i in range(n):
                with wrap():
                    enqueue("noop", PAYLOAD, idempotency=Idempotency(f"{prefix}{i}") if keyed else None)

        return rate(n, work)

    def replays(in_transaction: bool) -> float:
        key = Idempotency(uuid.uuid4().hex)
        enqueue("noop", PAYLOAD, idempotency=key)

        def work() -> None:
            for _ in range(n):
                if in_transaction:
                    with transaction.atomic():
                        enqueue("noop", PAYLOAD, idempotency=key)
                else:
                    enqueue("noop", PAYLOAD, idempotency=key)

        return rate(n, work)

    def many(keyed: bool) -> float:
        prefix = uuid.uuid4().hex

        def request(b: int, i: int) -> EnqueueRequest:
            key = Idempotency(f"{prefix}-{b}-{i}") if keyed else None
            return EnqueueRequest("noop", PAYLOAD, EnqueueOptions(idempotency=key))

        def work() -> None:
            for b in range(batches):
                with transaction.atomic():
                    enqueue_many([request(b, i) for i in range(1000)])

        return rate(batches * 1000, work)

    if args.observability:
        workloads = {
            "enqueue, unkeyed, 1 per transaction": lambda: one_per_txn(False),
            "enqueue, keyed new, 1 per transaction": lambda: one_per_txn(True),
            "enqueue, keyed replay, 1 per transaction": lambda: replays(True),
            "enqueue_many(1000), keyed": lambda: many(True),
        }
        title = "enqueue (jobs/s) by what is observed; in brackets, the change from off"
        observability_costs(args.runs, {label: fresh(work) for label, work in workloads.items()}, title, args.json)
        return

    raw = connection.connection
    payload_json = json.dumps(PAYLOAD)

    def limit_insert() -> float:
        # Autocommit: one round trip per transaction, as pgbench's one-INSERT script does.
        raw.execute(BENCH_JOBS_DDL)
        raw.commit()
        raw.autocommit = True
        try:
            return rate(n, lambda: [raw.execute(LIMIT_INSERT, (payload_json,)) for _ in range(n)])
        finally:
            raw.autocommit = False

    def limit_insert_in_transaction() -> float:
        # BEGIN, the INSERT and COMMIT as three round trips: what transaction.atomic() around one
        # statement costs on psycopg (it sends BEGIN before the first statement and waits for it).
        raw.execute(BENCH_JOBS_DDL)
        raw.commit()

        def work() -> None:
            for _ in range(n):
                raw.execute(LIMIT_INSERT, (payload_json,))
                raw.commit()

        return rate(n, work)

    def limit_copy() -> float:
        raw.execute(BENCH_JOBS_DDL)
        raw.commit()

        def work() -> None:
            for _ in range(batches):
                with raw.cursor().copy("COPY bench_jobs (payload) FROM STDIN") as copy:
                    for _ in range(1000):
                        copy.write_row((payload_json,))
                raw.commit()

        return rate(batches * 1000, work)

    runs = args.runs
    figures = {
        "enqueue, unkeyed, 1 per transaction": median_of(runs, fresh(lambda: one_per_txn(False))),
        "enqueue, keyed new, 1 per transaction": median_of(runs, fresh(lambda: one_per_txn(True))),
        "enqueue, unkeyed, autocommit": median_of(runs, fresh(lambda: one_per_txn(False, atomic=False))),
        "enqueue, keyed new, autocommit": median_of(runs, fresh(lambda: one_per_txn(True, atomic=False))),
        "enqueue, keyed replay (autocommit)": median_of(runs, fresh(lambda: replays(False))),
        "enqueue, keyed replay, 1 per transaction": median_of(runs, fresh(lambda: replays(True))),
        "enqueue_many(1000), unkeyed": median_of(runs, fresh(lambda: many(False))),
        "enqueue_many(1000), keyed": median_of(runs, fresh(lambda: many(True))),
    }
    connection.ensure_connection()
    raw = connection.connection
    raw.autocommit = False
    limits = {
        "server limit: 1-row INSERT per transaction": median_of(runs, limit_insert),
        "server limit: BEGIN + 1-row INSERT + COMMIT": median_of(runs, limit_insert_in_transaction),
        "server limit: COPY 1000 rows per transaction": median_of(runs, limit_copy),
    }
    raw.execute("DROP TABLE bench_jobs")
    raw.commit()
    env = environment()
    print("\n" + json.dumps(env))
    print_table("enqueue (jobs/s)", [(k, v, "jobs/s") for k, v in figures.items()])
    print_table("server limits (rows/s)", [(k, v, "rows/s") for k, v in limits.items()])
    single, in_transaction, copy = limits.values()
    ratios = {
        "keyed new (atomic) / single INSERT": figures["enqueue, keyed new, 1 per transaction"]["median"]
        / single["median"],
        "keyed new (autocommit) / single INSERT": figures["enqueue, keyed new, autocommit"]["median"]
        / single["median"],
        "keyed new (atomic) / BEGIN + INSERT + COMMIT": figures["enqueue, keyed new, 1 per transaction"]["median"]
        / in_transaction["median"],
        "enqueue_many unkeyed / COPY": figures["enqueue_many(1000), unkeyed"]["median"] / copy["median"],
    }
    print("\n" + "\n".join(f"- {k}: {v:.2f}" for k, v in ratios.items()))
    dump(args.json, {"environment": env, "enqueue": figures, "limits": limits, "ratios": ratios})


if __name__ == "__main__":
    main()
