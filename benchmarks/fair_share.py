"""Fair queues: what a fair claim costs, and what a big tenant's backlog does to a small tenant's wait.

    python benchmarks/fair_share.py [--keys 1000] [--per-key 20] [--claims 200] [--runs 5]
                                    [--probes 100] [--backlog 20000] [--json out.json]
    python benchmarks/fair_share.py --waits-only --wait-batch 1

Claim cost: --keys partition keys with --per-key ready jobs each, in a queue declared fair, then
the same jobs in an unfair queue; a claim of 50 (sql.claims.claim, as a worker calls it, its
cursor carried from claim to claim) repeated --claims times, each committed; milliseconds per
claim, median of --runs, the two alternated. Then a burst worker of 8 threads, batch 50, drains
each (jobs/s).

Small tenant's wait: one worker of 8 threads, batch 8, jobs of 10 ms (I/O-like), LISTEN/NOTIFY on.
Tenant B enqueues --probes jobs one at a time, 15 ms apart; its wait is started_at - run_at on the
server's clock; p50/p95. Without a backlog (an idle worker); with tenant A's --backlog / 10 jobs
queued ahead in the fair queue (enough to keep the worker busy while B enqueues), and --backlog;
and in an unfair queue (the control, with --backlog / 5 jobs so that it drains in seconds). Each
case --runs times, interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from common import alternating, dump, environment, reset_tables, setup_django

FAIR, PLAIN = "fair", "plain"

# --keys x --per-key ready jobs of one queue, every key's jobs interleaved in run_at order.
FILL = """
INSERT INTO workhorse_job (job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
                           retry_policy, tags, created_at, last_error, partition_key)
SELECT %(job_type)s, %(queue)s, '{}', 'queued', 0, now() - interval '1 hour' + n * interval '1 microsecond', 0, 25,
       '{}', '[]', now(), '', %(prefix)s || lpad((n %% %(keys)s)::text, 5, '0')
