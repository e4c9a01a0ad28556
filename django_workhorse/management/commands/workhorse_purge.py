"""``manage.py workhorse_purge``: delete queued jobs of a queue (or by id) and release their keys."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_workhorse.exceptions import InvalidArgumentError
from django_workhorse.management.arguments import job_id
from django_workhorse.management.progress import Progress
from django_workhorse.operations.actions import purge, purgeable


class Command(BaseCommand):
    help = (
        "Delete queued jobs of a queue, or the given queued jobs, and release their idempotency keys. "
        "Running and finished jobs are never purged."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", default=None, metavar="NAME", help="Purge the queued jobs of this queue.")
        parser.add_argument(
            "--job",
            type=job_id,
            action="append",
            dest="job_ids",
            metavar="ID",
            help="Purge this queued job (repeatable; with --queue, only if it is in that queue).",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count what would be purged; delete nothing.")
        parser.add_argument("--no-progress", action="store_true", help="Never show a progress bar.")
        parser.add_argument("--database", default=None, help="Database alias (default: the router's choice).")

    def handle(
        self,
        *args: Any,
        queue: str | None,
        job_ids: list[int] | None,
        dry_run: bool,
        no_progress: bool,
        database: str | None,
        verbosity: int,
        **options: Any,
    ) -> None:
        if queue is None and not job_ids:
            raise CommandError("Give --queue NAME or --job ID: refusing to purge without a filter.")
        try:
            queued = purgeable(queue=queue, job_ids=job_ids, using=database)
        except InvalidArgumentError as exc:
            raise CommandError(str(exc)) from exc
        if job_ids:
            self._report_skipped(job_ids, set(queued.values_list("pk", flat=True)), queue)
        where = "" if queue is None else f" from queue {queue}"
        total = queued.count()
        if dry_run:
            if verbosity:
                self.stdout.write(f"Would purge {total} queued job(s){where}.")
            return
        with Progress(total=total, desc="Purging", stream=self.stderr, enabled=not no_progress) as bar:
            purged = purge(queue=queue, job_ids=job_ids, using=database, on_progress=bar.update)
        if verbosity:
            self.stdout.write(f"Purged {purged} queued job(s){where}.")

    def _report_skipped(self, job_ids: list[int], queued: set[int], queue: str | None) -> None:
        skipped = sorted(set(job_ids) - queued)
        if skipped:
            state = "queued" if queue is None else f"queued in queue {queue}"
            listed = ", ".join(map(str, skipped))
            self.stderr.write(f"Skipping {len(skipped)} job(s) that are not {state} (or do not exist): {listed}.")
