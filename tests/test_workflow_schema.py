"""The workflow schema (decision 0022, increment 1): the CHECKs of workflows, steps and edges at
their edges, one original job per step, deletes that cascade, the claim that never reads a waiting
step, the status ``waiting`` where statuses are listed, and migrations 0021/0022 back and forth."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_workhorse import models
from django_workhorse import sql as workhorse_sql
from django_workhorse.backends.results import READY, STATUSES
from django_workhorse.conf import MAX_WORKFLOW_STEPS
from django_workhorse.models import Job, JobDependency, JobEvent, JobStatus, Workflow
from tests.factories import JobFactory, WaitingStepFactory, WorkflowFactory
from tests.test_admin import JOBS, VIEW_PERMS, login, result_ids
from tests.test_constraints import BYTES_256, BYTES_257, violated_constraint
from tests.test_fair_queues import _candidates, _params, _plan

pytestmark = pytest.mark.django_db

KEY_HASH = hashlib.sha256(b"orders\x1fk-1").digest()
KEY = {"scope": "orders", "key_hash": KEY_HASH, "key_preview": "k-1"}


# -- workhorse_workflow ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        pytest.param({"step_count": MAX_WORKFLOW_STEPS + 1}, models.WORKFLOW_STEP_COUNT_CHECK, id="steps-10001"),
        pytest.param({"step_count": 0}, models.WORKFLOW_STEP_COUNT_CHECK, id="steps-0"),
        pytest.param({"name": ""}, models.WORKFLOW_NAME_CHECK, id="name-empty"),
        pytest.param({"fingerprint": bytes(31)}, models.WORKFLOW_FINGERPRINT_CHECK, id="fingerprint-31-bytes"),
        pytest.param({"fingerprint": bytes(33)}, models.WORKFLOW_FINGERPRINT_CHECK, id="fingerprint-33-bytes"),
        pytest.param({**KEY, "key_preview": None}, models.WORKFLOW_KEY_CHECK, id="key-without-preview"),
        pytest.param({"scope": "orders"}, models.WORKFLOW_KEY_CHECK, id="scope-without-key"),
        pytest.param({**KEY, "key_hash": bytes(31)}, models.WORKFLOW_KEY_HASH_CHECK, id="key-hash-31-bytes"),
        pytest.param({**KEY, "scope": BYTES_257}, models.WORKFLOW_SCOPE_CHECK, id="scope-257-bytes"),
        pytest.param({**KEY, "scope": ""}, models.WORKFLOW_SCOPE_CHECK, id="scope-empty"),
    ],
)
def test_workflow_schema_rejects_value_past_edge(fields, constraint):
    assert violated_constraint(lambda: WorkflowFactory(**fields)) == constraint
    assert Workflow.objects.count() == 0


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"step_count": MAX_WORKFLOW_STEPS}, id="steps-10000"),
        pytest.param({"step_count": 1}, id="steps-1"),
        pytest.param({"name": "n" * 200}, id="name-200"),
        pytest.param({**KEY, "scope": BYTES_256}, id="keyed-scope-256-bytes"),
        pytest.param({"scope": None, "key_hash": None, "key_preview": None}, id="unkeyed"),
    ],
)
def test_workflow_schema_accepts_value_at_edge(fields):
    workflow = WorkflowFactory(**fields)
    workflow.refresh_from_db()
    stored = {name: getattr(workflow, name) for name in fields}
    assert {name: bytes(value) if isinstance(value, memoryview) else value for name, value in stored.items()} == fields


def test_a_workflow_shows_its_key_digest_and_none_when_unkeyed():
    assert WorkflowFactory(**KEY).key_digest == KEY_HASH.hex()[:12]
    assert WorkflowFactory().key_digest is None


# -- workflow steps on workhorse_job -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        pytest.param({"pending_parents": MAX_WORKFLOW_STEPS + 1}, models.JOB_PENDING_PARENTS_CHECK, id="pending-10001"),
        pytest.param({"pending_parents": -1}, models.JOB_PENDING_PARENTS_CHECK, id="pending-minus-1"),
        pytest.param({"pending_parents": 0}, models.JOB_WAITING_CHECK, id="waiting-with-nothing-to-wait-for"),
        pytest.param({"step_name": None}, models.JOB_WORKFLOW_STEP_CHECK, id="workflow-without-step-name"),
    ],
)
def test_step_schema_rejects_value_past_edge(fields, constraint):
    workflow = WorkflowFactory()
    assert violated_constraint(lambda: WaitingStepFactory(workflow=workflow, **fields)) == constraint
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"pending_parents": MAX_WORKFLOW_STEPS}, id="pending-10000"),
        pytest.param({"pending_parents": 1}, id="waiting-for-one"),
        pytest.param({"status": JobStatus.QUEUED, "pending_parents": 0}, id="released"),
        pytest.param({"step_name": "s" * 200}, id="step-name-200"),
    ],
)
def test_step_schema_accepts_value_at_edge(fields):
    job = WaitingStepFactory(**fields)
    job.refresh_from_db()
    assert {name: getattr(job, name) for name in fields} == fields


def test_a_step_name_without_a_workflow_is_refused_and_a_plain_job_has_neither():
    assert violated_constraint(lambda: JobFactory(step_name="charge")) == models.JOB_WORKFLOW_STEP_CHECK
    plain = JobFactory()
    plain.refresh_from_db()
    assert (plain.workflow_id, plain.step_name, plain.pending_parents, plain.awaited) == (None, None, 0, False)


def test_an_update_is_checked_too():
    step = WaitingStepFactory(pending_parents=2)
    updates = Job.objects.filter(pk=step.pk)
    assert violated_constraint(lambda: updates.update(pending_parents=MAX_WORKFLOW_STEPS + 1)) == (
        models.JOB_PENDING_PARENTS_CHECK
    )
    assert violated_constraint(lambda: updates.update(pending_parents=0)) == models.JOB_WAITING_CHECK
    assert updates.update(pending_parents=0, status=JobStatus.QUEUED) == 1  # a release: both at once


def test_one_original_job_per_step_and_redriven_jobs_join_its_lineage():
    workflow = WorkflowFactory()
    original = JobFactory(workflow=workflow, step_name="charge", status=JobStatus.DEAD, attempt=1)

    def second_original() -> Job:
        return JobFactory(workflow=workflow, step_name="charge")

    assert violated_constraint(second_original) == models.JOB_WORKFLOW_STEP_UNIQ
    redriven = [JobFactory(workflow=workflow, step_name="charge", root_id=original.pk) for _ in range(2)]
    JobFactory(workflow=WorkflowFactory(), step_name="charge")  # the same name in another workflow
    JobFactory(workflow=workflow, step_name="pack")
    lineage = Job.objects.filter(workflow=workflow, step_name="charge").order_by("id")
    assert list(lineage.values_list("id", flat=True)) == [original.pk, *(job.pk for job in redriven)]


# -- workhorse_job_dependency ----------------------------------------------------------------------


def test_an_edge_is_stored_once_and_never_from_a_job_to_itself():
    parent, child = JobFactory(), WaitingStepFactory()
    JobDependency.objects.create(child=child, parent=parent, allow_failure=True)

    def again() -> JobDependency:
        return JobDependency.objects.create(child=child, parent=parent)

    assert violated_constraint(again) == models.DEPENDENCY_CHILD_PARENT_UNIQ
    assert violated_constraint(lambda: JobDependency.objects.create(child=child, parent=child)) == (
        models.DEPENDENCY_NOT_SELF_CHECK
    )
    assert list(JobDependency.objects.values_list("child_id", "parent_id", "allow_failure")) == [
        (child.pk, parent.pk, True)
    ]


def test_deleting_a_workflow_deletes_its_jobs_their_edges_and_history_in_one_statement():
    doomed, kept = WorkflowFactory(), WorkflowFactory()
    root = JobFactory(workflow=doomed, step_name="charge")
    leaf = WaitingStepFactory(workflow=doomed, step_name="close")
    JobDependency.objects.create(child=leaf, parent=root)
    JobEvent.objects.create(job=root, kind="enqueued", at=timezone.now())
    other_root = JobFactory(workflow=kept, step_name="charge")
    other_leaf = WaitingStepFactory(workflow=kept, step_name="close")
    JobDependency.objects.create(child=other_leaf, parent=other_root)
    plain = JobFactory()

    with CaptureQueriesContext(connection) as queries:
        Workflow.objects.filter(pk=doomed.pk).delete()

    assert [query["sql"].split()[0] for query in queries] == ["DELETE"]
    assert not Job.objects.filter(pk__in=[root.pk, leaf.pk]).exists()
    assert not JobDependency.objects.filter(child_id=leaf.pk).exists()
    assert not JobEvent.objects.filter(job_id=root.pk).exists()
    assert set(Job.objects.values_list("pk", flat=True)) == {other_root.pk, other_leaf.pk, plain.pk}
    assert JobDependency.objects.get().child_id == other_leaf.pk


def test_deleting_a_job_deletes_the_edges_to_and_from_it():
    workflow = WorkflowFactory()
    first = JobFactory(workflow=workflow, step_name="a")
    middle = WaitingStepFactory(workflow=workflow, step_name="b")
    last = WaitingStepFactory(workflow=workflow, step_name="c")
    JobDependency.objects.create(child=middle, parent=first)
    JobDependency.objects.create(child=last, parent=middle)
    JobDependency.objects.create(child=last, parent=first)

    Job.objects.filter(pk=middle.pk).delete()

    assert list(JobDependency.objects.values_list("child_id", "parent_id")) == [(last.pk, first.pk)]


# -- the claim never reads a waiting step ----------------------------------------------------------

WAITING_STEPS = """
INSERT INTO workhorse_job (job_type, queue, payload, status, priority, run_at, attempt, max_attempts,
                           retry_policy, tags, created_at, last_error, workflow_id, step_name, pending_parents)
