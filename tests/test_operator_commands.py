"""``manage.py workhorse_status``, ``workhorse_purge`` and ``workhorse_redrive``."""

from __future__ import annotations

import getpass
import json
import uuid
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from django_workhorse import (
    EnqueueOutcome,
    Idempotency,
    enqueue,
    enqueue_due_schedules,
    enqueue_with_result,
    pause_schedules,
    register,
    sql,
)
from django_workhorse.management.commands.workhorse_status import format_table, human_age
from django_workhorse.models import IdempotencyBinding, Job, JobEvent, JobStatus, Redrive, ScheduleState, WorkerRecord
from django_workhorse.operations import actions
from django_workhorse.schedules.definition import Schedule, next_tick
from tests.factories import JobFactory, WaitingStepFactory

pytestmark = pytest.mark.django_db
# What workhorse_status says of the per-minute rates in a process without shared counters.
NO_SHARED_COUNTERS = (
    "Duplicates saved and conflicts per minute need PROMETHEUS_MULTIPROC_DIR, shared with the processes "
    "that enqueue (this command's own process counts nothing)."
)

KEY = Idempotency("order:7", scope="orders")


class TTY(StringIO):
    """A captured stream that claims to be a terminal, so the progress bar is drawn."""

    def isatty(self) -> bool:
        return True


