"""Failures in plain sight: a failed attempt logs a WARNING (retried) or an ERROR (dead) naming the job,
its attempt, its error's first line and its next run; and ``workhorse_worker`` prints its records to
the console when the project's logging shows them nowhere."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from django_workhorse import enqueue, register
from django_workhorse.models import Job, JobStatus
from django_workhorse.worker.execution import MAX_LOGGED_ERROR_CHARS, error_head
from tests.processes import worker_spawner
from tests.worker_tasks import always_fail, run_worker

pytestmark = pytest.mark.django_db(transaction=True)

EXECUTION = "django_workhorse.worker.execution"
WORKER_MAIN = Path(__file__).resolve().parent / "worker_main.py"
BURST = ("--burst", "--poll-interval", "0.05", "--listen-database", "none")
assert always_fail  # tests.worker_tasks registers "tests.always_fail" (raises ValueError("always broken"))


@register("tests.failure_logs.raise_message")
def raise_message(payload: dict[str, str]) -> None:
    raise ValueError(payload["message"])


def execution_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == EXECUTION]


# -- the records ------------------------------------------------------------------------------------


def test_a_failed_attempt_that_will_be_retried_logs_a_warning_with_its_next_run(caplog):
    caplog.set_level(logging.INFO, logger=EXECUTION)
    job_id = enqueue("tests.always_fail", {"n": 1}, max_attempts=3, queue="mail")

    run_worker(queues=["mail"])

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 1)
    [record] = execution_records(caplog)
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"Job failed, will retry id={job_id} type=tests.always_fail attempt=1/3 "
        f"next run_at={job.run_at.isoformat()} error=ValueError: always broken"
    )
    fields = {name: getattr(record, name) for name in ("job_id", "job_type", "queue", "attempt", "status", "run_at")}
    assert fields == {
        "job_id": job_id,
        "job_type": "tests.always_fail",
        "queue": "mail",
        "attempt": 1,
        "status": "queued",
        "run_at": job.run_at.isoformat(),
    }
    assert record.error == "ValueError: always broken"  # type: ignore[attr-defined]


def test_a_job_that_goes_dead_logs_an_error_saying_so_and_a_success_stays_info(caplog):
    caplog.set_level(logging.DEBUG, logger=EXECUTION)
    job_id = enqueue("tests.always_fail", {"n": 2}, max_attempts=1, priority=1)
    succeeded = enqueue("tests.record", {"n": 3})

    run_worker()

    assert Job.objects.get(pk=job_id).status == JobStatus.DEAD
    dead, success = execution_records(caplog)
    assert dead.levelno == logging.ERROR
    assert dead.getMessage() == (
        f"Job failed, dead id={job_id} type=tests.always_fail attempt=1/1 no more attempts "
        "error=ValueError: always broken"
    )
    assert (dead.job_id, dead.status, dead.attempt) == (job_id, "dead", 1)  # type: ignore[attr-defined]
    assert success.levelno == logging.INFO
    assert success.getMessage() == f"Finished job id={succeeded} type=tests.record attempt=1 status=succeeded"


def test_the_logged_error_is_its_first_line_escaped_and_bounded(caplog):
    caplog.set_level(logging.INFO, logger=EXECUTION)
    enqueue("tests.failure_logs.raise_message", {"message": "\x1b[2J" + "x" * 500 + "\nsecond line"}, max_attempts=2)

    run_worker()

    [record] = execution_records(caplog)
    logged = record.getMessage().partition(" error=")[2]
    assert logged == record.error  # type: ignore[attr-defined]
    assert logged.startswith("ValueError: \\x1b[2Jxxx") and logged.endswith("x...")
    assert len(logged) == MAX_LOGGED_ERROR_CHARS
    assert "\x1b" not in record.getMessage() and "second line" not in record.getMessage()


@pytest.mark.parametrize(
    ("error", "head"),
    [
        ("", ""),
        ("ValueError: boom\nTraceback (most recent call last):\n  ...", "ValueError: boom"),
        ("\nKeyError: 'k'\r\nmore", "KeyError: 'k'"),
        ("Bad: \u202eevil\x07", "Bad: \\u202eevil\\x07"),
        ("x" * MAX_LOGGED_ERROR_CHARS, "x" * MAX_LOGGED_ERROR_CHARS),
        ("x" * (MAX_LOGGED_ERROR_CHARS + 1), "x" * (MAX_LOGGED_ERROR_CHARS - 3) + "..."),
    ],
)
def test_error_head_is_the_first_line_escaped_and_bounded(error, head):
    assert error_head(error) == head


# -- the command's console handler -------------------------------------------------------------------


@contextmanager
def nothing_shows_workhorse_records() -> Iterator[logging.Logger]:
    """Cut django_workhorse off the root logger and from pytest's capture (which it attaches to the
    loggers that do not propagate when a test starts), as if the project configured no logging."""
    logger = logging.getLogger("django_workhorse")
    saved = logger.handlers[:]
    logger.handlers.clear()
    logger.propagate = False
    try:
        assert not logger.hasHandlers()
        yield logger
    finally:
        logger.propagate = True
        logger.handlers[:] = saved


def test_the_worker_command_prints_its_records_when_nothing_else_shows_them():
    job_id = enqueue("tests.always_fail", {"n": 4}, max_attempts=3)
    err = StringIO()

    with nothing_shows_workhorse_records() as logger:
        call_command("workhorse_worker", *BURST, stdout=StringIO(), stderr=err)
        assert logger.handlers == []  # only for the duration of the command

    lines = err.getvalue().splitlines()
    assert any(" INFO django_workhorse.worker.loop: Worker starting name=" in line for line in lines), lines
    retried = f" WARNING {EXECUTION}: Job failed, will retry id={job_id} type=tests.always_fail attempt=1/3 "
    assert any(retried in line for line in lines), lines


class Collect(logging.Handler):
    """A handler the project's logging configured: it keeps the records."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_worker_command_adds_nothing_when_logging_has_a_handler():
    enqueue("tests.always_fail", {"n": 5}, max_attempts=1)
    configured, err = Collect(), StringIO()

    with nothing_shows_workhorse_records() as logger:
        logger.addHandler(configured)
        call_command("workhorse_worker", *BURST, stdout=StringIO(), stderr=err)
        assert logger.handlers == [configured]

    assert err.getvalue() == ""
    assert [r.levelname for r in configured.records if r.name == EXECUTION] == ["ERROR"]


