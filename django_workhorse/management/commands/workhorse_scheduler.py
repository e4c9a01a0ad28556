"""``manage.py workhorse_scheduler``: evaluate the periodic schedules, alone, until stopped."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError, connections

from django_workhorse.conf import app_settings
from django_workhorse.exceptions import DatabaseUnavailableError
from django_workhorse.management import arguments
from django_workhorse.management.evaluating import EvaluatingCommand
from django_workhorse.observability.log_fields import job_ids
from django_workhorse.schedules.evaluation import enqueue_due_schedules, report_left_out_schedules
from django_workhorse.types import EnqueueOutcome, EnqueueResult
from django_workhorse.worker import signal_relay
from django_workhorse.worker.database_wait import MAX_DB_WAIT, DatabaseWait
from django_workhorse.worker.own_connections import close_broken_connections

logger = logging.getLogger("django_workhorse.schedules.evaluation")


class Command(EvaluatingCommand):
    help = (
        "Evaluate the periodic schedules every WORKHORSE_SCHEDULE_INTERVAL until SIGTERM/SIGINT "
        "(with --once, evaluate once and exit). Workers evaluate too unless started with --no-scheduler; "
        "running both is safe: each tick is still one job. A schedule the system checks report is left out "
        "and logged; the others still run. While the database is unreachable it waits with backoff "
        "(with --max-db-wait, at most that long: then it exits with status 1)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Evaluate once, print what was enqueued, exit.")
        parser.add_argument("--database", default="default", help="Database alias for schedules and jobs.")
        parser.add_argument(
            "--max-db-wait",
            type=arguments.seconds(0, MAX_DB_WAIT),
            default=None,
            help="Give up (exit status 1) once the database has been unreachable this long (default: wait for ever).",
        )

    def handle(
        self, *args: Any, once: bool, database: str, max_db_wait: float | None, verbosity: int, **options: Any
    ) -> None:
        logging.getLogger("django_workhorse").setLevel(
            {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
        )
        report_left_out_schedules()
        if once:
            self._report(enqueue_due_schedules(using=database), verbosity, always=True)
            return
        stopping = threading.Event()
        database_wait = DatabaseWait(database, max_wait=max_db_wait, stopping=stopping)
        try:
            with signal_relay.relayed({signal.SIGTERM: stopping.set, signal.SIGINT: stopping.set}):
                while not stopping.is_set():
                    if self._evaluate(database, database_wait, verbosity):
                        stopping.wait(app_settings.SCHEDULE_INTERVAL.total_seconds())
        except DatabaseUnavailableError as exc:
            raise CommandError(str(exc), returncode=1) from exc
        finally:
            connections[database].close()

    def _evaluate(self, database: str, database_wait: DatabaseWait, verbosity: int) -> bool:
        """Evaluate once; return False when the database was down (and is back: evaluate again now)."""
        try:
            close_broken_connections()
            self._report(enqueue_due_schedules(using=database), verbosity)
        except Exception as exc:  # the next evaluation covers this one's window
            connections[database].close()
            if isinstance(exc, DatabaseError) and not database_wait.answers():
                database_wait.until_up(exc)
                return False
            logger.exception("Evaluating the schedules failed; trying again after the interval")
        return True

    def _report(self, results: list[EnqueueResult], verbosity: int, *, always: bool = False) -> None:
        accepted = [r.job_id for r in results if r.outcome is EnqueueOutcome.ACCEPTED]
        if verbosity and (accepted or always):
            self.stdout.write(f"{len(results)} due tick(s), {len(accepted)} new job(s){job_ids(accepted)}")
