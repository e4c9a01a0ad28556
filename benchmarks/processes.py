"""CPU-bound jobs on processes vs threads (issue 28): ``--processes 2 --concurrency 1`` against
``--processes 1 --concurrency 2``, the same jobs each time.

Each job runs a pure-Python loop calibrated to take about ``--work-ms`` milliseconds on this machine,
holding the interpreter lock the whole time: threads of one process take turns, child processes run
side by side. Throughput is the jobs started and finished while every process ran (start-up and
the last stragglers are left out: ``steady_rate``), for ``--rounds`` alternating rounds.

    python benchmarks/processes.py [--jobs 400] [--work-ms 20] [--rounds 2]

On ``DATABASE_URL`` or the embedded PostgreSQL (database ``workhorse_bench_processes``). The worker
runs as ``python benchmarks/processes.py --worker <workhorse_worker options>``: the supervisor starts
its children with that same command line.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, reset_tables, setup_django  # noqa: E402

DATABASE = "workhorse_bench_processes"
JOB_TYPE = "bench.cpu"
CONFIGURATIONS = {
    "processes 2 x concurrency 1": ["--processes", "2", "--concurrency", "1"],
    "processes 1 x concurrency 2": ["--processes", "1", "--concurrency", "2"],
}


def spin(iterations: int) -> int:
    """The CPU-bound work: a pure-Python loop (it holds the interpreter lock throughout)."""
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def calibrate(work_ms: float) -> int:
    """How many iterations of ``spin`` take ``work_ms`` milliseconds here (best of five)."""
    trial = 200_000
    best = min(_timed(trial) for _ in range(5))
    return max(int(trial * work_ms / 1000 / best), 1)


def _timed(iterations: int) -> float:
    began = time.perf_counter()
    spin(iterations)
    return time.perf_counter() - began


def run_worker(argv: list[str]) -> None:
    """The worker side: register the handler, run ``workhorse_worker`` with ``argv``."""
    setup_django(DATABASE, migrate=False)
    from django.core.management import call_command

    from django_workhorse.tasks.registry import register

    register(JOB_TYPE, lambda payload: spin(payload["iterations"]))
    call_command("workhorse_worker", *argv)


def measure(jobs: int, iterations: int, options: list[str]) -> float:
    """Enqueue ``jobs`` jobs, run a burst worker with ``options``; return jobs per second while every
    process ran (see ``steady_rate``)."""
    from django_workhorse import EnqueueRequest, enqueue_many
    from django_workhorse.models import Job, JobStatus

    reset_tables()
    enqueue_many([EnqueueRequest(JOB_TYPE, {"iterations": iterations}) for _ in range(jobs)])
    command = [sys.executable, __file__, "--worker", "--burst", "--no-scheduler", "--listen-database", "none"]
    subprocess.run([*command, "--poll-interval", "0.05", "-v", "0", *options], check=True)
    done = Job.objects.filter(status=JobStatus.SUCCEEDED)
    assert done.count() == jobs, f"{done.count()} of {jobs} jobs succeeded"
    return steady_rate(list(done.values_list("claimed_by", "started_at", "finished_at")))


def steady_rate(runs: list[tuple[str, datetime, datetime]]) -> float:
    """Jobs per second over the span in which every worker process was running jobs: from the
    latest of their first starts to the earliest of their last finishes. A child that starts a
    second later than its sibling (importing Django takes CPU from the other) or runs out of work
    first would otherwise count as the steady state."""
    by_worker: dict[str, list[tuple[datetime, datetime]]] = {}
    for worker, started, finished in runs:
        by_worker.setdefault(worker, []).append((started, finished))
    begin = max(min(s for s, _ in spans) for spans in by_worker.values())
    end = min(max(f for _, f in spans) for spans in by_worker.values())
    inside = sum(1 for _, started, finished in runs if started >= begin and finished <= end)
    return inside / (end - begin).total_seconds()


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        run_worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--work-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    setup_django(DATABASE)
    iterations = calibrate(args.work_ms)
    print(environment())
    print(f"{args.jobs} jobs of {iterations} iterations (~{args.work_ms:g} ms each), {args.rounds} round(s)")
    rates: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    for _ in range(args.rounds):
        for name, options in CONFIGURATIONS.items():
            rates[name].append(measure(args.jobs, iterations, options))
            print(f"  {name}: {rates[name][-1]:.1f} jobs/s")
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, value in medians.items():
        print(f"{name}: median {value:.1f} jobs/s")
    processes, threads = medians.values()
    print(f"processes / threads: {processes / threads:.2f}x")


if __name__ == "__main__":
    main()