def run(*argv: str, stderr: StringIO | None = None, **options: Any) -> tuple[str, str]:
    """Run a command; return its stdout and stderr."""
    out, err = StringIO(), stderr if stderr is not None else StringIO()
    call_command(*argv, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def fails(*argv: str, **options: Any) -> tuple[CommandError, str, str]:
    """Run a command that must fail; return the error (exit status 1), its stdout and stderr."""
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as excinfo:
        call_command(*argv, stdout=out, stderr=err, **options)
    assert excinfo.value.returncode == 1
    return excinfo.value, out.getvalue(), err.getvalue()


def dead(queue: str = "default", *, attempt: int = 3, **fields: Any) -> Job:
    job: Job = JobFactory(
        queue=queue,
        status=JobStatus.DEAD,
        attempt=attempt,
        max_attempts=3,
        finished_at=timezone.now(),
        last_error="boom",
        **fields,
    )
    return job


def running(queue: str, worker: str = "") -> Job:
    now = timezone.now()
    job: Job = JobFactory(
        queue=queue,
        status=JobStatus.RUNNING,
        attempt=1,
        started_at=now,
        lease_token=uuid.uuid4(),
        lease_expires_at=now + timedelta(seconds=30),
        claimed_by=worker,
    )
    return job


def finished(status: JobStatus, ago: timedelta) -> Job:
    job: Job = JobFactory(status=status, attempt=1, finished_at=timezone.now() - ago)
    return job


# -- workhorse_status -------------------------------------------------------------------------------------


def test_status_says_so_when_there_are_no_jobs_and_no_workers():
    out, err = run("workhorse_status")

    assert out == (
        "Warnings\n"
        "None.\n"
        "\n"
        "Queues\n"
        "No jobs.\n"
        "\n"
        "Throughput (last 60 min)\n"
        "0 finished: 0 succeeded, 0 failed (dead or cancelled); 0.00 jobs/min\n"
        "\n"
        "Workers\n"
        "No workers registered.\n"
        "\n"
        "Schedules (times in UTC)\n"
        "No schedules evaluated yet.\n"
        "\n"
        "Idempotency keys by scope\n"
        "No live bindings.\n"
        f"{NO_SHARED_COUNTERS}\n"
    )
    assert err == ""


def test_status_tells_finished_jobs_apart_from_no_jobs_at_all():
    finished(JobStatus.SUCCEEDED, timedelta(days=1))

    out, _ = run("workhorse_status")

    assert "Queues\nNo queued, running or dead jobs.\n" in out
    assert "0 finished: 0 succeeded" in out  # a day ago is outside the hour


@pytest.fixture
def busy_queues() -> dict[str, Any]:
    """Two queues with jobs in every state, finished jobs in and out of the hour, and two workers."""
    now = timezone.now()
    JobFactory.create_batch(3, queue="mail", run_at=now - timedelta(minutes=4, seconds=10))
    JobFactory(queue="mail", run_at=now - timedelta(seconds=30))
    JobFactory.create_batch(2, queue="mail", run_at=now + timedelta(hours=1))
    running_mail = [running("mail", worker="w1") for _ in range(2)]
    dead("mail")
    WaitingStepFactory.create_batch(3, queue="mail")  # workflow steps their parents have not released
    JobFactory(queue="billing", run_at=now + timedelta(minutes=5))
    running_billing = running("billing", worker="w2")
    dead("billing")
    dead("billing")
    for _ in range(3):
        finished(JobStatus.SUCCEEDED, timedelta(minutes=10))
    finished(JobStatus.CANCELLED, timedelta(minutes=20))
    finished(JobStatus.SUCCEEDED, timedelta(hours=2))  # outside the hour
    WorkerRecord.objects.create(
        name="w1",
        host="host-a",
        pid=101,
        queues=["mail", "billing"],
        concurrency=4,
        started_at=now - timedelta(hours=1),
        heartbeat_at=now - timedelta(minutes=10),
    )
    WorkerRecord.objects.create(
        name="w2",
        host="host-b",
        pid=202,
        queues=["billing"],
        concurrency=1,
        started_at=now - timedelta(hours=1),
        heartbeat_at=now - timedelta(minutes=3),
    )
    return {"mail": [job.pk for job in running_mail], "billing": [running_billing.pk]}


def database_depth(queue: str) -> dict[str, int]:
    """Count the jobs of ``queue`` straight from the table."""
    jobs, now = Job.objects.filter(queue=queue), timezone.now()
    return {
        "waiting": jobs.filter(status=JobStatus.WAITING).count(),
        "ready": jobs.filter(status=JobStatus.QUEUED, run_at__lte=now).count(),
        "scheduled": jobs.filter(status=JobStatus.QUEUED, run_at__gt=now).count(),
        "running": jobs.filter(status=JobStatus.RUNNING).count(),
        "dead": jobs.filter(status=JobStatus.DEAD).count(),
        "failing": jobs.filter(status=JobStatus.QUEUED, attempt__gt=0).exclude(last_error="").count(),
        "no_handler": 0,  # the registry rows here say nothing of their job types: they run any
    }


def test_status_json_matches_the_database(busy_queues):
    out, _ = run("workhorse_status", "--json")

    report = json.loads(out)
    assert set(report) == {
        "warnings", "queues", "paused_queues", "throughput", "workers", "schedules", "schedules_left_out", "scopes",
        "breakers", "fair_queues", "rate_limits", "workflows",
    }  # fmt: skip
    assert report["paused_queues"] == []
    assert report["breakers"] == []
    assert report["fair_queues"] == []
    assert report["rate_limits"] == []
    # w1 takes mail but its heartbeat is stale; the factory's job type has no handler.
    assert report["warnings"] == [
        {
            "kind": "queue_without_worker",
            "message": "Ready jobs in queues no live worker takes",
            "names": [{"name": "mail", "jobs": 4}],
            "more": 0,
        },
        {
            "kind": "unknown_job_type",
            "message": "Queued jobs of types no handler in this process knows",
            "names": [{"name": "tests.noop", "jobs": 7}],
            "more": 0,
        },
    ]
    assert report["schedules"] == [] and report["schedules_left_out"] == []
    queues = {row.pop("queue"): row for row in report["queues"]}
    assert list(queues) == ["billing", "mail"]
    ages = {name: row.pop("oldest_ready_age_seconds") for name, row in queues.items()}
    assert queues == {name: database_depth(name) for name in queues}
    assert queues["mail"] == {
        "waiting": 3,
        "ready": 4,
        "scheduled": 2,
        "running": 2,
        "dead": 1,
        "failing": 0,
        "no_handler": 0,
    }
    assert queues["billing"] == {
        "waiting": 0,
        "ready": 0,
        "scheduled": 1,
        "running": 1,
        "dead": 2,
        "failing": 0,
        "no_handler": 0,
    }
    assert ages["billing"] is None  # no ready job
    assert 250 <= ages["mail"] < 250 + 30
    finished_in_hour = Job.objects.filter(finished_at__gte=timezone.now() - timedelta(minutes=60))
    assert report["throughput"] == {
        "minutes": 60,
        "succeeded": finished_in_hour.filter(status=JobStatus.SUCCEEDED).count(),
        "failed": finished_in_hour.exclude(status=JobStatus.SUCCEEDED).count(),
    }
    assert report["throughput"] == {"minutes": 60, "succeeded": 3, "failed": 4}  # 3 dead now, 1 cancelled
    workers = {worker["name"]: worker for worker in report["workers"]}
    assert list(workers) == ["w1", "w2"]
    assert {k: workers["w1"][k] for k in ("host", "pid", "queues", "concurrency", "running_job_ids")} == {
        "host": "host-a",
        "pid": 101,
        "queues": ["mail", "billing"],
        "concurrency": 4,
        "running_job_ids": busy_queues["mail"],
    }
    assert workers["w2"]["running_job_ids"] == busy_queues["billing"]
    assert 600 <= workers["w1"]["heartbeat_age_seconds"] < 630
    record = WorkerRecord.objects.get(name="w1")
    assert workers["w1"]["heartbeat_at"] == record.heartbeat_at.isoformat()
    assert workers["w1"]["started_at"] == record.started_at.isoformat()


def test_status_prints_tables_with_the_same_numbers(busy_queues):
    out, err = run("workhorse_status")

    mail_running = ", ".join(map(str, busy_queues["mail"]))
    billing_running = str(busy_queues["billing"][0])
    width = max(len("running jobs"), len(mail_running))
    assert out == (
        "Warnings\n"
        "Ready jobs in queues no live worker takes (1): mail (4 ready)\n"
        "Queued jobs of types no handler in this process knows (1): tests.noop (7 queued)\n"
        "\n"
        "Queues\n"
        "queue    waiting  ready  scheduled  failing  no handler  running  dead  oldest ready\n"
        "-------  -------  -----  ---------  -------  ----------  -------  ----  ------------\n"
        "billing        0      0          1        0           0        1     2             -\n"
        "mail           3      4          2        0           0        2     1         4 min\n"
        "\n"
        "Throughput (last 60 min)\n"
        "7 finished: 3 succeeded, 4 failed (dead or cancelled); 0.12 jobs/min\n"
        "\n"
        "Workflows\n"  # the three waiting steps' workflows
        "3 running, 0 blocked (a dead step holds the rest back); "
        "finished in the last 60 min: 0 succeeded, 0 failed, 0 cancelled\n"
        "\n"
        "Workers\n"
        "name  host    pid  kind    state    queues        last heartbeat  running jobs\n"
        f"----  ------  ---  ------  -------  ------------  --------------  {'-' * width}\n"
        f"w1    host-a  101  worker  running  mail,billing      10 min ago  {mail_running}\n"
        f"w2    host-b  202  worker  running  billing            3 min ago  {billing_running}\n"
        "\n"
        "Schedules (times in UTC)\n"
        "No schedules evaluated yet.\n"
        "\n"
        "Idempotency keys by scope\n"
        "No live bindings.\n"
        f"{NO_SHARED_COUNTERS}\n"
    )
    assert err == ""


def test_status_reads_the_given_database():
    JobFactory(queue="mail")

    report = json.loads(run("workhorse_status", "--json", "--database", "default")[0])

    assert [row["queue"] for row in report["queues"]] == ["mail"]


SCHEDULE_TASK = "tests.operator_commands.tick"
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=dt_timezone.utc)
YEARLY = {"task": SCHEDULE_TASK, "cron": "0 9 1 1 *", "timezone": "Europe/Paris"}
MINUTELY = {"task": SCHEDULE_TASK, "every": timedelta(minutes=1)}


