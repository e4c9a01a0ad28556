"""The cost of one schedule evaluation, beside the same server's floor, in one run.

    python benchmarks/schedules.py [--database-url URL] [--sizes 10,1000,10000] [--runs 5] [--json out.json]
                                   [--profile N]

Uses ``--database-url``, else DATABASE_URL, else the embedded PostgreSQL (database
``workhorse_bench``); a database named in a URL is created when it does not exist. For each size
N, N schedules are declared in ``WORKHORSE_SCHEDULES`` on a job type registered with
``register()``, and time is driven with ``enqueue_due_schedules(now=...)``:

- the first evaluation (at 12:00:30 UTC) creates the state rows; nothing is due;
- "nothing due": instants a second apart in the same minute;
- "100 due": instants just after a minute, where exactly 100 schedules have one tick due (they
  run every minute; the others run hourly, every 30 minutes or daily, none of them in the
  window). With N = 10 the ten every-minute schedules catch up all their ticks and the instants
  are ten minutes apart: 10 schedules x 10 ticks.

Each figure is one call timed ``--runs`` times (after one untimed call): the median, min and max
in milliseconds, as the caller sees it (for due ticks, the transaction's commit included). The
floor is measured on the same connection in the same run: a ``SELECT 1`` round trip and the
scheduler's own read of N state rows. ``--profile N`` adds a cProfile of 200 nothing-due
evaluations with N schedules.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from common import dump, environment, setup_django

T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=timezone.utc)
DUE = 100
TASK = "bench.schedule.tick"
# The schedules that never tick between 12:00:30 and 13:00:00 UTC, in turn.
QUIET: list[dict[str, Any]] = [
    {"every": timedelta(hours=1)},
    {"cron": "0 * * * *"},
    {"cron": "0 3 * * *", "timezone": "Europe/Paris"},
    {"cron": "*/30 * * * *"},
    {"every": timedelta(days=1)},
    {"cron": "15 9 * * 1-5", "timezone": "America/New_York"},
]


# The floor's read: the columns the scheduler reads, as a plain SELECT of every row.
FLOOR_READ = "SELECT name, digest, active, paused, evaluated_until, last_job_id FROM workhorse_schedule"


def ensure_database(url: str) -> None:
    """Create the database a postgres:// URL names, if it does not exist."""
    import environ
    import psycopg

    config = environ.Env.db_url_config(url)
    params = {"host": config["HOST"], "port": config["PORT"] or 5432, "user": config["USER"]}
    if config["PASSWORD"]:
        params["password"] = config["PASSWORD"]
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (config["NAME"],)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{config["NAME"]}"')


def schedules_for(size: int) -> dict[str, dict[str, Any]]:
    """Return ``size`` WORKHORSE_SCHEDULES entries: min(size, 100) every minute, the rest quiet."""
    prefix = f"n{size}"
    due = min(size, DUE)
    catch_up = "all" if size < DUE else "latest"
    entries = {
        f"{prefix}-minutely-{i:05}": {
            "task": TASK,
            "every": timedelta(minutes=1),
            "catch_up": catch_up,
            "kwargs": {"n": i},
        }
        for i in range(due)
    }
    for i in range(size - due):
        entries[f"{prefix}-quiet-{i:05}"] = {"task": TASK, **QUIET[i % len(QUIET)], "kwargs": {"n": i}}
    return entries


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call()
    return (time.perf_counter() - start) * 1000, result


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def forget(scheduler: Any) -> None:
    """Forget what this process computed for the schedules, as a new process would not know it."""
    scheduler._known.clear()
    getattr(scheduler, "_horizons", {}).clear()


def reset() -> None:
    from django.db import connection

    from django_workhorse.schedules import evaluation as scheduler

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workhorse_job, workhorse_schedule CASCADE")
        cursor.execute("CHECKPOINT")
    forget(scheduler)


