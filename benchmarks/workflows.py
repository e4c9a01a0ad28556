"""Workflows beside plain jobs, in one run: enqueue of a 1,000-step graph, and its execution.

    python benchmarks/workflows.py [--steps 1000] [--runs 5] [--json out.json]

Measured in one run, alternating, each on emptied tables:

- enqueue: one ``Workflow.enqueue()`` of a fan-out/fan-in of ``--steps`` steps (a source, the
  middle, a sink: 2 x (steps - 2) edges), keyed and unkeyed, against ``enqueue_many`` of the same
  number of plain jobs, each in its own transaction, timed whole (building the requests included);
- execution: one burst worker (8 threads, batch 50, in this process) running that workflow to the
  sink against the same worker running as many independent no-op jobs; jobs/s over the worker's run;
- a chain of 100 steps: each step released by its parent's recording (steps/s: one hop each).

Uses DATABASE_URL, or the embedded PostgreSQL (database ``workhorse_bench``).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from common import PAYLOAD, dump, environment, print_table, reset_tables, setup_django

CONCURRENCY, BATCH = 8, 50


def fan(steps: int, key: str | None) -> Any:
    """A source, ``steps - 2`` middle steps after it, and a sink after all of them."""
    from django_workhorse import EnqueueRequest, Idempotency
    from django_workhorse.workflows import Workflow

    wf = Workflow("bench fan", idempotency=None if key is None else Idempotency(key))
    wf.add("source", EnqueueRequest("bench.noop", PAYLOAD))
    middle = [wf.add(f"m{n}", EnqueueRequest("bench.noop", PAYLOAD), after=["source"]) for n in range(steps - 2)]
    wf.add("sink", EnqueueRequest("bench.noop", PAYLOAD), after=middle)
    return wf


def chain_of(steps: int) -> Any:
    from django_workhorse import EnqueueRequest
    from django_workhorse.workflows import Workflow

    wf = Workflow("bench chain")
    previous = None
    for n in range(steps):
        previous = wf.add(f"s{n}", EnqueueRequest("bench.noop", PAYLOAD), after=[] if previous is None else [previous])
    return wf


def timed(work: Callable[[], Any]) -> float:
    """Seconds ``work`` takes inside its own transaction, commit included."""
    from django.db import transaction

    start = time.perf_counter()
    with transaction.atomic():
        work()
    return time.perf_counter() - start


def run_worker() -> tuple[float, int]:
    from django_workhorse.worker import Worker

    worker = Worker(concurrency=CONCURRENCY, batch=BATCH, burst=True, listen_using=None, poll_interval=0.01)
    began = time.perf_counter()
    stats = worker.run()
    return time.perf_counter() - began, stats.finished.get("succeeded", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    setup_django()

    from django_workhorse import EnqueueRequest, enqueue_many, register

    register("bench.noop", lambda payload: None)
    n = args.steps
    samples: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    for _ in range(args.runs):
        reset_tables()
        add("enqueue_many, plain jobs", timed(lambda: enqueue_many([EnqueueRequest("bench.noop", PAYLOAD)] * n)))
        reset_tables()
        add("workflow, unkeyed", timed(lambda: fan(n, None).enqueue()))
        reset_tables()
        add("workflow, keyed (new key)", timed(lambda: fan(n, uuid.uuid4().hex).enqueue()))
        key = uuid.uuid4().hex
        timed(lambda key=key: fan(n, key).enqueue())
        add("workflow, keyed replay", timed(lambda key=key: fan(n, key).enqueue()))

        reset_tables()
        enqueue_many([EnqueueRequest("bench.noop", PAYLOAD)] * n)
        seconds, done = run_worker()
        assert done == n, done
        add("run: independent jobs", n / seconds)
        reset_tables()
        timed(lambda: fan(n, None).enqueue())
        seconds, done = run_worker()
        assert done == n, done
        add("run: fan-out/fan-in", n / seconds)
        reset_tables()
        timed(lambda: chain_of(100).enqueue())
        seconds, done = run_worker()
        assert done == 100, done
        add("run: chain of 100", 100 / seconds)

    figures = {
        name: {"median": statistics.median(values), "min": min(values), "max": max(values)}
        for name, values in samples.items()
    }
    ratio = figures["run: fan-out/fan-in"]["median"] / figures["run: independent jobs"]["median"]
    print(f"{n} steps, {args.runs} runs; worker: {CONCURRENCY} threads, batch {BATCH}")
    print_table(
        "Enqueue (one transaction each)",
        [
            (name, {k: v * 1000 for k, v in figure.items()}, "ms")
            for name, figure in figures.items()
            if "run:" not in name
        ],
    )
    print_table("Execution", [(name, figure, "jobs/s") for name, figure in figures.items() if "run:" in name])
    print(f"\nfan-out/fan-in ÷ independent jobs: {ratio:.2f}x")
    dump(args.json, {"environment": environment(), "steps": n, "runs": args.runs, "figures": figures, "ratio": ratio})


if __name__ == "__main__":
    main()
