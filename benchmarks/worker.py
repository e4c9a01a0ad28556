"""Worker throughput and enqueue-to-start latency, in one run.

    python benchmarks/worker.py [--n 10000] [--runs 3] [--samples 200] [--backlog 100000] [--json out.json]
    python benchmarks/worker.py --observability [--runs 10]
    python benchmarks/worker.py --held [--runs 5] [--held-jobs 10000]
    python benchmarks/worker.py --capability [--runs 8]

Throughput: N no-op jobs pre-enqueued, then one burst worker (threads, in this process) until
none is left; jobs/s over the worker's run, median of --runs, for several concurrency/batch
configurations, then again with --backlog finished jobs in the table (the claim must keep using
its partial index). Latency: an idle worker woken by LISTEN/NOTIFY; one job at a time, from the
enqueue's commit returning to the handler starting; p50/p95 over --samples.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from common import (
    dump,
    environment,
    fill,
    median_of,
    observability_costs,
    print_table,
    reset_tables,
    setup_django,
)

CONFIGS = [(1, 1), (1, 10), (1, 50), (4, 50), (8, 50)]  # (concurrency, batch)
# (concurrency, batch, job type): no-op jobs, and jobs whose handler waits 10 ms on I/O (a query,
# an HTTP call) with the concurrency to keep the worker busy.
OBSERVED_CONFIGS = [(1, 10, "bench.noop"), (8, 50, "bench.noop"), (16, 50, "bench.io_10ms")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--backlog", type=int, default=100000)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--observability", action="store_true", help="measure throughput with metrics and tracing off, then on"
    )
    parser.add_argument(
        "--held", action="store_true", help="measure throughput with jobs held by a breaker and a paused queue, vs none"
    )
    parser.add_argument("--held-jobs", type=int, default=10000)
    parser.add_argument(
        "--capability",
        action="store_true",
        help="measure throughput with the claim filtered by the worker's job types vs unfiltered, in alternating pairs",
    )
    args = parser.parse_args()
    setup_django()

    from django.db import connection

    from django_workhorse import enqueue, register
    from django_workhorse.worker import Worker

    register("bench.noop", lambda payload: None)
    register("bench.io_10ms", lambda payload: time.sleep(0.01))  # releases the GIL, as I/O does
    started: dict[int, float] = {}
    register("bench.probe", lambda payload: started.setdefault(payload["i"], time.monotonic()))

    def throughput(
        concurrency: int,
        batch: int,
        backlog: int,
        job_type: str = "bench.noop",
        held: int | None = None,
        due: bool = False,
        filtered: bool = True,
    ) -> float:
        reset_tables()
        queues = ["default"]
        if held is not None:  # None: as ever; 0: the worker also asks for the (unpaused) queue "paused"
            queues.append("paused")
            with connection.cursor() as cursor:
                cursor.execute("TRUNCATE workhorse_queue, workhorse_breaker")
                if held:
                    cursor.execute(HELD_DUE if due else HELD, {"n": held})
                cursor.execute("VACUUM ANALYZE workhorse_job")
        if backlog:
            with connection.cursor() as cursor:
                cursor.execute(BACKLOG, {"n": backlog})
                cursor.execute("VACUUM ANALYZE workhorse_job")
        fill(args.n, job_type)
        kind = Worker if filtered else Unfiltered
        worker = kind(
            queues=queues, concurrency=concurrency, batch=batch, burst=True, listen_using=None, poll_interval=0.05
        )
        began = time.perf_counter()
        stats = worker.run()
        elapsed = time.perf_counter() - began
        assert stats.finished.get("succeeded") == args.n, stats
        return args.n / elapsed

    def latency() -> dict[str, float]:
        reset_tables()
        worker = Worker(concurrency=1, listen_using="default", poll_interval=30)
        thread = threading.Thread(target=worker.run)
        thread.start()
        worker.wait_until_listening(10)
        gaps = []
        for i in range(args.samples + 5):
            time.sleep(0.02 + (i % 7) * 0.01)  # an idle worker between probes, not a synchronisation
            enqueue("bench.probe", {"i": i})
            committed = time.monotonic()
            deadline = committed + 5
            while i not in started and time.monotonic() < deadline:
                time.sleep(0.0002)
            if i >= 5 and i in started:
                gaps.append((started[i] - committed) * 1000)
        worker.stop()
        thread.join(30)
        gaps.sort()
        return {"p50_ms": statistics.median(gaps), "p95_ms": gaps[int(len(gaps) * 0.95) - 1], "samples": len(gaps)}

    def claim_statement_ms(rounds: int) -> dict[bool, float]:
        """The claim statement alone (50 of 10,000 queued no-op jobs, rolled back), filtered or not, alternating."""
        from django.db import transaction

        from django_workhorse import sql
        from django_workhorse.tasks.registry import capabilities

        reset_tables()
        fill(10_000)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE workhorse_job")
        times: dict[bool, list[float]] = {False: [], True: []}
        lease = Worker().lease
        for i in range(rounds * 2):
            filtered = i % 2 == 1
            with transaction.atomic():
                began = time.perf_counter()
                claimed = sql.claims.claim(
                    "default", queues=["default"], limit=50, lease=lease, worker="bench",
                    job_types=capabilities() if filtered else None,
                )  # fmt: skip
                times[filtered].append((time.perf_counter() - began) * 1000)
                assert len(claimed) == 50
                transaction.set_rollback(True)
        return {filtered: statistics.median(values) for filtered, values in times.items()}

    class Unfiltered(Worker):
        """A worker whose claim is the one from before capabilities: no job-type filter."""

        @property
        def job_types(self) -> None:  # type: ignore[override]
            return None

    if args.capability:
        # A project's worth of handlers: the filter's array holds 53 job types, not 3.
        for i in range(50):
            register(f"bench.other_{i:02}", lambda payload: None)
        cap_rows = []
        cap_figures = {}
        for concurrency, batch in CAPABILITY_CONFIGS:
            values: dict[bool, list[float]] = {False: [], True: []}
            for i in range(args.runs):  # alternating, each pair in both orders
                for filtered in (False, True) if i % 2 == 0 else (True, False):
                    values[filtered].append(throughput(concurrency, batch, 0, filtered=filtered))
            ratios = [b / a for a, b in zip(values[False], values[True], strict=True)]
            for filtered, label in ((False, "unfiltered (before)"), (True, "filtered by 53 job types")):
                row = f"concurrency {concurrency}, batch {batch}, {label}"
                cap_figures[row] = {
                    "median": statistics.median(values[filtered]), "min": min(values[filtered]),
                    "max": max(values[filtered]),
                }  # fmt: skip
                cap_rows.append((row, cap_figures[row], "jobs/s"))
            print(
                f"concurrency {concurrency}, batch {batch}: filtered/unfiltered pair ratios "
                f"{', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}"
            )
        claim_ms = claim_statement_ms(400)
        for filtered, label in ((False, "unfiltered (before)"), (True, "filtered by 53 job types")):
            print(f"one claim of 50 ({label}): median {claim_ms[filtered]:.3f} ms over 400, alternating")
        print("\n" + str(environment()))
        print_table(f"worker throughput ({args.n:,} no-op jobs), claim filtered by job type or not", cap_rows)
        dump(args.json, {"environment": environment(), "throughput": cap_figures, "claim_ms": claim_ms})
        return

    if args.held:
        held_rows = []
        held_figures = {}
        for concurrency, batch in HELD_CONFIGS:
            values: dict[str, list[float]] = {"none": [], "held": [], "due": []}
            for _ in range(args.runs):
                values["none"].append(throughput(concurrency, batch, 0, held=0))
                values["held"].append(throughput(concurrency, batch, 0, held=args.held_jobs))
                values["due"].append(throughput(concurrency, batch, 0, held=args.held_jobs, due=True))
            n = f"{args.held_jobs:,}"
            cases = (
                ("none", "nothing held"),
                ("held", f"{n} held + {n} paused"),
                ("due", f"{n} due behind the open breaker (held as met) + {n} paused"),
            )
            for case, label in cases:
                row = f"concurrency {concurrency}, batch {batch}, {label}"
                held_figures[row] = {
                    "median": statistics.median(values[case]), "min": min(values[case]), "max": max(values[case])
                }  # fmt: skip
                held_rows.append((row, held_figures[row], "jobs/s"))
            for case in ("held", "due"):
                change = statistics.median(values[case]) / statistics.median(values["none"]) - 1
                print(f"concurrency {concurrency}, batch {batch}, {case}: {change:+.1%} against nothing held")
        print("\n" + str(environment()))
        print_table(f"worker throughput ({args.n:,} no-op jobs) beside held and paused jobs", held_rows)
        dump(args.json, {"environment": environment(), "throughput": held_figures})
        return

    if args.observability:
        workloads = {
            f"{'no-op' if t == 'bench.noop' else '10 ms of I/O'} handler, concurrency {c}, batch {b}": (
                lambda c=c, b=b, t=t: throughput(
                    c, b, 0, t
                )  # enqueued in the mode measured: traced jobs carry contexts
            )
            for c, b, t in OBSERVED_CONFIGS
        }
        title = "worker throughput (jobs/s) by what is observed; in brackets, the change from off"
        observability_costs(args.runs, workloads, title, args.json)
        return

    rows = []
    figures = {}
    for concurrency, batch in CONFIGS:
        label = f"concurrency {concurrency}, batch {batch}"
        figures[label] = median_of(args.runs, lambda c=concurrency, b=batch: throughput(c, b, 0))
        rows.append((label, figures[label], "jobs/s"))
    best = max(figures, key=lambda k: figures[k]["median"])
    concurrency, batch = CONFIGS[list(figures).index(best)]
    label = f"{best}, {args.backlog:,} finished jobs in the table"
    figures[label] = median_of(args.runs, lambda: throughput(concurrency, batch, args.backlog))
    rows.append((label, figures[label], "jobs/s"))
    lat = latency()
    print("\n" + str(environment()))
    print_table(f"worker throughput ({args.n:,} no-op jobs)", rows)
    print(
        f"\nenqueue-to-start latency (idle worker, LISTEN/NOTIFY): p50 {lat['p50_ms']:.2f} ms, "
        f"p95 {lat['p95_ms']:.2f} ms over {lat['samples']} samples"
    )
    dump(args.json, {"environment": environment(), "throughput": figures, "latency": lat})


HELD_CONFIGS = [(1, 10), (8, 50)]
CAPABILITY_CONFIGS = [(1, 10), (8, 50)]
# --held: n jobs of queue "default" held behind an open breaker (as a claim leaves them: run_at at
# the breaker's open_until, held_since set) and n due jobs of the paused queue "paused".
HELD = """
WITH breaker AS (
    INSERT INTO workhorse_breaker (key, state, recent_failures, opened_at, open_until, cooldown, probes,
                                   probes_admitted, policy, transitions, changed_at)
    VALUES ('bench:provider', 'open', '[]', now(), now() + interval '1 hour', interval '1 hour', 1, 0,
            '{}', '[]', now())
),
paused AS (
    INSERT INTO workhorse_queue (queue, paused, changed_at, changed_by) VALUES ('paused', true, now(), 'bench')
),
held AS (
    INSERT INTO workhorse_job (job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
                               retry_policy, tags, created_at, last_error, breaker_key, held_since)
    SELECT 'bench.held', 'default', '{}', 'queued', 0, now() + interval '1 hour', 0, 25, '{}', '[]', now(),
           '', 'bench:provider', now()
    FROM generate_series(1, %(n)s)
)
INSERT INTO workhorse_job (job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
                           retry_policy, tags, created_at, last_error)
SELECT 'bench.noop', 'paused', '{}', 'queued', 0, now(), 0, 25, '{}', '[]', now(), ''
FROM generate_series(1, %(n)s)
"""

# --held, third case: the same, but the breaker's jobs are due and not held yet (the breaker opened
# while they waited): the claims meet them first, in claim order, and hold each once.
HELD_DUE = HELD.replace(
    "now() + interval '1 hour', 0, 25, '{}', '[]', now(),\n           '', 'bench:provider', now()",
    "now() - interval '1 second', 0, 25, '{}', '[]', now(),\n           '', 'bench:provider', NULL",
)
assert HELD_DUE != HELD

BACKLOG = """
INSERT INTO workhorse_job (job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
                           retry_policy, tags, created_at, finished_at, last_error)
SELECT 'bench.noop', 'default', '{}', 'succeeded', 0, now(), 1, 25, '{}', '[]', now(), now(), ''
FROM generate_series(1, %(n)s)
"""

if __name__ == "__main__":
    main()