# -- real worker processes ------------------------------------------------------------------------


def worker_process_output(log_dir: Path, *options: str, settings: str = "tests.settings") -> str:
    """Run ``tests/worker_main.py`` (``manage.py workhorse_worker`` with the test handlers) to its end;
    return what it wrote to standard output and standard error."""
    with worker_spawner(log_dir, [sys.executable, str(WORKER_MAIN)], settings=settings) as start:
        process = start(*options)
        assert process.wait() == 0, process.output()
        return process.output()


def failing_jobs() -> dict[str, Any]:
    return {
        "retried": enqueue("tests.always_fail", {"n": 6}, max_attempts=3),
        "dead": enqueue("tests.always_fail", {"n": 7}, max_attempts=1),
    }


def test_a_worker_process_without_logging_settings_prints_its_start_and_its_failures(tmp_path):
    jobs = failing_jobs()

    output = worker_process_output(tmp_path, *BURST)  # tests.settings has no LOGGING

    lines = output.splitlines()
    assert any(" INFO django_workhorse.worker.loop: Worker starting name=" in line for line in lines), output
    retried = f" WARNING {EXECUTION}: Job failed, will retry id={jobs['retried']} type=tests.always_fail attempt=1/3 "
    dead = f" ERROR {EXECUTION}: Job failed, dead id={jobs['dead']} type=tests.always_fail attempt=1/1 "
    assert any(retried in line and line.endswith("error=ValueError: always broken") for line in lines), output
    assert any(dead in line and line.endswith("error=ValueError: always broken") for line in lines), output


def test_a_worker_process_whose_logging_has_a_handler_prints_through_that_handler_only(tmp_path):
    jobs = failing_jobs()

    output = worker_process_output(tmp_path, *BURST, settings="tests.settings_logging")

    lines = output.splitlines()
    assert "configured: INFO Worker starting" in output, output
    assert any(line.startswith(f"configured: WARNING Job failed, will retry id={jobs['retried']} ") for line in lines)
    assert any(line.startswith(f"configured: ERROR Job failed, dead id={jobs['dead']} ") for line in lines), output
    assert " INFO django_workhorse.worker.loop: " not in output  # the command added no handler