def measure_size(size: int, runs: int) -> dict[str, Any]:
    from django.test import override_settings

    from django_workhorse import enqueue_due_schedules
    from django_workhorse.models import Job, ScheduleState
    from django_workhorse.schedules import evaluation as scheduler
    from django_workhorse.sql.connection import execute

    reset()
    figures: dict[str, Any] = {}
    declared = schedules_for(size)
    with override_settings(WORKHORSE_SCHEDULES=declared):
        ms, results = timed(lambda: enqueue_due_schedules(T0))
        assert results == [] and ScheduleState.objects.count() == size
        figures["first evaluation (creates the rows)"] = ms

        def evaluate(now: datetime, expected: int) -> float:
            ms, results = timed(lambda: enqueue_due_schedules(now))
            assert len(results) == expected, (size, now, len(results))
            return ms

        quiet = [T0 + timedelta(seconds=1 + i) for i in range(runs + 1)]
        figures["first nothing-due evaluation of the process"] = evaluate(quiet[0], 0)
        figures["nothing due"] = stats([evaluate(now, 0) for now in quiet[1:]])
        step = timedelta(minutes=10 if size < DUE else 1)
        due = [T0.replace(second=0, microsecond=500_000) + step * (i + 1) for i in range(runs + 1)]
        evaluate(due[0], DUE)
        figures[f"{DUE} due ticks"] = stats([evaluate(now, DUE) for now in due[1:]])
        after = due[-1] + timedelta(seconds=1)
        figures["nothing due, after due ticks"] = stats(
            [evaluate(after + timedelta(seconds=i), 0) for i in range(runs)]
        )
        assert Job.objects.count() == DUE * (runs + 1)
        # The floor: the state rows through the same cursor path, without the scheduler.
        floor = [timed(lambda: execute("default", FLOOR_READ, {}))[0] for _ in range(runs + 1)][1:]
        figures["floor: read the state rows"] = stats(floor)
    # A process starting with the rows in place: nothing computed yet, the setting read afresh.
    cold = []
    for i in range(runs):
        forget(scheduler)
        with override_settings(WORKHORSE_SCHEDULES=declared):
            cold.append(evaluate(after + timedelta(seconds=runs + i), 0))
    figures["first evaluation of a new process (rows exist)"] = stats(cold)
    return figures


def floor_round_trip(runs: int) -> dict[str, float]:
    from django.db import connection

    def select_one() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    select_one()
    return stats([timed(select_one)[0] for _ in range(runs)])


def profile(size: int, evaluations: int) -> str:
    from django.test import override_settings

    from django_workhorse import enqueue_due_schedules

    reset()
    with override_settings(WORKHORSE_SCHEDULES=schedules_for(size)):
        enqueue_due_schedules(T0)
        enqueue_due_schedules(T0 + timedelta(seconds=1))
        instants = [T0 + timedelta(seconds=2, milliseconds=100 * i) for i in range(evaluations)]
        profiler = cProfile.Profile()
        profiler.enable()
        for now in instants:
            enqueue_due_schedules(now)
        profiler.disable()
    out = io.StringIO()
    report = pstats.Stats(profiler, stream=out).sort_stats("tottime")
    out.write(f"cProfile of {evaluations} nothing-due evaluations with {size} schedules, by own time\n")
    report.print_stats(18)
    report.sort_stats("cumulative").print_stats(18)
    return out.getvalue()


def print_figures(sizes: list[int], by_size: dict[int, dict[str, Any]], round_trip: dict[str, float]) -> None:
    print(
        f"\n| schedules | nothing due | {DUE} due ticks | floor: read of the state rows"
        " | first evaluation of a new process | first evaluation (creates the rows) |"
    )
    print("|---|---|---|---|---|---|")
    for size in sizes:
        f = by_size[size]
        cells = [
            f["nothing due"],
            f[f"{DUE} due ticks"],
            f["floor: read the state rows"],
            f["first evaluation of a new process (rows exist)"],
        ]
        text = " | ".join(f"**{c['median']:.2f}** [{c['min']:.2f}-{c['max']:.2f}]" for c in cells)
        print(f"| {size:,} | {text} | {f['first evaluation (creates the rows)']:.0f} |")
    print(f"\nSELECT 1 round trip: **{round_trip['median']:.3f}** [{round_trip['min']:.3f}-{round_trip['max']:.3f}] ms")
    for size in sizes:
        f = by_size[size]
        print(
            f"- {size:,}: first nothing-due evaluation of the process {f['first nothing-due evaluation of the process']:.1f} ms;"
            f" nothing due after due ticks {f['nothing due, after due ticks']['median']:.2f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=None, help="postgres:// URL (default: DATABASE_URL, else embedded)")
    parser.add_argument("--sizes", default="10,1000,10000", help="numbers of schedules, comma-separated")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, help="also profile nothing-due evaluations with N schedules")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    if args.database_url:
        os.environ["DATABASE_URL"] = args.database_url
    if os.environ.get("DATABASE_URL"):
        ensure_database(os.environ["DATABASE_URL"])
    setup_django()

    from django_workhorse import register

    register(TASK, lambda payload: None)
    sizes = [int(size) for size in args.sizes.split(",")]
    by_size = {size: measure_size(size, args.runs) for size in sizes}
    round_trip = floor_round_trip(args.runs)
    env = environment()
    print("\n" + json.dumps(env))
    print_figures(sizes, by_size, round_trip)
    report = profile(args.profile, 200) if args.profile else None
    if report:
        print("\n" + report)
    dump(
        args.json,
        {
            "environment": env,
            "args": {k: v for k, v in vars(args).items() if k not in ("json", "database_url")},
            "select_1_ms": round_trip,
            "figures": by_size,
        },
    )


if __name__ == "__main__":
    main()