@register(SCHEDULE_TASK)
def scheduled_handler(payload):
    return payload


@pytest.fixture
def schedules() -> dict[str, int | None]:
    """Three stored schedules: yearly (active), minutely (paused, one job), gone (inactive, one job);
    return each one's last job."""
    with override_settings(WORKHORSE_SCHEDULES={"yearly": YEARLY, "minutely": MINUTELY, "gone": MINUTELY}):
        enqueue_due_schedules(T0)
        enqueue_due_schedules(T0 + timedelta(seconds=61))
    with override_settings(WORKHORSE_SCHEDULES={"yearly": YEARLY, "minutely": MINUTELY}):
        enqueue_due_schedules(T0 + timedelta(seconds=62))
        pause_schedules(["minutely"])
    return dict(ScheduleState.objects.values_list("name", "last_job_id"))


@override_settings(WORKHORSE_SCHEDULES={"yearly": YEARLY, "minutely": MINUTELY})
def test_status_shows_the_schedules(schedules):
    expected_tick = next_tick(Schedule("0 9 1 1 *", timezone="Europe/Paris"), timezone.now())
    assert expected_tick is not None and expected_tick.hour == 8  # 09:00 in Paris, in winter

    out, err = run("workhorse_status")
    report = json.loads(run("workhorse_status", "--json")[0])

    table = format_table(
        ["name", "expression", "zone", "next tick", "last tick", "last job", "state"],
        [
            ["gone", "every 0:01:00", "UTC", "-", "2026-06-01 12:01:00", f"{schedules['gone']} (queued)", "inactive"],
            [
                "minutely",
                "every 0:01:00",
                "UTC",
                "-",
                "2026-06-01 12:01:00",
                f"{schedules['minutely']} (queued)",
                "paused",
            ],
            ["yearly", "0 9 1 1 *", "Europe/Paris", f"{expected_tick:%Y-%m-%d %H:%M:%S}", "-", "-", "active"],
        ],
    )
    assert "\n\nSchedules (times in UTC)\n" + "\n".join(table) + "\n\nIdempotency keys by scope\n" in out
    assert err == ""
    by_name = {row["name"]: row for row in report["schedules"]}
    assert list(by_name) == ["gone", "minutely", "yearly"]
    assert by_name["yearly"]["next_ticks"][0] == expected_tick.isoformat()
    assert len(by_name["yearly"]["next_ticks"]) == 5
    assert by_name["minutely"] == {
        "name": "minutely",
        "task": SCHEDULE_TASK,
        "expression": "every 0:01:00",
        "timezone": "UTC",
        "state": "paused",
        "active": True,
        "paused": True,
        "declared_here": True,
        "next_ticks": [],
        "last_tick_at": "2026-06-01T12:01:00+00:00",
        "last_job_id": schedules["minutely"],
        "last_job_status": "queued",
        "last_skip_at": None,
        "last_skip_reason": "",
    }
    assert (by_name["gone"]["state"], by_name["gone"]["declared_here"]) == ("inactive", False)
    assert by_name["gone"]["expression"] == "every 0:01:00"  # from its stored definition


