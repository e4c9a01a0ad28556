"""The admin dashboard's load time with many schedules, this code beside older code, in one run.

    python benchmarks/dashboard_schedules.py [--sizes 1000,10000] [--runs 5] [--baseline DIR] [--json out.json]

For each size N, N schedules are declared in ``WORKHORSE_SCHEDULES`` on a job type registered
with ``register()`` and their state rows created by one ``enqueue_due_schedules()``, in two mixes:

- "shared": the mix of ``benchmarks/schedules.py`` (100 every minute, the rest hourly, every 30
  minutes or daily, seven timings in all);
- "distinct": every schedule its own daily cron expression (``M H D * *``), the worst case for
  anything computed once per expression.

Each figure is one ``GET /admin/workhorse/job/dashboard/`` through Django's test client, logged
in as a superuser, in milliseconds: the process's first load (it reads its schedules then, as a
new web process does), then ``--runs`` loads, the page's refreshes: the median, min and max. The job tables
are empty, so the figure is the schedules' share of a load plus a constant (about 10 queries).

With ``--baseline DIR`` (older code: ``git archive <commit> django_workhorse | tar -x -C DIR``),
the same loads with that code, in a subprocess. Uses ``--database-url``, else DATABASE_URL, else
the embedded PostgreSQL (database ``workhorse_bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from common import ROOT, dump, environment

T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=timezone.utc)
TASK = "bench.dashboard.tick"
DASHBOARD = "/admin/workhorse/job/dashboard/"


def setup(code: Path, database: str) -> None:
    """Configure Django with the admin on ``code``'s django_workhorse, and migrate."""
    sys.path[:0] = [str(code), str(ROOT)]
    import django
    from django.conf import settings
    from django.core.management import call_command

    from example_project.devdb import database_settings

    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        SECRET_KEY="bench",
        ALLOWED_HOSTS=["testserver"],
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django_workhorse",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        ROOT_URLCONF=__name__,
        DATABASES={"default": {**database_settings(ROOT, name=database), "CONN_MAX_AGE": None}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING_CONFIG=None,
    )
    django.setup()
    call_command("migrate", verbosity=0)


def __getattr__(name: str) -> Any:  # this module is the benchmark's URLconf
    if name == "urlpatterns":
        from django.contrib import admin
        from django.urls import path

        return [path("admin/", admin.site.urls)]
    raise AttributeError(name)


def declared(mix: str, size: int) -> dict[str, dict[str, Any]]:
    """Return ``size`` WORKHORSE_SCHEDULES entries of the mix ``mix``."""
    if mix == "shared":
        from schedules import schedules_for

        return {name: {**entry, "task": TASK} for name, entry in schedules_for(size).items()}
    return {
        f"d{size}-{i:05}": {"task": TASK, "cron": f"{i % 60} {i // 60 % 24} {i // 1440 % 28 + 1} * *"}
        for i in range(size)
    }


def measure(mix: str, size: int, runs: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client, override_settings

    from django_workhorse import enqueue_due_schedules

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workhorse_job, workhorse_schedule CASCADE")
    user_model = get_user_model()
    user = user_model.objects.filter(username="bench").first()
    user = user or user_model.objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)
    with override_settings(WORKHORSE_SCHEDULES=declared(mix, size)):
        enqueue_due_schedules(T0)

        def load() -> float:
            start = time.perf_counter()
            response = client.get(DASHBOARD)
            elapsed = (time.perf_counter() - start) * 1000
            assert response.status_code == 200 and b"workhorse-next-ticks" in response.content, response.status_code
            return elapsed

        first = load()
        values = [load() for _ in range(runs)]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values, "first": first}


def worker(args: argparse.Namespace) -> None:
    setup(Path(args.code), args.database)
    from django_workhorse import register

    register(TASK, lambda payload: None)
    sizes = [int(size) for size in args.sizes.split(",")]
    figures = {f"{mix}, {size}": measure(mix, size, args.runs) for size in sizes for mix in ("shared", "distinct")}
    print(json.dumps({"environment": environment(), "figures": figures}, default=str))


def run(code: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", "--code", str(code), "--database", args.database]
    command += ["--sizes", args.sizes, "--runs", str(args.runs)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=os.environ).stdout
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=None, help="postgres:// URL (default: DATABASE_URL, else embedded)")
    parser.add_argument("--sizes", default="1000,10000", help="numbers of schedules, comma-separated")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", default=None, help="a folder holding older code's django_workhorse")
    parser.add_argument("--database", default="workhorse_bench")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--code", default=str(ROOT), help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.database_url:
        os.environ["DATABASE_URL"] = args.database_url
    if os.environ.get("DATABASE_URL"):
        from schedules import ensure_database

        ensure_database(os.environ["DATABASE_URL"])
    if args.worker:
        worker(args)
        return
    results = {"this code": run(ROOT, args)}
    if args.baseline:
        results["baseline"] = run(Path(args.baseline).resolve(), args)
    print("\n" + json.dumps(results["this code"]["environment"]))
    labels = list(results)
    print(
        "\n| schedules (mix) | "
        + " | ".join(f"{label}: load (ms) | {label}: first load (ms)" for label in labels)
        + " |"
    )
    print("|---|" + "---|---|" * len(labels))
    for name in results["this code"]["figures"]:
        cells = [results[label]["figures"][name] for label in labels]
        text = " | ".join(
            f"**{c['median']:,.1f}** [{c['min']:,.1f}-{c['max']:,.1f}] | {c['first']:,.0f}" for c in cells
        )
        mix, size = name.split(", ")
        print(f"| {int(size):,} ({mix}) | {text} |")
    dump(args.json, {"args": {"sizes": args.sizes, "runs": args.runs}, "results": results})


if __name__ == "__main__":
    main()
