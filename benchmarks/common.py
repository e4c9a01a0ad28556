"""Shared set-up for the benchmark scripts: a Django configured for a benchmark database."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = {"i": 1, "user_id": 100001, "email": "someone@example.com", "note": "x" * 120}


# The physical floor's table: a minimal job table with the claim's index, for INSERT and COPY limits.
BENCH_JOBS_DDL = """
DROP TABLE IF EXISTS bench_jobs;
CREATE TABLE bench_jobs (
    id bigserial PRIMARY KEY, queue text NOT NULL DEFAULT 'default', status text NOT NULL DEFAULT 'todo',
    payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz,
    finished_at timestamptz, attempts int NOT NULL DEFAULT 0, priority int NOT NULL DEFAULT 0);
CREATE INDEX bench_jobs_todo ON bench_jobs (queue, priority DESC, id) WHERE status = 'todo';
"""


def setup_django(database: str = "workhorse_bench", *, code: Path | None = None, migrate: bool = True) -> None:
    """Configure Django on DATABASE_URL or the embedded PostgreSQL, and migrate (unless ``migrate``
    is false: a helper process of a run whose parent migrated).

    ``code`` puts another checkout's django_workhorse first on sys.path (to measure a baseline).
    """
    sys.path[:0] = [str(code), str(ROOT)] if code is not None else [str(ROOT)]
    import django
    from django.conf import settings
    from django.core.management import call_command

    from example_project.devdb import database_settings

    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        SECRET_KEY="bench",
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_workhorse"],
        DATABASES={"default": {**database_settings(ROOT, name=database), "CONN_MAX_AGE": None}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING_CONFIG=None,
    )
    django.setup()
    if migrate:
        call_command("migrate", verbosity=0)


def reset_tables() -> None:
    """Empty the workhorse tables and checkpoint, so every run starts alike."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workhorse_job CASCADE")
        cursor.execute("CHECKPOINT")


def rate(count: int, work: Callable[[], Any]) -> float:
    """Return ``count / seconds`` for one call of ``work``."""
    start = time.perf_counter()
    work()
    return count / (time.perf_counter() - start)


def fill(n: int, job_type: str = "bench.noop", payload: Any = PAYLOAD, *, per_call: int = 1000) -> None:
    """Enqueue ``n`` jobs of ``job_type`` with ``enqueue_many``, ``per_call`` at a time (each call one
    statement, in autocommit; at most 1,000)."""
    from django_workhorse import EnqueueRequest, enqueue_many

    for start in range(0, n, per_call):
        enqueue_many([EnqueueRequest(job_type, payload) for _ in range(min(per_call, n - start))])


def run_worker(concurrency: int = 8, batch: int = 50, poll_interval: float = 0.01) -> tuple[float, int]:
    """Run one burst worker (``concurrency`` threads claiming ``batch`` at a time, in this process)
    until no job is left; return its seconds and how many jobs succeeded."""
    from django_workhorse.worker import Worker

    worker = Worker(concurrency=concurrency, batch=batch, burst=True, listen_using=None, poll_interval=poll_interval)
    began = time.perf_counter()
    stats = worker.run()
    return time.perf_counter() - began, stats.finished.get("succeeded", 0)


def median_of(runs: int, measure: Callable[[], float]) -> dict[str, float]:
    """Run ``measure`` ``runs`` times; return the median, min and max."""
    values = [measure() for _ in range(runs)]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def environment() -> dict[str, Any]:
    """Describe the machine, Python, Django and PostgreSQL of this run."""
    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
    cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True)
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu.stdout.strip(),
        "cpus": len(__import__("os").sched_getaffinity(0)),
        "python": platform.python_version(),
        "django": django.get_version(),
        "postgresql": server,
        "connection": "unix socket" if str(connection.settings_dict["HOST"]).startswith("/") else "TCP",
    }


def print_table(title: str, rows: list[tuple[str, dict[str, float], str]]) -> None:
    """Print a Markdown table of ``(label, stats, unit)`` rows."""
    print(f"\n### {title}\n\n| workload | median | [min-max] | unit |\n|---|---|---|---|")
    for label, stats, unit in rows:
        print(f"| {label} | **{stats['median']:,.0f}** | [{stats['min']:,.0f}-{stats['max']:,.0f}] | {unit} |")


