"""``manage.py workhorse_rekey``: re-encrypt the stored values sealed under a key other than the active one."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_workhorse.encryption import active_key_id, configured_key_ids, is_configured
from django_workhorse.management.progress import Progress
from django_workhorse.operations.rekey import (
    DEFAULT_BATCH,
    MAX_BATCH,
    MIN_BATCH,
    TableReport,
    key_counts,
    rekey,
    stale_total,
)


def batch_size(text: str) -> int:
    """Parse ``--batch``: rows per chunk, ``MIN_BATCH..MAX_BATCH``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not MIN_BATCH <= value <= MAX_BATCH:
        raise argparse.ArgumentTypeError(f"must be an integer in {MIN_BATCH}..{MAX_BATCH}")
    return value


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored value (jobs' payloads, results and errors, events, checkpoints, once() results, "
        "stored HTTP responses) sealed under a key other than WORKHORSE_ENCRYPTION's active one. Exit status 1 if "
        "a value could not be opened."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch",
            type=batch_size,
            default=DEFAULT_BATCH,
            metavar="N",
            help=f"Rows per chunk, each locked and committed on its own ({MIN_BATCH}..{MAX_BATCH}, default {DEFAULT_BATCH}).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count the stored values by table and key id; write nothing."
        )
        parser.add_argument("--no-progress", action="store_true", help="Never show a progress bar.")
        parser.add_argument("--database", default=None, help="Database alias (default: the router's choice).")

    def handle(
        self,
        *args: Any,
        batch: int,
        dry_run: bool,
        no_progress: bool,
        database: str | None,
        verbosity: int,
        **options: Any,
    ) -> None:
        if not is_configured():
            raise CommandError(
                "WORKHORSE_ENCRYPTION is not set: there is no active key to re-encrypt under.", returncode=2
            )
        if dry_run:
            self._dry_run(database)
            return
        with Progress(
            total=stale_total(using=database),
            desc="Re-encrypting",
            stream=self.stderr,
            enabled=not no_progress,
            unit="value",
        ) as bar:
            reports = rekey(batch=batch, using=database, on_progress=bar.update)
        for report in reports:
            for unopened in report.unopened:
                self.stderr.write(f"{report.table} row {unopened.row_id} {unopened.slot}: {unopened.reason}")
        if verbosity:
            self._summary(reports)
        locked = sum(report.locked for report in reports)
        if locked:
            self.stderr.write(f"{locked} value(s) are in rows other transactions held: run workhorse_rekey again.")
        if any(report.unopened for report in reports):
            raise CommandError(
                f"{sum(len(report.unopened) for report in reports)} value(s) could not be opened (listed above).",
                returncode=1,
            )

    def _dry_run(self, database: str | None) -> None:
        active, configured = active_key_id(), configured_key_ids()
        for table, by_key in key_counts(using=database).items():
            if not by_key:
                self.stdout.write(f"{table}: no encrypted values")
            for key_id, count in by_key.items():
                if key_id == active:
                    state = "active key"
                elif key_id in configured:
                    state = "would be re-encrypted"
                else:
                    state = "key not configured: cannot be opened"
                self.stdout.write(f"{table}: key {key_id}: {count} value(s) ({state})")

    def _summary(self, reports: list[TableReport]) -> None:
        for report in reports:
            self.stdout.write(
                f"{report.table}: {report.rekeyed} re-encrypted, {report.current} already under the active key, "
                f"{len(report.unopened)} could not be opened, {report.locked} skipped as locked"
            )