SELECT 'tests.record', 'default', '{}', 'waiting', 100, now() - interval '1 hour', 0, 25, '{}', '[]', now(), '',
       %s, 'step-' || n, 1
FROM generate_series(1, %s) AS n
"""


def test_the_claim_reads_only_the_ready_index_and_never_returns_a_waiting_step():
    # A fresh table, as a vacuumed one is (test_stats says why).
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workhorse_job CASCADE")
    # 20,000 waiting steps, due and of the highest priority: ahead of every queued job in claim order.
    with connection.cursor() as cursor:
        cursor.execute(WAITING_STEPS, [WorkflowFactory(step_count=MAX_WORKFLOW_STEPS).pk, 20_000])
    queued = {job.pk for job in JobFactory.create_batch(30, run_at=timezone.now() - timedelta(seconds=1))}
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workhorse_job")

    nodes = _candidates(_plan(_params(["default"], [], limit=50)))

    scans = [node for node in nodes if node.get("Relation Name") == "workhorse_job"]
    run = [node for node in scans if node["Actual Loops"] > 0]
    assert [node.get("Index Name") for node in run] == [models.JOB_READY_IDX], scans
    assert run[0]["Actual Rows"] == 30 and run[0].get("Rows Removed by Filter", 0) == 0, run
    with transaction.atomic():
        claimed = workhorse_sql.claims.claim(
            "default", queues=["default"], limit=50, lease=timedelta(seconds=30), worker="w"
        )
        transaction.set_rollback(True)
    assert {job.id for job in claimed} == queued
    assert Job.objects.filter(status=JobStatus.WAITING).count() == 20_000


# -- where statuses are listed ---------------------------------------------------------------------


def test_waiting_is_neither_terminal_nor_unknown_to_the_django_tasks_backend():
    assert JobStatus.WAITING not in models.TERMINAL_STATUSES
    assert set(STATUSES) == set(JobStatus.values)
    assert STATUSES["waiting"] == READY


def test_the_job_lists_status_filter_offers_waiting_before_queued_and_failing(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    step = WaitingStepFactory()
    JobFactory()

    page = client.get(JOBS).content.decode()

    offered = [page.index(f"?status={value}") for value in ("waiting", "queued", "failing", "running")]
    assert offered == sorted(offered)
    assert result_ids(client.get(f"{JOBS}?status=waiting")) == {step.pk}


# -- migrations 0021 and 0022, back and forth ------------------------------------------------------


def _schema() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT to_regclass('workhorse_workflow') IS NOT NULL, to_regclass('workhorse_job_dependency') IS NOT NULL,
                      (SELECT count(*) FROM information_schema.columns WHERE table_name = 'workhorse_job'
                       AND column_name IN ('workflow_id', 'step_name', 'pending_parents', 'awaited')),
                      (SELECT count(*) FROM pg_indexes WHERE indexname IN (%s, %s, %s)),
                      (SELECT bool_and(convalidated) FROM pg_constraint WHERE conrelid = 'workhorse_job'::regclass),
                      (SELECT pg_get_constraintdef(oid) LIKE '%%waiting%%' FROM pg_constraint WHERE conname = %s)""",
            [models.JOB_WORKFLOW_STEP_UNIQ, models.JOB_WORKFLOW_IDX, models.JOB_WAITING_IDX, models.JOB_STATUS_CHECK],
        )
        tables, edges, columns, indexes, validated, allows_waiting = cursor.fetchone()
    return {
        "tables": (tables, edges),
        "columns": columns,
        "indexes": indexes,
        "validated": validated,
        "allows_waiting": allows_waiting,
    }


AT_HEAD = {"tables": (True, True), "columns": 4, "indexes": 3, "validated": True, "allows_waiting": True}


@pytest.mark.django_db(transaction=True)
def test_the_workflow_migrations_go_back_and_forth():
    assert _schema() == AT_HEAD
    try:
        call_command("migrate", "workhorse", "0020", verbosity=0)
        assert _schema() == {**AT_HEAD, "tables": (False, False), "columns": 0, "indexes": 0, "allows_waiting": False}
    finally:
        call_command("migrate", "workhorse", verbosity=0)
    assert _schema() == AT_HEAD


@pytest.mark.django_db(transaction=True)
def test_going_back_with_a_waiting_step_fails_and_leaves_the_steps_in_place():
    step = WaitingStepFactory()
    try:
        with pytest.raises(IntegrityError, match="workhorse_job_status_check"):
            call_command("migrate", "workhorse", "0020", verbosity=0)
        # 0021's undoing rolled back whole (the later migrations were undone, so read only the status).
        assert Job.objects.filter(pk=step.pk).values_list("status", flat=True).get() == JobStatus.WAITING
    finally:
        call_command("migrate", "workhorse", verbosity=0)
    assert _schema() == AT_HEAD
