"""Claims by capability (decision 0021, "Capability"): a worker claims only the job types it has
handlers for; a job no live worker can run waits, uses no attempt, and is reported; held out of the
due range, it no longer costs the claims of the jobs behind it."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.checks import WARNING
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_workhorse import EnqueueOptions, EnqueueRequest, enqueue_many
from django_workhorse import sql as workhorse_sql
from django_workhorse.checks import check_capabilities, check_schedules
from django_workhorse.conf import app_settings
from django_workhorse.models import JOB_READY_IDX, Job, JobEvent, JobStatus, WorkerRecord
from django_workhorse.observability.metrics import gauges
from django_workhorse.operations import stats
from django_workhorse.tasks.registry import register
from django_workhorse.worker.loop import HOLD_WITHOUT_HANDLER
from tests.test_admin import body, login
from tests.worker_tasks import WorkerThread, make_worker, running, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

X, Y = "tests.capability.x", "tests.capability.y"
OLD, NEW = [Y], [X, Y]
LEASE = timedelta(seconds=60)


@register(X)
def _x(payload: Any) -> None:
    return None


@register(Y)
def _y(payload: Any) -> None:
    return None


def enqueue_jobs(job_type: str, count: int, **options: Any) -> list[int]:
    requests = [EnqueueRequest(job_type, {"n": n}, EnqueueOptions(**options)) for n in range(count)]
    ids: list[int] = []
    for start in range(0, count, 1000):
        ids.extend(result.job_id for result in enqueue_many(requests[start : start + 1000]))
    return ids


def claimers(job_ids: list[int]) -> set[str]:
    claimed = JobEvent.objects.filter(job_id__in=job_ids, kind="claimed")
    return set(claimed.values_list("details__worker", flat=True))


# -- rolling deploy ---------------------------------------------------------------------------------------------------


def test_old_and_new_workers_side_by_side_run_every_job_once_and_no_x_on_the_old_one():
    xs, ys = enqueue_jobs(X, 500), enqueue_jobs(Y, 500)
    old = make_worker(name="old", job_types=OLD, concurrency=2, batch=10, burst=True)
    new = make_worker(name="new", job_types=NEW, concurrency=2, batch=10, burst=True)

    first, second = WorkerThread(old).start(), WorkerThread(new).start()
    first.join(120), second.join(120)

    assert set(Job.objects.filter(pk__in=xs + ys).values_list("status", "attempt")) == {(JobStatus.SUCCEEDED, 1)}
    assert claimers(xs) == {"new"}
    assert "old" in claimers(ys)  # both worked: the old one on what it can run
    assert not JobEvent.objects.filter(job_id__in=xs, kind__in=["failed", "held", "retry_scheduled"]).exists()


def test_with_only_the_old_worker_x_jobs_wait_unclaimed_and_are_reported(client, django_user_model):
    xs, ys = enqueue_jobs(X, 500), enqueue_jobs(Y, 500)

    with running(make_worker(name="old", job_types=OLD, concurrency=4, batch=25)):
        wait_for(lambda: Job.objects.filter(pk__in=ys, status=JobStatus.SUCCEEDED).count() == 500, timeout=120)
        assert WorkerRecord.objects.get(name="old").job_types == OLD

        assert set(Job.objects.filter(pk__in=xs).values_list("status", "attempt")) == {(JobStatus.QUEUED, 0)}
        assert not JobEvent.objects.filter(job_id__in=xs, kind__in=["claimed", "failed", "dead"]).exists()
        # Reported: workhorse_status (JSON and text), the gauge, the dashboard.
        warning = _status_warning("job_without_handler")
        assert warning["names"] == [{"name": X, "jobs": 500}]
        assert f"{X} (500 queued)" in _status_text()
        [queue] = _status_json()["queues"]
        assert (queue["queue"], queue["no_handler"]) == ("default", 500)
        [header, _, row] = _status_text().split("\n\nQueues\n")[1].splitlines()[:3]
        assert "failing  no handler  running" in header and row.split()[5] == "500"
        assert _gauge("workhorse_jobs_without_handler") == {("default", X): 500.0}
        login(client, django_user_model, "viewer", ("view_job",))
        page = body(client.get("/admin/workhorse/job/dashboard/"))
        assert 'data-field="without-handler"' in page and f"{X} in default (500 queued)" in page

    # Once a worker that runs X is live, nothing is reported (the one below is stale-free: fresh heartbeat).
    WorkerRecord.objects.create(
        name="new", host="h", pid=1, queues=["default"], concurrency=1, job_types=NEW,
        started_at=timezone.now(), heartbeat_at=timezone.now(),
    )  # fmt: skip
    assert stats.jobs_without_handler() == []


def test_a_worker_from_before_capabilities_counts_as_running_every_type():
    enqueue_jobs(X, 3)
    WorkerRecord.objects.create(
        name="legacy", host="h", pid=1, queues=["default"], concurrency=1, job_types=None,
        started_at=timezone.now(), heartbeat_at=timezone.now(),
    )  # fmt: skip
    assert stats.jobs_without_handler() == []


@pytest.mark.parametrize(
    ("job_types", "job_type", "runs"),
    [
        (None, X, True),
        ([X], X, True),
        ([Y], X, False),
        (["tests.*"], X, True),
        (["tests.capability.*"], "tests.capabilityx.y", False),
        (["tests.*"], "tests", False),
    ],
)
def test_can_run_matches_types_and_module_prefixes(job_types, job_type, runs):
    assert stats.can_run(job_types, job_type) is runs


def test_module_prefixes_become_escaped_like_patterns():
    assert workhorse_sql.claims.capability_parameters([X, "my_app.tasks.*", "a%b.*"]) == (
        [X],
        ["my\\_app.tasks.%", "a\\%b.%"],
    )


def test_a_claim_by_module_prefix_takes_only_that_modules_jobs():
    [inside] = enqueue_jobs("tests.capability.x", 1)
    enqueue_jobs("tests.capabilityx.y", 1)  # '.' is not a wildcard, nor is '_' in a module name
    enqueue_jobs("tests_capability.x", 1)

    jobs = workhorse_sql.claims.claim(
        "default", queues=["default"], limit=10, lease=LEASE, worker="w", job_types=["tests.capability.*"]
    )

    assert [job.id for job in jobs] == [inside]


# -- the hold: the claim's bound --------------------------------------------------------------------------------------


def _claim_plan(job_types: list[str]) -> list[dict[str, Any]]:
    """The claim's scans of workhorse_job that ran, in its generic plan (as a worker runs it)."""
    exact, patterns = workhorse_sql.claims.capability_parameters(job_types)
    params = {
        "queues": ["default"], "fair_queues": [], "fair_after": [], "fair_unkeyed": [], "limit": 50, "lease": LEASE,
        "worker": "explain", "job_types": exact, "job_type_patterns": patterns,
    }  # fmt: skip
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(workhorse_sql.claims.USE_GENERIC_PLANS_LOCALLY)
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + workhorse_sql.claims.CLAIM_CAPABLE, params)
        value = cursor.fetchone()[0]
        transaction.set_rollback(True)
    plan = (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]
    (cte,) = [node for node in _nodes(plan) if node.get("Subplan Name") == "CTE candidates"]
    return [n for n in _nodes(cte) if n.get("Relation Name") == "workhorse_job" and n["Actual Loops"] > 0]


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


