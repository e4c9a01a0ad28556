"""``workhorse_status`` warns of work no worker will run: ready jobs in a queue no live worker takes,
and queued jobs of a type no handler knows; and it shows the failing jobs (waiting for a retry)."""

from __future__ import annotations

import importlib
import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_workhorse.conf import app_settings
from django_workhorse.models import JobStatus, WorkerRecord
from tests.factories import JobFactory
from tests.worker_tasks import record

pytestmark = pytest.mark.django_db

KNOWN = "tests.record"
assert record  # tests.worker_tasks registers it
UNKNOWN = "tests.status_warnings.nobody_handles_this"
QUEUE_WARNING = "Ready jobs in queues no live worker takes"
TYPE_WARNING = "Queued jobs of types no handler in this process knows"


def status_json() -> dict[str, Any]:
    out = StringIO()
    call_command("workhorse_status", "--json", stdout=out)
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def status_text() -> str:
    out = StringIO()
    call_command("workhorse_status", stdout=out)
    return out.getvalue()


def warnings_section(text: str) -> list[str]:
    head, _, _ = text.partition("\n\nQueues\n")
    lines = head.splitlines()
    assert lines[0] == "Warnings"
    return lines[1:]


def warning(kind: str, names: dict[str, int], more: int = 0) -> dict[str, Any]:
    message = QUEUE_WARNING if kind == "queue_without_worker" else TYPE_WARNING
    listed = [{"name": name, "jobs": jobs} for name, jobs in names.items()]
    return {"kind": kind, "message": message, "names": listed, "more": more}


def worker(name: str, queues: list[str], heartbeat_ago: timedelta = timedelta(seconds=2)) -> WorkerRecord:
    now = timezone.now()
    record: WorkerRecord = WorkerRecord.objects.create(
        name=name,
        host="host",
        pid=1,
        queues=queues,
        concurrency=1,
        started_at=now - timedelta(hours=1),
        heartbeat_at=now - heartbeat_ago,
    )
    return record


def ready(queue: str = "default", job_type: str = KNOWN, count: int = 1, **fields: Any) -> None:
    JobFactory.create_batch(
        count, queue=queue, job_type=job_type, run_at=timezone.now() - timedelta(seconds=5), **fields
    )


# -- queues no live worker takes ------------------------------------------------------------------


def test_status_warns_of_ready_jobs_in_a_queue_no_worker_takes():
    ready("mail", count=3)
    ready("billing")
    worker("w1", ["billing"])

    assert status_json()["warnings"] == [warning("queue_without_worker", {"mail": 3})]
    assert warnings_section(status_text()) == [f"{QUEUE_WARNING} (1): mail (3 ready)"]


def test_status_does_not_warn_when_a_live_worker_takes_the_queue():
    ready("mail", count=3)
    worker("w1", ["billing", "mail"])

    assert status_json()["warnings"] == []
    assert warnings_section(status_text()) == ["None."]


def test_a_worker_whose_heartbeat_is_stale_takes_no_queue():
    ready("mail")
    worker("w1", ["mail"], heartbeat_ago=app_settings.WORKER_STALE_AFTER + timedelta(seconds=30))

    assert status_json()["warnings"] == [warning("queue_without_worker", {"mail": 1})]


def test_jobs_not_due_yet_running_or_dead_raise_no_queue_warning():
    JobFactory(queue="later", job_type=KNOWN, run_at=timezone.now() + timedelta(hours=1))
    JobFactory(queue="busy", job_type=KNOWN, status=JobStatus.RUNNING, attempt=1)
    JobFactory(queue="graveyard", job_type=KNOWN, status=JobStatus.DEAD, attempt=1, finished_at=timezone.now())

    assert status_json()["warnings"] == []


def test_a_queue_warning_lists_twenty_queues_most_ready_first_and_counts_the_rest():
    ready("big", count=3)
    ready("medium", count=2)
    for i in range(23):
        ready(f"q{i:02}")

    [found] = status_json()["warnings"]

    names = [(item["name"], item["jobs"]) for item in found["names"]]
    assert names == [("big", 3), ("medium", 2)] + [(f"q{i:02}", 1) for i in range(18)]
    assert found["more"] == 5
    [line] = warnings_section(status_text())
    assert line.startswith(f"{QUEUE_WARNING} (25): big (3 ready), medium (2 ready), q00 (1 ready), ")
    assert line.endswith("q17 (1 ready) and 5 more")


