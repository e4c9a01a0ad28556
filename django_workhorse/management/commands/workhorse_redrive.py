"""``manage.py workhorse_redrive``: run dead jobs again as new jobs, safely repeatable."""

from __future__ import annotations

import argparse
import getpass
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import router

from django_workhorse import conf
from django_workhorse.exceptions import JobDoesNotExist, JobNotDeadError, RedriveConflictError
from django_workhorse.management.arguments import job_id
from django_workhorse.management.progress import Progress
from django_workhorse.models import Job, JobStatus
from django_workhorse.operations.actions import plan_redrive, redrive

FETCH_CHUNK = 1000
# Leaves room for ":<job id>" (at most 20 digits) in a request id.
MAX_REQUEST_ID_CHARS = conf.MAX_REQUEST_ID_CHARS - 40


def request_id_prefix(text: str) -> str:
    """Parse --request-id: 1..160 characters."""
    if not 1 <= len(text) <= MAX_REQUEST_ID_CHARS:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_REQUEST_ID_CHARS} characters")
    return text


def cli_requester() -> str:
    """Return ``"cli:<OS user>"``, or ``"cli"`` when the user cannot be determined."""
    try:
        user = getpass.getuser()
    except (ImportError, KeyError, OSError):
        return "cli"
    return f"cli:{user}"[: conf.MAX_REQUESTED_BY_CHARS] if user else "cli"


@dataclass
class _Tally:
    redriven: int = 0
    already: int = 0
    failed: int = 0


@dataclass(frozen=True)
class _Candidate:
    pk: int
    status: str
    attempt: int
    queue: str
    job_type: str


_FIELDS = ("pk", "status", "attempt", "queue", "job_type")


class Command(BaseCommand):
    help = (
        "Run dead jobs again as new jobs: the given ids, or every dead job of a queue with --all-dead --queue. "
        "Each redrive has a request id, so repeating the command redrives each job once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_ids", nargs="*", type=job_id, metavar="JOB_ID", help="Dead jobs to redrive.")
        parser.add_argument("--all-dead", action="store_true", help="Redrive every dead job of --queue.")
        parser.add_argument(
            "--queue", default=None, metavar="NAME", help="The queue whose dead jobs --all-dead redrives."
        )
        parser.add_argument("--dry-run", action="store_true", help="List what would be redriven; write nothing.")
        parser.add_argument(
            "--request-id",
            type=request_id_prefix,
            metavar="ID",
            default=None,
            help="Request id prefix; each job's request id is '<ID>:<job id>' (default: 'cli:<job id>:<attempt>').",
        )
        parser.add_argument("--reason", default="", metavar="TEXT", help="Why, recorded with each redrive.")
        parser.add_argument("--no-progress", action="store_true", help="Never show a progress bar.")
        parser.add_argument("--database", default=None, help="Database alias (default: the router's choice).")

    def handle(
        self,
        *args: Any,
        job_ids: list[int],
        all_dead: bool,
        queue: str | None,
        dry_run: bool,
        request_id: str | None,
        reason: str,
        no_progress: bool,
        database: str | None,
        verbosity: int,
        **options: Any,
    ) -> None:
        if all_dead and job_ids:
            raise CommandError("Give job ids or --all-dead --queue NAME, not both.")
        if all_dead and queue is None:
            raise CommandError("--all-dead needs --queue NAME.")
        if not all_dead and queue is not None:
            raise CommandError("--queue is only used with --all-dead.")
        if not all_dead and not job_ids:
            raise CommandError("Give the ids of dead jobs, or --all-dead --queue NAME.")
        self.alias = database or router.db_for_write(Job)
        self.verbosity = verbosity
        self.dry_run = dry_run
        self.request_id = request_id
        self.reason = reason
        self.requested_by = cli_requester()
        self.bar: Progress | None = None
        tally = _Tally()
        jobs = Job.objects.using(self.alias)
        if all_dead:
            dead = jobs.filter(status=JobStatus.DEAD, queue=queue)
            total = dead.count()
            rows = dead.order_by("pk").values_list(*_FIELDS).iterator(chunk_size=FETCH_CHUNK)
            with Progress(total=total, desc="Redriving", stream=self.stderr, enabled=not no_progress) as bar:
                self.bar = bar
                for row in rows:
                    self._redrive(_Candidate(*row), tally)
                    bar.update()
            self.bar = None
        else:
            wanted = list(dict.fromkeys(job_ids))
            found = {row[0]: _Candidate(*row) for row in jobs.filter(pk__in=wanted).values_list(*_FIELDS)}
            for pk in wanted:
                candidate = found.get(pk)
                if candidate is None:
                    self._fail(f"Job {pk} does not exist.", tally)
                elif candidate.status != JobStatus.DEAD:
                    self._fail(f"Job {pk} is {candidate.status}, not dead: only dead jobs can be redriven.", tally)
                else:
                    self._redrive(candidate, tally)
        self._summarise(tally)
        if tally.failed:
            raise CommandError(f"{tally.failed} job(s) could not be redriven.")

    def _redrive(self, job: _Candidate, tally: _Tally) -> None:
        request_id = f"{self.request_id}:{job.pk}" if self.request_id else f"cli:{job.pk}:{job.attempt}"
        request = {"request_id": request_id, "requested_by": self.requested_by, "reason": self.reason}
        try:
            earlier = plan_redrive(job.pk, **request, using=self.alias).new_job_id
            if self.dry_run:
                self._report(job, request_id, earlier, tally)
                return
            new_id = redrive(job.pk, **request, using=self.alias)
        except RedriveConflictError as exc:
            verb = "would not be" if self.dry_run else "was not"
            self._fail(f"Job {job.pk} {verb} redriven: {exc}.", tally)
            return
        except (JobDoesNotExist, JobNotDeadError) as exc:
            self._fail(f"Job {job.pk} was not redriven: {exc}.", tally)
            return
        self._report(job, request_id, earlier if earlier is not None else None, tally, new_id=new_id)

    def _report(
        self, job: _Candidate, request_id: str, earlier: int | None, tally: _Tally, *, new_id: int | None = None
    ) -> None:
        if earlier is not None:
            tally.already += 1
            self._say(f"Job {job.pk} was already redriven as {earlier} (request id {request_id}).")
        elif new_id is None:
            tally.redriven += 1
            self._say(f"Would redrive job {job.pk} ({job.job_type} on queue {job.queue}).")
        else:
            tally.redriven += 1
            self._say(f"Redrove job {job.pk} as {new_id}.")

    def _fail(self, message: str, tally: _Tally) -> None:
        tally.failed += 1
        with self._paused():
            self.stderr.write(message)

    def _say(self, message: str) -> None:
        if self.verbosity:
            with self._paused():
                self.stdout.write(message)

    def _paused(self) -> AbstractContextManager[None]:
        return nullcontext() if self.bar is None else self.bar.paused()

    def _summarise(self, tally: _Tally) -> None:
        parts: Iterable[str] = (
            f"{'Would redrive' if self.dry_run else 'Redrove'} {tally.redriven} job(s)",
            f"{tally.already} already redriven",
            f"{tally.failed} failed",
        )
        self._say("; ".join(parts) + ".")
