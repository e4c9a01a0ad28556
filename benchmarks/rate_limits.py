"""Rate limits at claim: what a saturated limit costs other work, and how close a limit is reached.

    python benchmarks/rate_limits.py [--n 10000] [--runs 3] [--deferred 50000] [--json out.json]
    python benchmarks/rate_limits.py --accuracy [--rate 1000] [--seconds 10] [--bursts 0,10,50]

Cost (the default): throughput of one burst worker (threads, in this process) over --n no-op jobs
without a rate limit, (a) alone in the table, (b) beside --deferred jobs already held behind a
saturated limit (their slots in the future, as claims leave them), and (c) beside --deferred jobs
of that limit due and not held yet, that the worker's claims meet first and hold once each;
median of --runs.

Accuracy: a limit of --rate starts per second (with each burst of --bursts), 2 worker processes
(8 threads, batch 50 each) over rate x seconds jobs. Every start's instant is the one its claim
counted (started_at, PostgreSQL's clock): the most starts in any window of one second (never
more than rate + burst: accuracy) and the rate reached from the first start to the last (rate
x seconds - burst - 1 starts over that span: utilisation). The handlers' own starts (time.time()
when each handler began, its result) get the same window count: a job admitted ahead of its instant
waits for it on its executor, so the calls made never come earlier than the starts counted.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from common import PAYLOAD, dump, environment, print_table, reset_tables, setup_django

SATURATED = "bench.saturated"
API = "bench.api"
DATABASE = "workhorse_bench"


def limits(rate: int = 1000, burst: int = 0) -> dict[str, object]:
    from django_workhorse import RateLimit

    return {
        SATURATED: RateLimit(1, per=timedelta(hours=1)),
        API: RateLimit(rate, per=timedelta(seconds=1), burst=burst),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--deferred", type=int, default=50000)
    parser.add_argument("--accuracy", action="store_true")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--bursts", default="0,10,50")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a worker process of --accuracy
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.worker is not None:
        return work(args.rate, int(args.worker))
    setup_django(DATABASE)
    from django.conf import settings

    settings.WORKHORSE_RATE_LIMITS = limits(args.rate)
    if args.accuracy:
        return accuracy(args)
    return cost(args)


def cost(args: argparse.Namespace) -> None:
    from django.db import connection

    from django_workhorse import EnqueueRequest, enqueue_many, register
    from django_workhorse.worker import Worker

    register("bench.noop", lambda payload: None)

    def throughput(case: str) -> float:
        reset_tables()
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE workhorse_rate_budget")
            if case != "alone":
                cursor.execute(DEFERRED if case == "held" else DUE, {"n": args.deferred, "name": SATURATED})
            cursor.execute("VACUUM ANALYZE workhorse_job")
        for start in range(0, args.n, 1000):
            enqueue_many([EnqueueRequest("bench.noop", PAYLOAD) for _ in range(min(1000, args.n - start))])
        worker = Worker(concurrency=8, batch=50, burst=True, listen_using=None, poll_interval=0.05)
        began = time.perf_counter()
        stats = worker.run()
        elapsed = time.perf_counter() - began
        assert stats.finished.get("succeeded") == args.n, stats
        return args.n / elapsed

    values: dict[str, list[float]] = {"alone": [], "held": [], "due": []}
    for _ in range(args.runs):
        for case in values:
            values[case].append(throughput(case))
    n = f"{args.deferred:,}"
    labels = {
        "alone": "nothing else in the table",
        "held": f"{n} jobs deferred behind a saturated limit (held)",
        "due": f"{n} jobs of a saturated limit due, held by these claims as met",
    }
    rows, figures = [], {}
    for case, label in labels.items():
        figures[label] = {"median": statistics.median(values[case]), "min": min(values[case]), "max": max(values[case])}
        rows.append((label, figures[label], "jobs/s"))
    for case in ("held", "due"):
        change = statistics.median(values[case]) / statistics.median(values["alone"]) - 1
        print(f"{case}: {change:+.1%} against nothing else in the table")
    print("\n" + str(environment()))
    print_table(f"worker throughput ({args.n:,} unlimited no-op jobs, concurrency 8, batch 50)", rows)
    dump(args.json, {"environment": environment(), "throughput": figures})


def accuracy(args: argparse.Namespace) -> None:
    from django.db import connection

    from django_workhorse import EnqueueOptions, EnqueueRequest, enqueue_many
    from django_workhorse.models import Job, JobStatus

    results = {}
    for burst in [int(b) for b in args.bursts.split(",")]:
        reset_tables()
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE workhorse_rate_budget")
        total = args.rate * args.seconds
        options = EnqueueOptions(rate_limit=API)
        for start in range(0, total, 1000):
            enqueue_many([EnqueueRequest("bench.noop", PAYLOAD, options) for _ in range(min(1000, total - start))])
        env = {**os.environ, "BENCH_RATE_BURST": str(burst)}
        command = [sys.executable, str(Path(__file__).resolve()), "--rate", str(args.rate), "--worker"]
        workers = [subprocess.Popen([*command, str(i)], env=env) for i in range(2)]
        deadline = time.monotonic() + args.seconds * 5 + 60
        while Job.objects.filter(status=JobStatus.SUCCEEDED).count() < total and time.monotonic() < deadline:
            time.sleep(0.5)
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(60)
        with connection.cursor() as cursor:
            cursor.execute(WINDOWS)
            most, span, starts, attempts = cursor.fetchone()
            cursor.execute(HANDLER_WINDOWS)
            most_called = cursor.fetchone()[0]
        reached = (starts - burst - 1) / span
        results[f"burst {burst}"] = {
            "starts": starts, "attempts": attempts, "span_s": span, "most_in_1s": most, "bound": args.rate + burst,
            "most_handler_starts_in_1s": most_called,
            "rate_reached": reached, "utilisation": reached / args.rate,
        }  # fmt: skip
        print(
            f"limit {args.rate}/s, burst {burst}: {starts} starts ({attempts} attempts) in {span:.2f} s; "
            f"most in any 1 s window {most} (bound {args.rate + burst}; handlers' own starts {most_called}); "
            f"reached {reached:,.0f}/s "
            f"({reached / args.rate:.1%})"
        )
    print("\n" + str(environment()))
    dump(args.json, {"environment": environment(), "accuracy": results})


def work(rate: int, index: int) -> None:
    """One worker process of --accuracy: 8 threads, batch 50, until SIGTERM (Worker.run stops on it)."""
    setup_django(DATABASE, migrate=False)  # the parent did; two migrating at once collide
    from django.conf import settings

    settings.WORKHORSE_RATE_LIMITS = limits(rate, int(os.environ["BENCH_RATE_BURST"]))
    from django_workhorse import register
    from django_workhorse.worker import Worker

    register("bench.noop", lambda payload: time.time())  # when the handler began, as its result
    worker = Worker(concurrency=8, batch=50, listen_using=None, poll_interval=0.05, name=f"bench-rate-{index}")
    worker.run()


# Deferred jobs as claims leave them behind a saturated limit: held, each at its own slot (an hour
# apart: 1 per hour), the budget spent and its reservation tail past the last of them.
DEFERRED = """
WITH budget AS (
    INSERT INTO workhorse_rate_budget (name, partition, tat, reserved_until, granted, admitted, deferred, changed_at)
    VALUES (%(name)s, '', now() + interval '1 hour', now() + (%(n)s + 1) * interval '1 hour', 0, 1, %(n)s, now())
)
INSERT INTO workhorse_job (job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
                           retry_policy, tags, created_at, last_error, rate_limit, held_since)