def _rows_read(scans: list[dict[str, Any]]) -> int:
    return sum((node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"] for node in scans)


def _hold_all() -> int:
    held = 0
    while found := workhorse_sql.capability.hold_without_handler(
        "default", queues=["default"], hold=HOLD_WITHOUT_HANDLER, stale_after=app_settings.WORKER_STALE_AFTER
    ):
        held += found
    return held


def test_jobs_no_live_worker_can_run_are_held_out_of_the_claims_way():
    unrunnable = enqueue_jobs(X, 20_000)  # ahead of Y's in claim order
    enqueue_jobs(Y, 60)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE workhorse_job")
    WorkerRecord.objects.create(
        name="old", host="h", pid=1, queues=["default"], concurrency=1, job_types=OLD,
        started_at=timezone.now(), heartbeat_at=timezone.now(),
    )  # fmt: skip

    before = _claim_plan(OLD)
    assert _rows_read(before) >= 20_000  # the filter reads past every X job ahead

    assert _hold_all() == 20_000
    after = _claim_plan(OLD)
    assert [node.get("Index Name") for node in after] == [JOB_READY_IDX]
    assert _rows_read(after) <= 60  # the held X jobs are behind the due Y jobs now
    held = Job.objects.filter(pk__in=unrunnable)
    assert set(held.values_list("status", "attempt")) == {(JobStatus.QUEUED, 0)}
    assert not held.filter(held_since__isnull=True).exists() and not held.filter(run_at__lte=timezone.now()).exists()
    event = JobEvent.objects.filter(job_id=unrunnable[0], kind="held").get()
    assert event.details["reason"] == "no handler"


def test_a_job_a_live_worker_can_run_is_not_held():
    enqueue_jobs(X, 5)
    for name, job_types in (("old", OLD), ("new", NEW)):
        WorkerRecord.objects.create(
            name=name, host="h", pid=1, queues=["default"], concurrency=1, job_types=job_types,
            started_at=timezone.now(), heartbeat_at=timezone.now(),
        )  # fmt: skip
    assert _hold_all() == 0


def test_a_worker_that_can_run_held_jobs_gives_them_back_when_it_registers():
    xs = enqueue_jobs(X, 20)
    WorkerRecord.objects.create(
        name="old", host="h", pid=1, queues=["default"], concurrency=1, job_types=OLD,
        started_at=timezone.now(), heartbeat_at=timezone.now(),
    )  # fmt: skip
    assert _hold_all() == 20

    with running(make_worker(name="new", job_types=NEW)):  # the hold is 30 s: back at registration, not then
        wait_for(lambda: Job.objects.filter(pk__in=xs, status=JobStatus.SUCCEEDED).count() == 20, timeout=20)

    assert set(Job.objects.filter(pk__in=xs).values_list("attempt", "held_since")) == {(1, None)}


# -- helpers ----------------------------------------------------------------------------------------------------------


def _status_json() -> dict[str, Any]:
    out = StringIO()
    call_command("workhorse_status", "--json", stdout=out)
    return json.loads(out.getvalue())


def _status_warning(kind: str) -> dict[str, Any]:
    (found,) = [w for w in _status_json()["warnings"] if w["kind"] == kind]
    return found


def _status_text() -> str:
    out = StringIO()
    call_command("workhorse_status", stdout=out)
    return out.getvalue()


def _gauge(name: str) -> dict[tuple[str, ...], float]:
    families = {family.name: family for family in gauges._read()}
    return {tuple(sample.labels.values()): sample.value for sample in families[name].samples}


# -- the system check -------------------------------------------------------------------------------------------------

PROBE = "tests.task_import_probe"
TASKS = {"default": {"BACKEND": "django_workhorse.backends.WorkhorseBackend", "QUEUES": []}}


@pytest.fixture
def probe_imported() -> Iterator[None]:
    """The probe's module imported by some other way (a django.tasks task a worker could resolve)."""
    pytest.importorskip("django_workhorse.backends._framework", exc_type=ImportError)
    importlib.import_module(PROBE)
    with override_settings(TASKS=TASKS):
        yield
    sys.modules.pop(PROBE, None)


def test_a_schedule_of_a_task_no_worker_claims_is_w004_naming_it(probe_imported):
    every_hour = {"task": f"{PROBE}.probe", "every": timedelta(hours=1), "args": [1]}
    with override_settings(WORKHORSE_SCHEDULES={"hourly-probe": every_hour}):
        assert check_schedules() == []  # its handler is found (the module is imported): no E205
        [warning] = check_capabilities()
    assert warning.id == "workhorse.W004" and warning.level == WARNING
    assert "'hourly-probe'" in warning.msg and f"'{PROBE}.probe'" in warning.msg

    with override_settings(WORKHORSE_SCHEDULES={"hourly-probe": every_hour}, WORKHORSE_TASK_MODULES=[PROBE]):
        assert check_capabilities() == []


def test_a_schedule_of_a_registered_handler_raises_no_w004():
    with override_settings(WORKHORSE_SCHEDULES={"y": {"task": Y, "every": timedelta(hours=1)}}):
        assert check_capabilities() == []