@pytest.mark.parametrize(
    ("age", "text"),
    [
        (None, "-"),
        (timedelta(0), "0.0 s"),
        (timedelta(seconds=3.24), "3.2 s"),
        (timedelta(seconds=59.9), "59.9 s"),
        (timedelta(minutes=4, seconds=59), "4 min"),
        (timedelta(minutes=59, seconds=59), "59 min"),
        (timedelta(hours=2, minutes=30), "2.5 h"),
        (timedelta(days=3), "3.0 d"),
    ],
)
def test_ages_are_shown_in_a_human_form(age, text):
    assert human_age(age) == text


# -- workhorse_purge ------------------------------------------------------------------------------------------


def test_purge_deletes_the_queued_jobs_of_the_queue_only_and_releases_their_keys():
    keyed = enqueue("t", {"n": 1}, queue="mail", idempotency=KEY)
    enqueue("t", {"n": 2}, queue="mail", run_at=timezone.now() + timedelta(hours=1))
    kept = {enqueue("t", {"n": 3}, queue="other"), running("mail").pk, dead("mail").pk}

    out, err = run("workhorse_purge", "--queue", "mail")

    assert (out, err) == ("Purged 2 queued job(s) from queue mail.\n", "")
    assert set(Job.objects.values_list("pk", flat=True)) == kept
    assert not IdempotencyBinding.objects.exists() and not JobEvent.objects.filter(job_id=keyed).exists()
    again = enqueue_with_result("t", {"n": 1}, queue="mail", idempotency=KEY)
    assert again.outcome == EnqueueOutcome.ACCEPTED and again.job_id != keyed