SELECT 'bench.noop', 'default', '{}', 'queued', 0, now() + i * interval '1 hour', 0, 25, '{}', '[]', now(), '',
       %(name)s, now()
FROM generate_series(1, %(n)s) AS i
"""

# The same jobs due now and not held yet (enqueued while the limit was spent elsewhere): ahead of
# the unlimited ones in claim order, so the first claims meet and hold them, one write each.
DUE = """
WITH budget AS (
    INSERT INTO workhorse_rate_budget (name, partition, tat, reserved_until, granted, admitted, deferred, changed_at)
    VALUES (%(name)s, '', now() + interval '1 hour', now() + interval '1 hour', 0, 1, 0, now())
)
INSERT INTO workhorse_job (job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
                           retry_policy, tags, created_at, last_error, rate_limit)
SELECT 'bench.noop', 'default', '{}', 'queued', 0, now() - interval '1 second', 0, 25, '{}', '[]', now(), '',
       %(name)s
FROM generate_series(1, %(n)s)
"""

# The most starts in any window [t, t + 1 s) that begins at a start; the span from the first start
# to the last, in seconds; how many jobs started, and their attempts (one each: holds cost none).
WINDOWS = """
WITH starts AS (SELECT started_at FROM workhorse_job WHERE status = 'succeeded')
SELECT (SELECT max(n) FROM (SELECT (SELECT count(*) FROM starts AS later
                                    WHERE later.started_at >= s.started_at
                                      AND later.started_at < s.started_at + interval '1 second') AS n
                            FROM starts AS s) AS windows),
       extract(epoch FROM max(started_at) - min(started_at))::float8,
       count(*), (SELECT sum(attempt) FROM workhorse_job WHERE status = 'succeeded')
FROM starts
"""

# The same count over the instants the handlers began (their results, time.time()).
HANDLER_WINDOWS = """
WITH starts AS (SELECT to_timestamp((result #>> '{}')::float8) AS started_at FROM workhorse_job
                WHERE status = 'succeeded')
SELECT max(n) FROM (SELECT (SELECT count(*) FROM starts AS later
                            WHERE later.started_at >= s.started_at
                              AND later.started_at < s.started_at + interval '1 second') AS n
                    FROM starts AS s) AS windows
"""

if __name__ == "__main__":
    main()
