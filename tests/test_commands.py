"""``manage.py workhorse_worker`` and ``manage.py workhorse_maintenance``."""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_workhorse import Idempotency, enqueue, once
from django_workhorse.management.commands.workhorse_worker import Command as WorkerCommand
from django_workhorse.models import EffectRecord, IdempotencyBinding, Job, JobStatus, WorkerRecord
from django_workhorse.tasks.registry import register
from tests.conftest import maintenance_held_elsewhere
from tests.factories import JobFactory
from tests.worker_tasks import CALLS

pytestmark = pytest.mark.django_db(transaction=True)

# Seconds options are bounded: more than a year is a typo (and inf would overflow timedelta).
SECONDS_BOUND = "argument {}: must be a number of seconds in (0, 31536000]"
# A burst run that polls fast and does not LISTEN.
BURST = ("--burst", "--poll-interval", "0.05", "--listen-database", "none")


@pytest.fixture(autouse=True)
def _restore_state() -> Iterator[None]:
    # The command sets the package's log level from --verbosity.
    package_logger = logging.getLogger("django_workhorse")
    level = package_logger.level
    CALLS.clear()
    yield
    CALLS.clear()
    package_logger.setLevel(level)


def parse(*argv: str) -> dict[str, Any]:
    """Parse ``argv`` as the worker command would (invalid options raise CommandError)."""
    parser = WorkerCommand().create_parser("manage.py", "workhorse_worker")
    return vars(parser.parse_args(list(argv)))


def run_command(*argv: str, **options: Any) -> str:
    out = StringIO()
    call_command(*argv, stdout=out, **options)
    return out.getvalue()


# -- workhorse_worker -------------------------------------------------------------------------------------


def test_burst_worker_runs_the_jobs_of_the_given_queues_and_no_others():
    jobs = {queue: enqueue("tests.record", {"queue": queue}, queue=queue) for queue in ("a", "b", "c")}

    output = run_command("workhorse_worker", *BURST, "--queues", "a,b")

    assert output == "Claimed 2 job(s); finished: {'succeeded': 2}.\n"
    assert sorted(call["queue"] for call in CALLS.items()) == ["a", "b"]
    statuses = dict(Job.objects.filter(pk__in=jobs.values()).values_list("queue", "status"))
    assert statuses == {"a": JobStatus.SUCCEEDED, "b": JobStatus.SUCCEEDED, "c": JobStatus.QUEUED}


def test_burst_worker_runs_the_default_queue_by_default_and_is_quiet_at_verbosity_0():
    job_id = enqueue("tests.record", {"n": 1})

    assert run_command("workhorse_worker", *BURST, verbosity=0) == ""
    assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED


def test_max_jobs_stops_the_worker_after_that_many_jobs():
    job_ids = [enqueue("tests.record", {"n": n}, priority=10 - n) for n in range(3)]

    output = run_command("workhorse_worker", "--max-jobs", "2", "--poll-interval", "0.05", "--listen-database", "none")

    assert output == "Claimed 2 job(s); finished: {'succeeded': 2}.\n"
    statuses = list(Job.objects.filter(pk__in=job_ids).order_by("id").values_list("status", flat=True))
    assert statuses == [JobStatus.SUCCEEDED, JobStatus.SUCCEEDED, JobStatus.QUEUED]