def test_purge_dry_run_counts_the_queued_jobs_of_the_queue_and_deletes_nothing():
    enqueue("t", {"n": 1}, queue="mail", idempotency=KEY)
    enqueue("t", {"n": 2}, queue="mail")
    enqueue("t", {"n": 3}, queue="other")
    running("mail")
    before = (Job.objects.count(), IdempotencyBinding.objects.count(), JobEvent.objects.count())

    out, err = run("workhorse_purge", "--queue", "mail", "--dry-run")

    assert (out, err) == ("Would purge 2 queued job(s) from queue mail.\n", "")
    assert (Job.objects.count(), IdempotencyBinding.objects.count(), JobEvent.objects.count()) == before
    assert enqueue_with_result("t", {"n": 1}, queue="mail", idempotency=KEY).outcome == EnqueueOutcome.REPLAYED


@pytest.mark.parametrize("argv", [(), ("--dry-run",), ("--database", "default")])
def test_purge_refuses_to_run_without_a_queue_or_job(argv):
    enqueue("t", {"n": 1})

    error, out, _ = fails("workhorse_purge", *argv)

    assert str(error) == "Give --queue NAME or --job ID: refusing to purge without a filter."
    assert out == ""
    assert Job.objects.count() == 1


def test_purge_by_job_id_purges_only_the_given_queued_jobs_and_names_the_rest():
    first, second, third = (enqueue("t", {"n": n}) for n in range(3))
    busy = running("default").pk

    out, err = run("workhorse_purge", "--job", str(first), "--job", str(third), "--job", str(busy), "--job", "999999")

    assert out == "Purged 2 queued job(s).\n"
    assert err == f"Skipping 2 job(s) that are not queued (or do not exist): {busy}, 999999.\n"
    assert set(Job.objects.values_list("pk", flat=True)) == {second, busy}


def test_purge_with_queue_and_job_purges_a_job_only_if_it_is_in_that_queue():
    mail = enqueue("t", {"n": 1}, queue="mail")
    other = enqueue("t", {"n": 2}, queue="other")

    out, err = run("workhorse_purge", "--queue", "mail", "--job", str(mail), "--job", str(other), "--dry-run")
    assert out == "Would purge 1 queued job(s) from queue mail.\n"
    assert err == f"Skipping 1 job(s) that are not queued in queue mail (or do not exist): {other}.\n"

    run("workhorse_purge", "--queue", "mail", "--job", str(mail), "--job", str(other))
    assert list(Job.objects.values_list("pk", flat=True)) == [other]


@pytest.mark.parametrize("value", ["0", "-3", "seven"])
def test_purge_rejects_a_job_id_that_is_not_a_positive_integer(value):
    with pytest.raises(CommandError, match="argument --job: must be a job id"):
        call_command("workhorse_purge", "--job", value)