FROM generate_series(1, %(n)s) AS n
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--per-key", type=int, default=20)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--backlog", type=int, default=20000)
    parser.add_argument("--wait-batch", type=int, default=8, help="the batch of the worker in the wait cases")
    parser.add_argument("--waits-only", action="store_true", help="measure the small tenant's wait only")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    setup_django()

    from datetime import timedelta

    from django.db import connection
    from django.test.utils import override_settings

    from django_workhorse import EnqueueOptions, enqueue, register, sql
    from django_workhorse.admission.fair import FairCursors
    from django_workhorse.models import Job
    from django_workhorse.worker import Worker

    override_settings(WORKHORSE_QUEUES={FAIR: {"fair": True}}).enable()
    register("bench.noop", lambda payload: None)
    register("bench.io_10ms", lambda payload: time.sleep(0.01))  # releases the GIL, as I/O does

    def fill(queue: str, n: int, keys: int, prefix: str = "acct_", job_type: str = "bench.noop") -> None:
        with connection.cursor() as cursor:
            cursor.execute(FILL, {"queue": queue, "n": n, "keys": keys, "prefix": prefix, "job_type": job_type})
            cursor.execute("VACUUM ANALYZE workhorse_job")

    def claim_cost(queue: str) -> float:
        """Milliseconds per claim of 50, over --claims claims."""
        reset_tables()
        fill(queue, args.keys * args.per_key, args.keys)
        cursors = FairCursors([queue] if queue == FAIR else [])
        lease = timedelta(seconds=30)
        began = time.perf_counter()
        for _ in range(args.claims):
            reads = cursors.reads()
            queues = [] if queue == FAIR else [queue]
            jobs = sql.claims.claim("default", queues=queues, limit=50, lease=lease, worker="bench", fair_queues=reads)
            cursors.advance(reads, jobs)
            assert len(jobs) >= 49, len(jobs)  # 49 when it also looked for unkeyed jobs (none here)
        return (time.perf_counter() - began) * 1000 / args.claims

    def drain(queue: str) -> float:
        reset_tables()
        n = args.keys * args.per_key
        fill(queue, n, args.keys)
        worker = Worker(queues=[queue], concurrency=8, batch=50, burst=True, listen_using=None, poll_interval=0.05)
        began = time.perf_counter()
        stats = worker.run()
        assert stats.finished.get("succeeded") == n, stats
        return n / (time.perf_counter() - began)

    def small_tenant_wait(queue: str, backlog: int) -> dict[str, float]:
        reset_tables()
        if backlog:
            fill(queue, backlog, 1, prefix="tenant-a", job_type="bench.io_10ms")
        worker = Worker(queues=[queue], concurrency=8, batch=args.wait_batch, listen_using="default", poll_interval=1.0)
        # The profile: every claim the worker makes (when it began, how long it took, what it took).
        claims: list[tuple[float, float, list[int]]] = []
        real_claim = sql.claims.claim

        def timed_claim(*a: object, **k: object) -> object:
            began = time.perf_counter()
            jobs = real_claim(*a, **k)  # type: ignore[arg-type]
            claims.append((began, time.perf_counter() - began, [job.id for job in jobs]))
            return jobs

        sql.claims.claim = timed_claim  # type: ignore[assignment]
        thread = threading.Thread(target=worker.run)
        thread.start()
        worker.wait_until_listening(10)
        options = EnqueueOptions(queue=queue, partition_key="tenant-b")
        ids = []
        committed: dict[int, float] = {}
        for _ in range(args.probes):
            ids.append(enqueue("bench.io_10ms", {}, options))
            committed[ids[-1]] = time.perf_counter()
            time.sleep(0.015)  # the small tenant's pace, not a synchronisation
        deadline = time.monotonic() + 120
        while Job.objects.filter(pk__in=ids, started_at__isnull=True).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.stop()
        thread.join(60)
        sql.claims.claim = real_claim  # type: ignore[assignment]
        waits = sorted(
            (job.started_at - job.run_at).total_seconds() * 1000
            for job in Job.objects.filter(pk__in=ids).only("started_at", "run_at")
        )
        # Where B's wait went: from its commit to the start of the claim that took it (the worker
        # busy, or between claims), and that claim's own round trip.
        taken = {job_id: (began, took) for began, took, jobs in claims for job_id in jobs}
        before = sorted(max(0.0, taken[i][0] - committed[i]) * 1000 for i in ids if i in taken)
        during = sorted(taken[i][1] * 1000 for i in ids if i in taken)
        return {
            "p50_ms": statistics.median(waits), "p95_ms": waits[int(len(waits) * 0.95) - 1],
            "until_claim_p50_ms": statistics.median(before), "until_claim_p95_ms": before[int(len(before) * 0.95) - 1],
            "claim_p50_ms": statistics.median(during), "claim_p95_ms": during[int(len(during) * 0.95) - 1],
            "claims": len(claims),
        }  # fmt: skip

    def claim_costs() -> dict[str, object]:
        costs = alternating(args.runs, {"unfair": lambda: claim_cost(PLAIN), "fair": lambda: claim_cost(FAIR)})
        ratio = costs["fair"]["median"] / costs["unfair"]["median"]
        print(f"\n### Claim of 50 with {args.keys:,} partition keys x {args.per_key} jobs\n")
        print("| queue | ms per claim: median | [min-max] |\n|---|---|---|")
        for label, figures in costs.items():
            print(f"| {label} | **{figures['median']:.2f}** | [{figures['min']:.2f}-{figures['max']:.2f}] |")
        print(f"\nfair / unfair: **{ratio:.2f}x** (target <= 1.5x)")
        drains = alternating(max(args.runs // 2, 1), {"unfair": lambda: drain(PLAIN), "fair": lambda: drain(FAIR)})
        print("\n| queue | burst worker 8 threads, batch 50: jobs/s | [min-max] |\n|---|---|---|")
        for label, figures in drains.items():
            print(f"| {label} | **{figures['median']:,.0f}** | [{figures['min']:,.0f}-{figures['max']:,.0f}] |")
        return {"claim_ms": costs, "claim_ratio": ratio, "drain_jobs_per_s": drains}

    def small_tenant_waits() -> dict[str, object]:
        cases = {
            "fair, no backlog (an idle worker)": (FAIR, 0),
            f"fair, tenant A's {args.backlog // 10:,} queued ahead (the worker busy all along)": (
                FAIR,
                args.backlog // 10,
            ),
            f"fair, tenant A's {args.backlog:,} queued ahead": (FAIR, args.backlog),
            f"unfair (control), tenant A's {args.backlog // 5:,} queued ahead": (PLAIN, args.backlog // 5),
        }
        waits: dict[str, list[dict[str, float]]] = {label: [] for label in cases}
        for _ in range(args.runs):
            for label, (queue, backlog) in cases.items():
                waits[label].append(small_tenant_wait(queue, backlog))
        print(
            f"\n### Tenant B's wait ({args.probes} jobs, 15 ms apart; 8 threads, batch {args.wait_batch}, jobs of 10 ms)\n"
        )
        print(
            "| case | p50 ms (median of runs) | p95 ms (median of runs) | p95 [min-max] "
            "| until the claim p50 / p95 | the claim p50 / p95 |\n|---|---|---|---|---|---|"
        )
        summary = {}
        for label, runs in waits.items():
            p50 = statistics.median(run["p50_ms"] for run in runs)
            p95s = [run["p95_ms"] for run in runs]
            parts = {
                part: statistics.median(run[part] for run in runs)
                for part in ("until_claim_p50_ms", "until_claim_p95_ms", "claim_p50_ms", "claim_p95_ms")
            }
            summary[label] = {
                "p50_ms": p50,
                "p95_ms": statistics.median(p95s),
                "p95_min": min(p95s),
                "p95_max": max(p95s),
                **parts,
            }
            print(
                f"| {label} | {p50:,.1f} | **{statistics.median(p95s):,.1f}** | [{min(p95s):,.1f}-{max(p95s):,.1f}] "
                f"| {parts['until_claim_p50_ms']:,.1f} / {parts['until_claim_p95_ms']:,.1f} "
                f"| {parts['claim_p50_ms']:,.1f} / {parts['claim_p95_ms']:,.1f} |"
            )
        idle, small, big = (summary[label]["p95_ms"] for label in list(cases)[:3])
        print(f"\np95 with the big backlog / with none (fair): **{big / idle:.2f}x** (target <= 2x)")
        print(f"p95 with the big backlog / with one a tenth as deep (fair): **{big / small:.2f}x**")
        return {"waits": summary, "wait_ratio_idle": big / idle, "wait_ratio_busy": big / small}

    report: dict[str, object] = {"environment": environment(), "args": vars(args)}
    if not args.waits_only:
        report.update(claim_costs())
    report.update(small_tenant_waits())
    dump(args.json, report)


if __name__ == "__main__":
    main()
