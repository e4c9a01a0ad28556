"""``manage.py workhorse_worker``: run jobs until stopped."""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser, OutputWrapper
from django.utils.autoreload import get_child_arguments
from django.utils.module_loading import autodiscover_modules

from django_workhorse.conf import DEFAULT_DRAIN_TIMEOUT, DEFAULT_LEASE
from django_workhorse.exceptions import DatabaseUnavailableError, InvalidArgumentError, WorkerThreadError
from django_workhorse.management import arguments
from django_workhorse.management.evaluating import EvaluatingCommand
from django_workhorse.management.health import serving_health
from django_workhorse.schedules.evaluation import report_left_out_schedules
from django_workhorse.worker import Worker, signal_relay, supervisor
from django_workhorse.worker import child as children
from django_workhorse.worker.database_wait import MAX_DB_WAIT

MAX_CONCURRENCY = 100
# How django_workhorse's records read on the console when the project's logging shows them nowhere.
CONSOLE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def bounded_int(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer in {low}..{high}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer in {low}..{high}")
        return value

    return parse


MAX_SECONDS = 365 * 24 * 3600


def positive_seconds(text: str) -> float:
    bound = f"must be a number of seconds in (0, {MAX_SECONDS}]"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(bound) from None
    if not 0 < value <= MAX_SECONDS:  # also rejects nan and inf
        raise argparse.ArgumentTypeError(bound)
    return value


def queue_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("must name at least one queue")
    return names


def memory_size(text: str) -> int:
    try:
        return supervisor.parse_memory_size(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(f"must be {exc.bound}") from None


def serve_metrics(address: str, port: int) -> None:
    """Start the metrics server of --metrics-port, or say why it cannot run."""
    try:
        from django_workhorse.observability.metrics import server
    except ImportError:
        raise CommandError("--metrics-port needs prometheus-client: pip install 'django-workhorse[metrics]'") from None
    try:
        server.serve(address, port)
    except OSError as exc:
        raise CommandError(f"--metrics-port: cannot serve on {address}:{port}: {exc.strerror or exc}") from exc


def check_process_options(*, max_jobs: int | None, metrics_port: int | None, memory: int | None) -> None:
    """Refuse, with exit code 2, what --processes cannot do (yet)."""
    if max_jobs is not None:
        raise CommandError("--max-jobs: not with --processes (use --max-jobs-per-child)", returncode=2)
    if metrics_port is not None:
        raise CommandError("--metrics-port: not with --processes yet", returncode=2)
    if memory is not None and not supervisor.can_read_memory():
        raise CommandError("--max-memory-per-child: needs /proc to read memory (Linux)", returncode=2)


def supervised(child: children.ChildIdentity) -> dict[str, Any]:
    """The Worker options of a supervisor's child."""
    return {
        "name": child.name,
        "kind": "child",
        "supervisor": child.supervisor,
        "observer": children.ChildReporter(child),
    }


def watch_supervisor(worker: Worker, child: children.ChildIdentity) -> None:
    """A child drains when its supervisor goes away, recycles on SIGUSR1, and leaves SIGHUP to its
    supervisor (which replaces it)."""
    children.ChildReporter(child).watch_supervisor(worker.stop)
    signal_relay.SignalRelay({signal.SIGUSR1: worker.recycle}).start()  # for the child's whole life
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


class ConsoleHandler(logging.Handler):
    """Write records to a command's output stream as plain text (not in the error style Django
    gives standard error on a terminal)."""

    def __init__(self, stream: OutputWrapper, level: int) -> None:
        super().__init__(level)
        self.stream = stream
        self.setFormatter(logging.Formatter(CONSOLE_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record), style_func=str)
            self.stream.flush()
        except Exception:
            self.handleError(record)


@contextmanager
def console_logging(stream: OutputWrapper, level: int) -> Iterator[None]:
    """Write the ``django_workhorse`` records of ``level`` and above to ``stream`` while the command
    runs, if nothing else would show them: no handler on that logger nor above it (Python's last
    resort prints warnings only, unformatted). A project whose ``LOGGING`` has one is left alone."""
    logger = logging.getLogger("django_workhorse")
    if logger.hasHandlers():
        yield
        return
    handler = ConsoleHandler(stream, level)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


class Command(EvaluatingCommand):
    help = (
        "Run django-workhorse jobs until SIGTERM/SIGINT (or, with --burst, until no job is ready). "
        "Exits with status 1 if a worker thread died of an unexpected error, or if the database stayed "
        "unreachable past --max-db-wait (without it the worker waits for ever). A schedule the system checks "
        "report is left out and logged; the others and every queue still run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", type=queue_list, default=["default"], help="Comma-separated queues.")
        parser.add_argument("--concurrency", type=bounded_int(1, MAX_CONCURRENCY), default=1, help="Threads, 1..100.")
        parser.add_argument("--batch", type=bounded_int(1, 1000), default=None, help="Jobs claimed per round trip.")
        parser.add_argument("--burst", action="store_true", help="Exit when no job is ready.")
        parser.add_argument("--max-jobs", type=bounded_int(1, 10**9), default=None, help="Exit after this many.")
        lease, drain = DEFAULT_LEASE.total_seconds(), DEFAULT_DRAIN_TIMEOUT.total_seconds()
        parser.add_argument("--lease", type=positive_seconds, default=lease, help=f"Lease in seconds ({lease:g}).")
        parser.add_argument("--poll-interval", type=positive_seconds, default=1.0, help="Fallback poll (1 s).")
        parser.add_argument(
            "--drain-timeout", type=positive_seconds, default=drain, help=f"Grace on stop ({drain:g} s)."
        )
        parser.add_argument("--database", default="default", help="Database alias for jobs.")
        parser.add_argument(
            "--listen-database",
            default=None,
            help="Alias for the LISTEN connection (default: --database); 'none' polls only (PgBouncer).",
        )
        parser.add_argument(
            "--metrics-port",
            type=bounded_int(1, 65535),
            default=None,
            help="Serve this worker's Prometheus metrics on this port (needs django-workhorse[metrics]).",
        )
        parser.add_argument(
            "--metrics-address", default="127.0.0.1", help="Address of --metrics-port (127.0.0.1; 0.0.0.0 for all)."
        )
        parser.add_argument(
            "--no-scheduler",
            action="store_false",
            dest="scheduler",
            help="Do not evaluate the periodic schedules (another worker or workhorse_scheduler does).",
        )
        self._add_health_arguments(parser)
        self.add_process_arguments(parser)

    def _add_health_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--max-db-wait",
            type=arguments.seconds(0, MAX_DB_WAIT),
            default=None,
            help="Give up (exit status 1) once the database has been unreachable this long (default: wait for ever).",
        )
        parser.add_argument(
            "--health-file",
            type=arguments.file_in_existing_folder,
            default=None,
            help="Touch this file on every heartbeat (its mtime says the worker is alive).",
        )
        parser.add_argument(
            "--health-port",
            type=bounded_int(1, 65535),
            default=None,
            help="Serve HTTP /live (heartbeats) and /ready (the database answers) on this port.",
        )
        parser.add_argument(
            "--health-address", default="127.0.0.1", help="Address of --health-port (127.0.0.1; 0.0.0.0 for all)."
        )

    def add_process_arguments(self, parser: CommandParser) -> None:
        processes = parser.add_argument_group("processes")
        processes.add_argument(
            "--processes",
            type=bounded_int(1, supervisor.MAX_PROCESSES),
            default=1,
            help="Child processes, each with --concurrency threads, under a supervisor (1..64; 1: no supervisor).",
        )
        processes.add_argument(
            "--max-jobs-per-child",
            type=bounded_int(1, 10**9),
            default=None,
            help="Replace a child once it has claimed this many jobs (after it finishes them).",
        )
        processes.add_argument(
            "--max-memory-per-child",
            type=memory_size,
            default=None,
            help="Replace a child whose resident memory exceeds this (512M, 2G) once it finishes its jobs.",
        )
        processes.add_argument(
            "--timeout-grace",
            type=positive_seconds,
            default=10.0,
            help="With --processes: kill a child whose handler runs this long past its job's timeout (10 s).",
        )

    def handle(
        self,
        *args: Any,
        queues: list[str],
        concurrency: int,
        batch: int | None,
        burst: bool,
        max_jobs: int | None,
        lease: float,
        poll_interval: float,
        drain_timeout: float,
        database: str,
        listen_database: str | None,
        scheduler: bool,
        metrics_port: int | None,
        metrics_address: str,
        max_db_wait: float | None,
        health_file: Path | None,
        health_port: int | None,
        health_address: str,
        verbosity: int,
        processes: int = 1,
        max_jobs_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        timeout_grace: float = 10.0,
        **options: Any,
    ) -> None:
        level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
        logging.getLogger("django_workhorse").setLevel(level)
        child = children.child_identity()
        if child is not None:  # the supervisor serves the health file and port, not each child
            health_file = health_port = None
        health = serving_health(
            database=database, file=health_file, port=health_port, address=health_address, heartbeat=lease / 3
        )
        with console_logging(self.stderr, level), health as health_state:
            # Handlers register on import: load every installed app's tasks module, as the web
            # process may import them only from views the worker never loads.
            autodiscover_modules("tasks")
            report_left_out_schedules()
            listen = database if listen_database is None else (None if listen_database == "none" else listen_database)
            if child is None and processes > 1:
                check_process_options(max_jobs=max_jobs, metrics_port=metrics_port, memory=max_memory_per_child)
                try:
                    supervisor.Supervisor(
                        get_child_arguments(),
                        processes=processes,
                        queues=queues,
                        concurrency=concurrency,
                        using=database,
                        burst=burst,
                        max_memory=max_memory_per_child,
                        timeout_grace=timedelta(seconds=timeout_grace),
                        heartbeat=timedelta(seconds=lease / 3),
                        max_db_wait=max_db_wait,
                        health=health_state,
                    ).run()
                except DatabaseUnavailableError as exc:
                    raise CommandError(str(exc), returncode=1) from exc
                return
            if child is None and (max_jobs_per_child or max_memory_per_child):
                raise CommandError("--max-jobs-per-child, --max-memory-per-child: need --processes 2..64", returncode=2)
            worker = Worker(
                queues=queues,
                concurrency=concurrency,
                batch=batch,
                lease=timedelta(seconds=lease),
                poll_interval=poll_interval,
                burst=burst,
                max_jobs=max_jobs if child is None else max_jobs_per_child,
                drain_timeout=timedelta(seconds=drain_timeout),
                using=database,
                listen_using=listen,
                scheduler=scheduler,
                max_db_wait=max_db_wait,
                health=health_state,
                **({} if child is None else supervised(child)),
            )
            if child is not None:
                watch_supervisor(worker, child)
            elif metrics_port is not None:
                serve_metrics(metrics_address, metrics_port)
            try:
                stats = worker.run()
            except WorkerThreadError as exc:
                # The worker stopped and released its jobs; a non-zero status tells its supervisor.
                raise CommandError(str(exc), returncode=1) from exc
            except DatabaseUnavailableError as exc:
                raise CommandError(str(exc), returncode=1) from exc
        if child is not None and max_jobs_per_child is not None and stats.claimed >= max_jobs_per_child:
            children.ChildReporter(child).recycling()
        if verbosity:
            self.stdout.write(f"Claimed {stats.claimed} job(s); finished: {stats.finished or 'none'}.")
