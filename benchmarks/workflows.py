"""Workflows beside plain jobs, in one run: enqueue of a 1,000-step graph, its execution, and the
wake-up of a wait on a job's result.

    python benchmarks/workflows.py [--steps 1000] [--runs 5] [--waits 200] [--json out.json]
    python benchmarks/workflows.py --plain-only [--code DIR] [--runs 5]
    python benchmarks/workflows.py --state-counts [--live 1000,10000] [--runs 5]

Measured in one run, alternating, each on emptied tables:

- enqueue: one ``Workflow.enqueue()`` of a fan-out/fan-in of ``--steps`` steps (a source, the
  middle, a sink: 2 x (steps - 2) edges), keyed and unkeyed, against ``enqueue_many`` of the same
  number of plain jobs, each in its own transaction, timed whole (building the requests included);
- execution: one burst worker (8 threads, batch 50, in this process) running that workflow to the
  sink against the same worker running as many independent no-op jobs; jobs/s over the worker's run;
- a chain of 100 steps: each step released by its parent's recording (steps/s: one hop each);
- wait: ``--waits`` times, one no-op job enqueued and ``wait_for`` it while an idle worker (one
  thread, woken by LISTEN) runs it; the wake-up is the time from its outcome's commit (the
  recording statement returning, in the worker's thread) to ``wait_for`` returning, p50/p95; and
  how many waits the result notification woke (the others were woken by a poll).

``--plain-only`` runs only the independent jobs' execution (nobody waits: the cost the result
notifications add to every outcome), with ``--code DIR`` another checkout's ``django_workhorse``
(``git archive <commit> django_workhorse | tar -x -C DIR``) for a before/after comparison.

``--state-counts`` measures what the ``workhorse_workflows`` gauge costs a scrape (at most one each
5 s: the metrics' cache) and ``workhorse_status`` a call: ``stats.workflow_counts()`` with ``--live``
live diamonds (4 steps each: the source queued, three waiting) and as many finished in the window.

Uses DATABASE_URL, or the embedded PostgreSQL (database ``workhorse_bench``).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import PAYLOAD, dump, environment, fill, print_table, reset_tables, run_worker, setup_django

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


def wait_latencies(waits: int) -> tuple[list[float], list[float], dict[str, int]]:
    """Per wait, seconds from its job's outcome commit (the recording statement returning, in the
    worker's recorder thread) and from its handler's return to ``wait_for`` returning; and how many
    waits ended how: woken by the notification, finding the job finished at the first read, or at a
    poll (a second later). The first can be slightly negative: the notification may wake the
    wait before the recorder thread runs again to read its clock."""
    from django_workhorse import enqueue, register, wait_for
    from django_workhorse.awaiting import listener as listeners
    from django_workhorse.awaiting import waiting
    from django_workhorse.sql import outcomes
    from django_workhorse.worker import Worker

    committed: dict[int, float] = {}
    ended: dict[int, float] = {}
    recorded_all = threading.Event()
    recorded = outcomes.record_outcomes

    def timed_record(alias: str, batch: Any) -> set[int]:
        held = recorded(alias, batch)
        committed.update(dict.fromkeys(held, time.perf_counter()))
        recorded_all.set()
        return held

    def timed_handler(ctx: Any, payload: Any) -> None:
        ended[ctx.job_id] = time.perf_counter()

    created: list[Any] = []
    plain_waiter = listeners.thread_waiter

    def counted(event: threading.Event) -> Any:
        created.append(plain_waiter(event))
        return created[-1]

    register("bench.timed", timed_handler)
    outcomes.record_outcomes = timed_record  # type: ignore[assignment]
    listeners.thread_waiter = counted  # type: ignore[assignment]
    worker = Worker(concurrency=1, burst=False, poll_interval=1.0, scheduler=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    worker.wait_until_listening(10)
    from_commit, from_handler = [], []
    ends: dict[str, int] = {"notification": 0, "first read": 0, "poll": 0}
    try:
        wait_for(enqueue("bench.timed", PAYLOAD), timeout=10)  # the listener connects
        created.clear()
        for _ in range(waits):
            job_id = enqueue("bench.timed", PAYLOAD)
            wait_for(job_id, timeout=10)
            returned = time.perf_counter()
            while job_id not in committed:  # the recorder thread has not read its clock yet
                recorded_all.wait(1)
                recorded_all.clear()
            from_commit.append(returned - committed[job_id])
            from_handler.append(returned - ended[job_id])
            if created[-1].sources.get("notify"):
                ends["notification"] += 1
            else:
                ends["first read" if from_handler[-1] < waiting.POLL_SECONDS else "poll"] += 1
    finally:
        worker.stop()
        thread.join(30)
        outcomes.record_outcomes = recorded  # type: ignore[assignment]
        listeners.thread_waiter = plain_waiter  # type: ignore[assignment]
        listeners.listener("default").stop()
    return from_commit, from_handler, ends


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def plain_only(runs: int, n: int) -> None:
    rates = []
    for _ in range(runs):
        reset_tables()
        fill(n)
        seconds, done = run_worker(CONCURRENCY, BATCH)
        assert done == n, done
        rates.append(n / seconds)
    print(f"run: independent jobs ({n}), {runs} runs: median {statistics.median(rates):.0f} jobs/s, "
          f"min {min(rates):.0f}, max {max(rates):.0f}")  # fmt: skip


def state_counts(runs: int, sizes: list[int]) -> None:
    """Time ``stats.workflow_counts()`` with ``size`` live and ``size`` recently finished diamonds."""
    from django.db import connection

    from django_workhorse import EnqueueRequest
    from django_workhorse.operations import stats
    from django_workhorse.workflows import Workflow

    def diamonds(count: int) -> None:
        for _ in range(count):
            wf = Workflow("bench diamond")
            wf.add("a", EnqueueRequest("bench.noop", PAYLOAD))
            wf.add("b", EnqueueRequest("bench.noop", PAYLOAD), after=["a"])
            wf.add("c", EnqueueRequest("bench.noop", PAYLOAD), after=["a"])
            wf.add("d", EnqueueRequest("bench.noop", PAYLOAD), after=["b", "c"])
            timed(wf.enqueue)

    for size in sizes:
        reset_tables()
        diamonds(size)
        seconds, done = run_worker()  # the first ``size`` finish: recent, in the window
        assert done == 4 * size, done
        diamonds(size)  # live: one queued source and three waiting steps each
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE workhorse_job")
        counts = stats.workflow_counts()
        assert counts.running == size and counts.succeeded == size, counts
        took = []
        for _ in range(runs):
            start = time.perf_counter()
            stats.workflow_counts()
            took.append(time.perf_counter() - start)
        print(f"workflow_counts with {size} live and {size} finished diamonds ({8 * size} jobs), {runs} runs: "
              f"median {statistics.median(took) * 1000:.1f} ms, min {min(took) * 1000:.1f}, "
              f"max {max(took) * 1000:.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--waits", type=int, default=200)
    parser.add_argument("--json", default=None)
    parser.add_argument("--plain-only", action="store_true", help="only the independent jobs' execution")
    parser.add_argument("--code", default=None, help="a folder holding the django_workhorse to measure")
    parser.add_argument("--state-counts", action="store_true", help="only the workflow gauge's query")
    parser.add_argument("--live", default="1000,10000", help="live workflows for --state-counts, comma-separated")
    args = parser.parse_args()
    setup_django(code=None if args.code is None else Path(args.code).resolve())

    from django_workhorse import EnqueueRequest, enqueue_many, register

    register("bench.noop", lambda payload: None)
    n = args.steps
    if args.plain_only:
        plain_only(args.runs, n)
        return
    if args.state_counts:
        state_counts(args.runs, [int(size) for size in args.live.split(",")])
        return
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
        seconds, done = run_worker(CONCURRENCY, BATCH)
        assert done == n, done
        add("run: independent jobs", n / seconds)
        reset_tables()
        timed(lambda: fan(n, None).enqueue())
        seconds, done = run_worker(CONCURRENCY, BATCH)
        assert done == n, done
        add("run: fan-out/fan-in", n / seconds)
        reset_tables()
        timed(lambda: chain_of(100).enqueue())
        seconds, done = run_worker(CONCURRENCY, BATCH)
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
    reset_tables()
    from_commit, from_handler, ends = wait_latencies(args.waits)
    wake = {
        label: {"p50": percentile(values, 0.5) * 1000, "p95": percentile(values, 0.95) * 1000}
        for label, values in (("after the outcome's commit", from_commit), ("after the handler returned", from_handler))
    }
    how = ", ".join(f"{kind} {count}" for kind, count in ends.items())
    print(f"\nwait_for wake-up, {args.waits} waits (ended by: {how}):")
    for label, figure in wake.items():
        print(f"  {label}: p50 {figure['p50']:.2f} ms, p95 {figure['p95']:.2f} ms")
    dump(args.json, {"environment": environment(), "steps": n, "runs": args.runs, "figures": figures, "ratio": ratio,
                     "wait_ms": wake, "wait_ended_by": ends})  # fmt: skip


if __name__ == "__main__":
    main()