def test_purge_is_quiet_at_verbosity_0():
    enqueue("t", {"n": 1}, queue="mail")
    assert run("workhorse_purge", "--queue", "mail", verbosity=0) == ("", "")
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_purge_deletes_a_large_queue_in_chunks_of_ids(monkeypatch):
    monkeypatch.setattr(actions, "PURGE_CHUNK", 2)
    calls: list[dict[str, Any]] = []
    real_statement = sql.housekeeping.purge_queued

    def spy(alias: str, **kwargs: Any) -> int:  # the real statement, one call per chunk
        calls.append(kwargs)
        return real_statement(alias, **kwargs)

    monkeypatch.setattr(sql.housekeeping, "purge_queued", spy)
    ids = [enqueue("t", {"n": n}, queue="mail") for n in range(5)]
    enqueue("t", {"n": 9}, queue="other")

    out, _ = run("workhorse_purge", "--queue", "mail")

    assert out == "Purged 5 queued job(s) from queue mail.\n"
    assert [call["job_ids"] for call in calls] == [ids[0:2], ids[2:4], ids[4:5]]
    assert {call["queue"] for call in calls} == {"mail"}
    assert list(Job.objects.values_list("queue", flat=True)) == ["other"]


def test_purge_draws_a_progress_bar_on_a_terminal_unless_told_not_to():
    for n in range(3):
        enqueue("t", {"n": n}, queue="mail")
    terminal = TTY()

    out, err = run("workhorse_purge", "--queue", "mail", stderr=terminal)

    assert out == "Purged 3 queued job(s) from queue mail.\n"
    assert "Purging" in err and "3/3" in err

    enqueue("t", {"n": 4}, queue="mail")
    assert run("workhorse_purge", "--queue", "mail", "--no-progress", stderr=TTY()) == (
        "Purged 1 queued job(s) from queue mail.\n",
        "",
    )


# -- workhorse_redrive ----------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _os_user(monkeypatch):
    monkeypatch.setattr(getpass, "getuser", lambda: "alice")


def test_redrive_runs_dead_jobs_again_as_new_jobs_and_records_the_lineage():
    first, second = dead("mail", attempt=3), dead("mail", attempt=2)

    out, err = run("workhorse_redrive", str(first.pk), str(second.pk), "--reason", "fixed the bug")

    lineage = list(Redrive.objects.order_by("source_id").values_list("source_id", "new_job_id", "request_id"))
    assert lineage == [
        (first.pk, lineage[0][1], f"cli:{first.pk}:3"),
        (second.pk, lineage[1][1], f"cli:{second.pk}:2"),
    ]
    assert out == (
        f"Redrove job {first.pk} as {lineage[0][1]}.\n"
        f"Redrove job {second.pk} as {lineage[1][1]}.\n"
        "Redrove 2 job(s); 0 already redriven; 0 failed.\n"
    )
    assert err == ""
    assert set(Redrive.objects.values_list("requested_by", "reason")) == {("cli:alice", "fixed the bug")}
    new = Job.objects.get(pk=lineage[0][1])
    assert (new.status, new.queue, new.payload, new.root_id) == (JobStatus.QUEUED, "mail", first.payload, first.pk)
    assert Job.objects.get(pk=first.pk).status == JobStatus.DEAD  # the dead letter stays


def test_running_the_same_redrive_twice_redrives_once():
    source = dead()
    out, _ = run("workhorse_redrive", str(source.pk))
    new_id = Redrive.objects.get().new_job_id
    counts = (Job.objects.count(), Redrive.objects.count(), JobEvent.objects.count())

    again, err = run("workhorse_redrive", str(source.pk))

    assert out == f"Redrove job {source.pk} as {new_id}.\nRedrove 1 job(s); 0 already redriven; 0 failed.\n"
    assert again == (
        f"Job {source.pk} was already redriven as {new_id} (request id cli:{source.pk}:3).\n"
        "Redrove 0 job(s); 1 already redriven; 0 failed.\n"
    )
    assert err == ""
    assert (Job.objects.count(), Redrive.objects.count(), JobEvent.objects.count()) == counts