def dump(path: str | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2, default=str))


class _DiscardingExporter:
    """An OpenTelemetry span exporter that keeps nothing: the spans are made, batched and handed
    over as with a real exporter, without a network in the measurement."""

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# What --observability compares: nothing on (as without the extras), the metrics alone, metrics
# and every span recorded, metrics and one trace in ten recorded (a parent-based ratio sampler:
# a job's attempt follows its enqueue's decision).
OBSERVABILITY_MODES = ("off", "metrics", "metrics + traces", "metrics + traces sampled 10%")


def observability(mode: str) -> None:
    """Switch metrics and tracing to ``mode`` (one of OBSERVABILITY_MODES), in this process.

    Metrics on: prometheus-client records every metric, as with the metrics extra installed.
    Traces on: an OpenTelemetry SDK tracer provider with a batch span processor, whose exporter
    drops what it is handed. Off: what a project without the extras gets (``instruments``
    records nothing; no tracer provider).
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    from opentelemetry.util._once import Once

    from django_workhorse.observability import instruments
    from django_workhorse.observability.metrics import collectors

    assert mode in OBSERVABILITY_MODES, mode
    instruments._metrics = None if mode == "off" else collectors
    previous = trace._TRACER_PROVIDER
    if previous is not None:
        previous.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    if "traces" in mode:
        sampler = ParentBased(TraceIdRatioBased(0.1)) if "sampled" in mode else None
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(_DiscardingExporter()))
        trace.set_tracer_provider(provider)


def alternating_values(runs: int, measures: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Run each of ``measures`` ``runs`` times, interleaved (ABAB..., then BABA... on odd rounds),
    so drift in the machine falls on every measure alike; return each one's values, round by round."""
    values: dict[str, list[float]] = {label: [] for label in measures}
    order = list(measures)
    for round_ in range(runs):
        for label in order if round_ % 2 == 0 else reversed(order):
            values[label].append(measures[label]())
    return values


def alternating(runs: int, measures: dict[str, Callable[[], float]]) -> dict[str, dict[str, float]]:
    """``alternating_values``, summed up: each measure's median, min and max."""
    return {
        label: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": len(v)}
        for label, v in alternating_values(runs, measures).items()
    }


def print_on_off(title: str, figures: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Print each workload in every mode and what each mode costs against "off"; return the costs."""
    modes = [mode for mode in OBSERVABILITY_MODES if mode != "off"]
    header = "| workload | off | " + " | ".join(modes) + " |"
    print(f"\n### {title}\n\n{header}\n" + "|---" * (len(modes) + 2) + "|")
    costs: dict[str, dict[str, float]] = {}
    for workload, by in figures.items():
        off = by["off"]
        costs[workload] = {mode: 1 - by[mode]["median"] / off["median"] for mode in modes}
        cells = [f"**{by[mode]['median']:,.0f}** ({-costs[workload][mode]:+.1%})" for mode in modes]
        print(
            f"| {workload} | **{off['median']:,.0f}** [{off['min']:,.0f}-{off['max']:,.0f}] | "
            + " | ".join(cells)
            + " |"
        )
    return costs


def observability_costs(runs: int, workloads: dict[str, Callable[[], float]], title: str, path: str | None) -> None:
    """Measure each workload (a call returning a rate) in every mode of OBSERVABILITY_MODES,
    interleaved; print the table of what each mode costs and dump the figures to ``path``."""

    def in_mode(mode: str, workload: Callable[[], float]) -> Callable[[], float]:
        def run() -> float:
            observability(mode)
            return workload()

        return run

    figures = {
        label: alternating(runs, {mode: in_mode(mode, workload) for mode in OBSERVABILITY_MODES})
        for label, workload in workloads.items()
    }
    observability("off")
    env = environment()
    print("\n" + json.dumps(env))
    costs = print_on_off(title, figures)
    dump(path, {"environment": env, "observability": figures, "costs": costs})
