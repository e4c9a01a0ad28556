"""``manage.py workhorse_maintenance``: run the housekeeping once."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_workhorse.operations.maintenance import run_maintenance


class Command(BaseCommand):
    help = (
        "Prune expired idempotency bindings, reclaim expired leases, prune finished jobs and workflows past "
        "WORKHORSE_JOB_RETENTION and forget stale workers (workers run this on their own too)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=None, help="Database alias (default: the router's choice).")

    def handle(self, *args: Any, database: str | None, verbosity: int, **options: Any) -> None:
        report = run_maintenance(using=database)
        if not verbosity:
            return
        if not report.ran:
            self.stdout.write("Another maintenance run holds the lock; nothing done.")
            return
        self.stdout.write(f"Pruned {report.expired_bindings} expired binding(s).")
        self.stdout.write(f"Reclaimed {report.reclaimed_jobs} job(s) with expired leases.")
        self.stdout.write(f"Pruned {report.finished_jobs} finished job(s).")
        self.stdout.write(f"Pruned {report.finished_workflows} finished workflow(s).")
        self.stdout.write(f"Forgot {report.stale_workers} stale worker(s).")
        self.stdout.write(f"Pruned {report.expired_effects} expired effect record(s).")