def test_a_given_request_id_is_suffixed_with_the_job_id_and_makes_a_new_redrive():
    source = dead()
    run("workhorse_redrive", str(source.pk))

    run("workhorse_redrive", str(source.pk), "--request-id", "ticket-42")
    run("workhorse_redrive", str(source.pk), "--request-id", "ticket-42")

    assert sorted(Redrive.objects.values_list("request_id", flat=True)) == [
        f"cli:{source.pk}:3",
        f"ticket-42:{source.pk}",
    ]
    assert Job.objects.filter(root_id=source.pk).count() == 2


def test_reusing_a_request_id_with_another_reason_is_a_conflict_and_creates_nothing():
    source = dead()
    run("workhorse_redrive", str(source.pk), "--reason", "first")
    jobs = Job.objects.count()

    error, out, err = fails("workhorse_redrive", str(source.pk), "--reason", "second")

    assert str(error) == "1 job(s) could not be redriven."
    assert out == "Redrove 0 job(s); 0 already redriven; 1 failed.\n"
    assert err.startswith(f"Job {source.pk} was not redriven: redrive 'cli:{source.pk}:3' of job {source.pk}")
    assert "differs in reason" in err
    assert Job.objects.count() == jobs

    _, out, err = fails("workhorse_redrive", str(source.pk), "--reason", "second", "--dry-run")
    assert "would not be redriven" in err and out.endswith("0 already redriven; 1 failed.\n")


def test_requested_by_falls_back_to_cli_without_an_os_user(monkeypatch):
    def no_user() -> str:
        raise OSError("no user")

    monkeypatch.setattr(getpass, "getuser", no_user)
    source = dead()

    run("workhorse_redrive", str(source.pk))

    assert Redrive.objects.get().requested_by == "cli"


def test_redrive_dry_run_lists_what_would_be_redriven_and_writes_nothing():
    already, fresh = dead("mail"), dead("mail", job_type="tests.mailer")
    run("workhorse_redrive", str(already.pk))
    earlier = Redrive.objects.get().new_job_id
    counts = (Job.objects.count(), Redrive.objects.count(), JobEvent.objects.count())

    out, err = run("workhorse_redrive", str(already.pk), str(fresh.pk), "--dry-run")

    assert out == (
        f"Job {already.pk} was already redriven as {earlier} (request id cli:{already.pk}:3).\n"
        f"Would redrive job {fresh.pk} (tests.mailer on queue mail).\n"
        "Would redrive 1 job(s); 1 already redriven; 0 failed.\n"
    )
    assert err == ""
    assert (Job.objects.count(), Redrive.objects.count(), JobEvent.objects.count()) == counts

    out, _ = run("workhorse_redrive", "--all-dead", "--queue", "mail", "--dry-run")
    assert out.endswith("Would redrive 1 job(s); 1 already redriven; 0 failed.\n")
    assert (Job.objects.count(), Redrive.objects.count(), JobEvent.objects.count()) == counts


