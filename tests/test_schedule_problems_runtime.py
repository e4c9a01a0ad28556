"""A bad WORKHORSE_SCHEDULES entry stops nothing but itself, in real ``manage.py`` processes.

``tests.settings_bad_schedule`` declares an invalid cron (workhorse.E203) and arguments that cannot
be stored (workhorse.E208) beside a good every-second schedule. The worker and the scheduler leave
the two out (logged at ERROR, counted in ``workhorse_schedules_left_out``) and run the rest;
``workhorse_status`` shows them; ``manage.py check`` still fails on them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings

from django_workhorse import ScheduleDefinitionError, enqueue, enqueue_due_schedules, run_schedule_now, task
from django_workhorse.models import Job, JobStatus, ScheduleEvent, ScheduleState
from tests import settings_bad_schedule
from tests.pgbouncer import _free_port
from tests.processes import WorkerProcess, subprocess_database_url, worker_spawner
from tests.test_admin import confirm, login, messages_of, post_action
from tests.test_admin_schedules import SCHEDULES, VIEW
from tests.test_metrics import metrics_of_port
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = "tests.settings_bad_schedule"
MANAGE = [sys.executable, "-m", "django"]
TASK = "shop.send_confirmation"
LEFT_OUT = [
    "Schedule left out name=bad-cron check=workhorse.E203 origin=WORKHORSE_SCHEDULES['bad-cron']: ",
    "Schedule left out name=bad-arguments check=workhorse.E208 origin=WORKHORSE_SCHEDULES['bad-arguments']: "
    "its arguments do not fit task 'shop.send_confirmation'",
]


@pytest.fixture
def manage(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``python -m django <command> ...`` with the bad schedules (system checks included)."""
    with worker_spawner(tmp_path, MANAGE, settings=SETTINGS) as start:
        yield start


REGIONAL = "tests.schedule_problems_runtime.regional"


@task(name=REGIONAL)
def regional(region: str) -> str:
    return region