# -- job types no handler knows ---------------------------------------------------------------------


def test_status_warns_of_queued_jobs_of_a_type_no_handler_knows():
    worker("w1", ["default"])
    ready(job_type=UNKNOWN, count=2)
    JobFactory(job_type=UNKNOWN, run_at=timezone.now() + timedelta(hours=1))  # queued, not due: counted too
    ready(job_type=KNOWN)

    assert status_json()["warnings"] == [warning("unknown_job_type", {UNKNOWN: 3})]
    assert warnings_section(status_text()) == [f"{TYPE_WARNING} (1): {UNKNOWN} (3 queued)"]


def test_a_registered_handler_or_only_finished_jobs_raise_no_type_warning():
    worker("w1", ["default"])
    ready(job_type=KNOWN)
    JobFactory(job_type=UNKNOWN, status=JobStatus.DEAD, attempt=1, finished_at=timezone.now())
    JobFactory(job_type=UNKNOWN, status=JobStatus.SUCCEEDED, attempt=1, finished_at=timezone.now())

    assert status_json()["warnings"] == []


def test_a_type_warning_lists_twenty_types_and_counts_the_rest():
    worker("w1", ["default"])
    for i in range(22):
        ready(job_type=f"tests.status_warnings.gone_{i:02}")

    [found] = status_json()["warnings"]

    assert [item["name"] for item in found["names"]] == [f"tests.status_warnings.gone_{i:02}" for i in range(20)]
    assert found["more"] == 2


def _send_digest() -> None:
    return None


try:
    from django_workhorse.backends import _framework  # adds the django.tasks backend's resolver
except ImportError:  # neither django.tasks (Django 6.0+) nor the django-tasks backport
    send_digest = None
else:
    # A Task in a module its resolver may import.
    send_digest = importlib.import_module(_framework.FRAMEWORK).task()(_send_digest)


@pytest.mark.skipif(send_digest is None, reason="no tasks framework")
def test_a_type_the_django_tasks_resolver_finds_is_known():
    worker("w1", ["default"])
    ready(job_type=f"{__name__}.send_digest")
    ready(job_type=f"{__name__}._send_digest")  # a plain function, not a Task: no handler

    assert status_json()["warnings"] == [warning("unknown_job_type", {f"{__name__}._send_digest": 1})]


# -- names are escaped ------------------------------------------------------------------------------


def test_warning_names_are_escaped_in_text_and_exact_in_json():
    ready("mail\x1b[2J", job_type="tests.status_warnings.\u202egone")

    lines = warnings_section(status_text())

    assert lines == [
        f"{QUEUE_WARNING} (1): mail\\x1b[2J (1 ready)",
        f"{TYPE_WARNING} (1): tests.status_warnings.\\u202egone (1 queued)",
    ]
    names = [found["names"][0]["name"] for found in status_json()["warnings"]]
    assert names == ["mail\x1b[2J", "tests.status_warnings.\u202egone"]


# -- failing jobs ---------------------------------------------------------------------------------


def test_status_shows_the_failing_jobs_of_each_queue():
    worker("w1", ["mail", "billing"])
    ready("mail", attempt=1, last_error="ValueError: boom")  # its retry is due
    JobFactory(queue="mail", job_type=KNOWN, attempt=2, last_error="boom", run_at=timezone.now() + timedelta(hours=1))
    ready("mail")  # never ran
    ready("billing")

    queues = {row["queue"]: row for row in status_json()["queues"]}

    assert {name: row["failing"] for name, row in queues.items()} == {"billing": 0, "mail": 2}
    lines = status_text().split("\n\nQueues\n")[1].splitlines()
    assert lines[0] == "queue    waiting  ready  scheduled  failing  no handler  running  dead  oldest ready"
    assert [line.split()[:8] for line in lines[2:4]] == [
        ["billing", "0", "1", "0", "0", "0", "0", "0"],
        ["mail", "0", "2", "1", "2", "0", "0", "0"],
    ]