def test_bad_ids_fail_the_command_after_the_good_ones_are_redriven():
    good, also_good = dead(), dead()
    queued = JobFactory().pk

    error, out, err = fails("workhorse_redrive", "999999", str(good.pk), str(queued), str(also_good.pk))

    assert str(error) == "2 job(s) could not be redriven."
    assert err == (f"Job 999999 does not exist.\nJob {queued} is queued, not dead: only dead jobs can be redriven.\n")
    assert set(Redrive.objects.values_list("source_id", flat=True)) == {good.pk, also_good.pk}
    assert out.endswith("Redrove 2 job(s); 0 already redriven; 2 failed.\n")

    _, out, err = fails("workhorse_redrive", "999999", "--dry-run")
    assert (out, err) == ("Would redrive 0 job(s); 0 already redriven; 1 failed.\n", "Job 999999 does not exist.\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--all-dead",), "--all-dead needs --queue NAME."),
        (("--all-dead", "--dry-run"), "--all-dead needs --queue NAME."),
        (("1", "--all-dead", "--queue", "mail"), "Give job ids or --all-dead --queue NAME, not both."),
        (("1", "--queue", "mail"), "--queue is only used with --all-dead."),
        ((), "Give the ids of dead jobs, or --all-dead --queue NAME."),
    ],
)
def test_redrive_refuses_unclear_requests(argv, message):
    source = dead("mail")

    error, out, _ = fails("workhorse_redrive", *argv)

    assert str(error) == message and out == ""
    assert not Redrive.objects.exists() and Job.objects.get().pk == source.pk


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("0",), "argument JOB_ID: must be a job id"),
        (("1", "--request-id", ""), "argument --request-id: must be 1..160 characters"),
        (("1", "--request-id", "x" * 161), "argument --request-id: must be 1..160 characters"),
    ],
)
def test_redrive_rejects_invalid_arguments(argv, message):
    with pytest.raises(CommandError, match=message):
        call_command("workhorse_redrive", *argv)


@pytest.mark.django_db(transaction=True)
def test_all_dead_redrives_every_dead_job_of_the_queue_once():
    sources = [dead("mail") for _ in range(3)]
    other = dead("other")
    JobFactory(queue="mail")  # queued: not a dead letter

    out, err = run("workhorse_redrive", "--all-dead", "--queue", "mail", "--request-id", "incident-7")
    again, _ = run("workhorse_redrive", "--all-dead", "--queue", "mail", "--request-id", "incident-7")

    lineage = dict(Redrive.objects.values_list("source_id", "new_job_id"))
    assert sorted(lineage) == [source.pk for source in sources]
    assert out == "".join(f"Redrove job {s.pk} as {lineage[s.pk]}.\n" for s in sources) + (
        "Redrove 3 job(s); 0 already redriven; 0 failed.\n"
    )
    assert again.endswith("Redrove 0 job(s); 3 already redriven; 0 failed.\n")
    assert err == ""
    assert set(Redrive.objects.values_list("request_id", flat=True)) == {f"incident-7:{s.pk}" for s in sources}
    assert not Redrive.objects.filter(source_id=other.pk).exists()
    assert Job.objects.filter(queue="mail", status=JobStatus.QUEUED).count() == 1 + 3


def test_all_dead_draws_a_progress_bar_on_a_terminal():
    for _ in range(2):
        dead("mail")

    out, err = run("workhorse_redrive", "--all-dead", "--queue", "mail", stderr=TTY())

    assert "Redriving" in err and "2/2" in err
    assert out.endswith("Redrove 2 job(s); 0 already redriven; 0 failed.\n")
    assert run("workhorse_redrive", "--all-dead", "--queue", "mail", "--no-progress", stderr=TTY())[1] == ""


def test_redrive_is_quiet_at_verbosity_0_but_still_reports_failures():
    source = dead()

    assert run("workhorse_redrive", str(source.pk), verbosity=0) == ("", "")
    _, out, err = fails("workhorse_redrive", "999999", verbosity=0)
    assert (out, err) == ("", "Job 999999 does not exist.\n")


def test_purge_reports_each_chunk_it_deletes(monkeypatch):
    monkeypatch.setattr(actions, "PURGE_CHUNK", 2)
    for n in range(5):
        enqueue("t", {"n": n}, queue="mail")
    chunks: list[int] = []
    assert actions.purge(queue="mail", on_progress=chunks.append) == 5
    assert chunks == [2, 2, 1]
    assert not Job.objects.exists()