@pytest.mark.parametrize("concurrency", ["1", "100"])
def test_concurrency_bounds_are_accepted(concurrency):
    assert parse("--concurrency", concurrency)["concurrency"] == int(concurrency)
    assert (
        run_command("workhorse_worker", *BURST, "--concurrency", concurrency) == "Claimed 0 job(s); finished: none.\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--concurrency", "0"), "argument --concurrency: must be an integer in 1..100"),
        (("--concurrency", "101"), "argument --concurrency: must be an integer in 1..100"),
        (("--concurrency", "two"), "argument --concurrency: must be an integer in 1..100"),
        (("--batch", "0"), "argument --batch: must be an integer in 1..1000"),
        (("--batch", "1001"), "argument --batch: must be an integer in 1..1000"),
        (("--max-jobs", "0"), "argument --max-jobs: must be an integer in 1.."),
        (("--lease", "0"), SECONDS_BOUND.format("--lease")),
        (("--lease", "-5"), SECONDS_BOUND.format("--lease")),
        (("--lease", "nan"), SECONDS_BOUND.format("--lease")),
        (("--lease", "inf"), SECONDS_BOUND.format("--lease")),
        (("--lease", "1e300"), SECONDS_BOUND.format("--lease")),
        (("--lease", "31536000.5"), SECONDS_BOUND.format("--lease")),
        (("--poll-interval", "0"), SECONDS_BOUND.format("--poll-interval")),
        (("--drain-timeout", "soon"), SECONDS_BOUND.format("--drain-timeout")),
        (("--queues", ","), "argument --queues: must name at least one queue"),
        (("--queues", ""), "argument --queues: must name at least one queue"),
    ],
)
def test_invalid_options_raise_command_error_naming_the_option_and_its_bound(argv, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        parse(*argv)
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("workhorse_worker", *BURST, *argv)


def test_seconds_options_accept_their_bounds():
    parsed = parse("--lease", "31536000", "--poll-interval", "0.001", "--drain-timeout", "1e-3")
    assert (parsed["lease"], parsed["poll_interval"], parsed["drain_timeout"]) == (31536000.0, 0.001, 0.001)


def test_options_are_parsed_to_their_types_with_the_documented_defaults():
    defaults = parse()
    assert {name: defaults[name] for name in ("queues", "concurrency", "batch", "burst", "max_jobs")} == {
        "queues": ["default"],
        "concurrency": 1,
        "batch": None,
        "burst": False,
        "max_jobs": None,
    }
    assert (defaults["lease"], defaults["poll_interval"], defaults["drain_timeout"]) == (30.0, 1.0, 25.0)
    assert (defaults["database"], defaults["listen_database"]) == ("default", None)

    given = parse("--queues", " mail , billing,", "--batch", "1000", "--lease", "0.5", "--max-jobs", "7")
    assert (given["queues"], given["batch"], given["lease"], given["max_jobs"]) == (["mail", "billing"], 1000, 0.5, 7)


def test_a_running_worker_is_registered_and_a_clean_exit_deregisters_it():
    seen: list[tuple[Any, ...]] = []

    def look(payload: Any) -> None:
        seen.extend(WorkerRecord.objects.values_list("pid", "queues", "concurrency"))

    register("tests.look_at_workers", look)
    enqueue("tests.look_at_workers", {}, queue="reg")

    run_command("workhorse_worker", *BURST, "--queues", "reg", "--concurrency", "3")

    assert seen == [(os.getpid(), ["reg"], 3)]
    assert not WorkerRecord.objects.exists()


# -- workhorse_maintenance ------------------------------------------------------------------------------------


def test_maintenance_reports_what_it_did():
    now = timezone.now()
    enqueue("tests.record", {"n": 1}, idempotency=Idempotency("k", scope="tests"))
    IdempotencyBinding.objects.update(expires_at=now - timedelta(seconds=1))
    once("effect:k", lambda: {"done": True}, scope="tests")
    EffectRecord.objects.update(expires_at=now - timedelta(seconds=1))
    JobFactory(
        status=JobStatus.RUNNING, attempt=1, lease_token=uuid.uuid4(), lease_expires_at=now - timedelta(seconds=1)
    )
    JobFactory(status=JobStatus.SUCCEEDED, attempt=1, finished_at=now - timedelta(days=15))
    WorkerRecord.objects.create(
        name="gone",
        host="h",
        pid=1,
        queues=["default"],
        concurrency=1,
        started_at=now,
        heartbeat_at=now - timedelta(hours=1),
    )

    output = run_command("workhorse_maintenance")

    assert output == (
        "Pruned 1 expired binding(s).\n"
        "Reclaimed 1 job(s) with expired leases.\n"
        "Pruned 1 finished job(s).\n"
        "Pruned 0 finished workflow(s).\n"
        "Forgot 1 stale worker(s).\n"
        "Pruned 1 expired effect record(s).\n"
    )
    assert run_command("workhorse_maintenance") == (
        "Pruned 0 expired binding(s).\n"
        "Reclaimed 0 job(s) with expired leases.\n"
        "Pruned 0 finished job(s).\n"
        "Pruned 0 finished workflow(s).\n"
        "Forgot 0 stale worker(s).\n"
        "Pruned 0 expired effect record(s).\n"
    )
    assert run_command("workhorse_maintenance", verbosity=0) == ""


def test_maintenance_does_nothing_while_another_run_holds_the_lock():
    JobFactory(status=JobStatus.SUCCEEDED, attempt=1, finished_at=timezone.now() - timedelta(days=15))
    with maintenance_held_elsewhere():
        assert run_command("workhorse_maintenance") == "Another maintenance run holds the lock; nothing done.\n"

    assert Job.objects.count() == 1


def test_worker_command_imports_every_installed_apps_tasks_module(monkeypatch):
    imported = []
    monkeypatch.setattr("django_workhorse.management.commands.workhorse_worker.autodiscover_modules", imported.append)
    call_command("workhorse_worker", "--burst", "--queues", "nothing-here", verbosity=0)
    assert imported == ["tasks"]