def assert_manage_py_check_fails_on_the_bad_schedules() -> None:
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), "DJANGO_SETTINGS_MODULE": SETTINGS}
    checked = subprocess.run([*MANAGE, "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    assert checked.returncode == 1, checked
    assert "(workhorse.E203) Schedule 'bad-cron' (WORKHORSE_SCHEDULES['bad-cron'])" in checked.stderr
    assert "(workhorse.E208) Schedule 'bad-arguments' (WORKHORSE_SCHEDULES['bad-arguments'])" in checked.stderr
    assert "'good'" not in checked.stderr


def good_ticks() -> list[Job]:
    return list(Job.objects.filter(job_type=TASK, scheduled_for__isnull=False))


def alive(process: WorkerProcess, predicate: Callable[[], object]) -> Callable[[], object]:
    """``predicate``, failing at once (with the output) if the process has exited."""

    def check() -> object:
        assert process.popen.poll() is None, f"exited with {process.popen.returncode}:\n{process.output()}"
        return predicate()

    return check


def test_a_worker_leaves_the_bad_schedules_out_and_runs_the_good_one_and_the_jobs(manage):
    job_id = enqueue(TASK, {"order_id": 1})
    port = _free_port()
    worker = manage(
        "workhorse_worker", "--poll-interval", "0.05", "--listen-database", "none", "--metrics-port", str(port)
    )

    done = Job.objects.filter(status=JobStatus.SUCCEEDED)
    wait_for(alive(worker, lambda: done.filter(pk=job_id).exists()), 60, what="the worker to run a job")
    wait_for(alive(worker, lambda: done.filter(scheduled_for__isnull=False).exists()), 60, what="a good tick to run")
    left_out = ("workhorse_schedules_left_out", frozenset({("check", "workhorse.E203")}))
    samples = wait_for(alive(worker, lambda: metrics_of_port(port)), 60, what="the worker's metrics")

    assert samples[left_out] == 1
    assert samples[("workhorse_schedules_left_out", frozenset({("check", "workhorse.E208")}))] == 1
    assert samples[("workhorse_schedules_left_out", frozenset({("check", "workhorse.E205")}))] == 0
    assert {job.payload["order_id"] for job in good_ticks()} == {settings_bad_schedule.GOOD_ORDER_ID}
    worker.terminate()
    assert worker.wait() == 0, worker.output()
    output = worker.output()
    for line in LEFT_OUT:
        assert output.count(line) == 1, output  # once, as the worker starts, however many evaluations
    assert_manage_py_check_fails_on_the_bad_schedules()


def test_a_scheduler_leaves_the_bad_schedules_out_and_enqueues_the_good_ticks(manage):
    scheduler = manage("workhorse_scheduler")

    wait_for(alive(scheduler, good_ticks), 60, what="the scheduler to enqueue a good tick")

    scheduler.popen.terminate()
    assert scheduler.wait() == 0, scheduler.output()
    assert all(line in scheduler.output() for line in LEFT_OUT), scheduler.output()
    once = manage("workhorse_scheduler", "--once")
    assert once.wait() == 0, once.output()
    assert all(line in once.output() for line in LEFT_OUT), once.output()


def test_workhorse_status_shows_the_schedules_left_out(manage):
    status = manage("workhorse_status")
    assert status.wait() == 0, status.output()
    text = status.output()
    assert "Left out of the evaluations (2; as this process's code and settings declare them):" in text
    assert re.search(r"^bad-cron +workhorse\.E203 +WORKHORSE_SCHEDULES\['bad-cron'\]: ", text, re.M), text

    out = StringIO()
    with override_settings(WORKHORSE_SCHEDULES=settings_bad_schedule.WORKHORSE_SCHEDULES):
        call_command("workhorse_status", "--json", stdout=out)
    left_out = json.loads(out.getvalue())["schedules_left_out"]
    assert [(row["name"], row["check"], row["origin"]) for row in left_out] == [
        ("bad-cron", "workhorse.E203", "WORKHORSE_SCHEDULES['bad-cron']"),
        ("bad-arguments", "workhorse.E208", "WORKHORSE_SCHEDULES['bad-arguments']"),
    ]
    assert "hour" in left_out[0]["problem"] and "payload" in left_out[1]["problem"]


def test_run_now_of_a_schedule_whose_arguments_no_longer_fit_is_refused_and_the_others_run(
    client, django_user_model, settings
):
    fits = {"task": REGIONAL, "every": timedelta(hours=1), "kwargs": {"region": "eu"}}
    other = {"task": TASK, "every": timedelta(hours=1), "kwargs": {"order_id": 3}}
    settings.WORKHORSE_SCHEDULES = {"regional": fits, "other": other}
    enqueue_due_schedules()
    # Deployed since: the task's parameter is now "area", the stored schedule still passes "region".
    settings.WORKHORSE_SCHEDULES = {"regional": {**fits, "kwargs": {"area": "eu"}}, "other": other}
    login(client, django_user_model, "olga", VIEW + ("run_schedule_now",))

    preview = post_action(
        client, SCHEDULES, "run_selected_now", list(ScheduleState.objects.values_list("pk", flat=True))
    )
    response = confirm(client, SCHEDULES, preview)

    assert response.status_code == 200
    refused, ran = messages_of(response)
    assert refused.startswith("Schedule regional: the args/kwargs of schedule 'regional' must be arguments that fit")
    assert "TypeError: missing a required argument: 'region'" in refused
    assert ran.startswith("Ran 1 schedule(s) now: other → ")
    assert list(ScheduleEvent.objects.values_list("schedule__name", "kind")) == [("other", "run_now")]
    with transaction.atomic():
        with pytest.raises(ScheduleDefinitionError) as excinfo:
            run_schedule_now("regional", request_id="r-1")
        with connection.cursor() as cursor:  # the caller's transaction is still usable
            cursor.execute("SELECT 1")
    assert excinfo.value.field == "the args/kwargs of schedule 'regional'"
    assert Job.objects.filter(job_type=REGIONAL).count() == 0


def test_a_schedule_left_out_keeps_its_state_and_is_not_deactivated():
    good = {"nightly": {"task": TASK, "cron": "0 3 * * *", "kwargs": {"order_id": 1}}}
    broken = {"nightly": {"task": TASK, "cron": "0 25 * * *", "kwargs": {"order_id": 1}}}
    with override_settings(WORKHORSE_SCHEDULES=good):
        enqueue_due_schedules()
    before = ScheduleState.objects.get(name="nightly")

    with override_settings(WORKHORSE_SCHEDULES=broken):
        enqueue_due_schedules()
    after = ScheduleState.objects.get(name="nightly")

    assert (after.active, after.evaluated_until, after.definition) == (True, before.evaluated_until, before.definition)
