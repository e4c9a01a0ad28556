"""Enqueueing a workflow (decision 0022, increment 3): one statement writes the workflow, its steps
and their edges in the caller's transaction; a keyed workflow replays (one read, nothing written) or
raises ``WorkflowConflictError`` naming the differing steps; racing producers make one workflow; a
waiting step is never claimed. Real PostgreSQL throughout."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_workhorse import (
    EnqueueIdempotencyConflictError,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    Idempotency,
    WorkflowConflictError,
    WorkflowDefinitionError,
    enqueue,
)
from django_workhorse.enqueueing.fingerprints import key_hash
from django_workhorse.models import IdempotencyBinding, Job, JobDependency, JobStatus
from django_workhorse.models import Workflow as WorkflowRow
from django_workhorse.sql.claims import claim
from django_workhorse.sql.workflows import FIND_WORKFLOW
from django_workhorse.workflows import Workflow, WorkflowResult
from django_workhorse.workflows.fingerprint import field_digests, graph_digest
from tests.conftest import race

pytestmark = pytest.mark.django_db

KEY = Idempotency("fulfil:order-1", scope="fulfilment")
TABLES = ("workhorse_workflow", "workhorse_job", "workhorse_job_dependency", "workhorse_binding", "workhorse_job_event")


def rows() -> dict[str, int]:
    with connection.cursor() as cursor:
        counts = {}
        for table in TABLES:
            cursor.execute(f"SELECT count(*) FROM {table}")
            counts[table] = cursor.fetchone()[0]
        return counts


def request(job_type: str = "t", payload: Any = None, **options: Any) -> EnqueueRequest:
    return EnqueueRequest(job_type, payload, EnqueueOptions(**options))


def diamond(idempotency: Idempotency | None = None, *, d_payload: Any = None) -> Workflow:
    """a -> (b, c) -> d."""
    wf = Workflow("diamond", idempotency=idempotency)
    a = wf.add("a", request("charge", {"order": 1}))
    b = wf.add("b", request("pack", {"order": 1}, queue="warehouse"), after=a)
    c = wf.add("c", request("mail", {"order": 1}), after=[a])
    wf.add("d", request("close", d_payload), after=[b, c], allow_failure=False)
    return wf


def edges_of(result: WorkflowResult) -> set[tuple[str, str, bool]]:
    name = {job_id: step for step, job_id in result.jobs.items()}
    return {
        (name[edge.child_id], name[edge.parent_id], edge.allow_failure)
        for edge in JobDependency.objects.filter(child__workflow_id=result.workflow_id)
    }


# -- unkeyed ---------------------------------------------------------------------------------------------------


def test_a_diamond_is_written_in_one_statement_with_its_edges_and_states(django_assert_num_queries):
    with django_assert_num_queries(1):
        result = diamond().enqueue()

    assert result.outcome is EnqueueOutcome.ACCEPTED
    assert list(result.jobs) == ["a", "b", "c", "d"]  # topological order
    flow = WorkflowRow.objects.get()
    assert result.workflow_id == flow.pk
    assert (flow.name, flow.step_count, flow.scope, flow.key_hash, flow.key_preview) == ("diamond", 4, None, None, None)
    assert bytes(flow.fingerprint) == graph_digest(field_digests(diamond().plan()))
    jobs = {job.step_name: job for job in Job.objects.filter(workflow_id=flow.pk)}
    assert {step: job.pk for step, job in jobs.items()} == result.jobs
    assert {step: (job.status, job.pending_parents) for step, job in jobs.items()} == {
        "a": (JobStatus.QUEUED, 0),
        "b": (JobStatus.WAITING, 1),
        "c": (JobStatus.WAITING, 1),
        "d": (JobStatus.WAITING, 2),
    }
    assert (jobs["a"].job_type, jobs["b"].queue, jobs["d"].payload) == ("charge", "warehouse", None)
    assert edges_of(result) == {("b", "a", False), ("c", "a", False), ("d", "b", False), ("d", "c", False)}
    assert not IdempotencyBinding.objects.exists()


def test_allow_failure_is_written_on_every_edge_of_its_step():
    wf = Workflow("tolerant")
    wf.add("a", request())
    wf.add("b", request())
    wf.add("sink", request(), after=["a", "b"], allow_failure=True)

    result = wf.enqueue()

    assert edges_of(result) == {("sink", "a", True), ("sink", "b", True)}


def test_an_unkeyed_workflow_is_new_every_time():
    first, second = diamond().enqueue(), diamond().enqueue()

    assert first.workflow_id != second.workflow_id
    assert set(first.jobs.values()).isdisjoint(second.jobs.values())
    assert rows()["workhorse_workflow"] == 2 and rows()["workhorse_job"] == 8


def test_the_workflow_joins_the_callers_transaction_and_rolls_back_with_it():
    class AbandonError(Exception):
        pass

    with pytest.raises(AbandonError), transaction.atomic():
        diamond().enqueue()
        assert rows()["workhorse_job"] == 4
        raise AbandonError

    assert rows() == dict.fromkeys(TABLES, 0)


@pytest.mark.django_db(transaction=True)
def test_ready_roots_notify_their_queues_once_each_at_commit(listener):
    wf = Workflow("roots")
    wf.add("a", request(queue="q1"))
    wf.add("b", request(queue="q1"))
    wf.add("c", request(queue="q2"), after=["a"])  # waiting: no notification for q2
    wf.add("later", request(queue="q3", delay=timedelta(hours=1)))  # not ready now

    with transaction.atomic():
        wf.enqueue()
        assert listener(0.2) == []  # delivered at commit

    assert sorted(listener(2, 1) + listener(0.3)) == ["q1"]


def test_a_thousand_step_fan_out_fan_in_enqueues():
    wf = Workflow("fan")
    source = wf.add("source", request())
    middle = [wf.add(f"m{i}", request(payload={"i": i}), after=source) for i in range(998)]
    wf.add("sink", request(), after=middle)

    result = wf.enqueue()

    assert len(result.jobs) == 1000
    assert rows()["workhorse_job_dependency"] == 998 * 2
    sink = Job.objects.get(pk=result.jobs["sink"])
    assert (sink.status, sink.pending_parents) == (JobStatus.WAITING, 998)
    assert Job.objects.filter(workflow_id=result.workflow_id, status=JobStatus.QUEUED).count() == 1


def test_a_bad_definition_writes_nothing_and_leaves_the_transaction_usable(django_assert_num_queries):
    wf = Workflow("bad")
    wf.add("a", request(), after=["ghost"])

    with transaction.atomic():
        with django_assert_num_queries(0), pytest.raises(WorkflowDefinitionError) as caught:
            wf.enqueue()
        assert (caught.value.step, caught.value.field) == ("a", "after")
        enqueue("t")  # the transaction is usable

    assert rows()["workhorse_job"] == 1 and rows()["workhorse_workflow"] == 0


# -- keyed -----------------------------------------------------------------------------------------------------


def test_a_keyed_workflow_binds_its_anchor():
    result = diamond(KEY).enqueue()

    binding = IdempotencyBinding.objects.get()
    assert binding.job_id == result.jobs["a"]  # the anchor: first in topological order
    assert (binding.mode, binding.scope) == ("idempotency", "fulfilment")
    assert set(binding.field_digests) == {"name", "step:a", "step:b", "step:c", "step:d"}
    flow = WorkflowRow.objects.get()
    assert bytes(binding.request_digest) == bytes(flow.fingerprint)
    assert (flow.scope, bytes(flow.key_hash), flow.key_preview) == (
        "fulfilment",
        bytes(binding.key_hash),
        binding.key_preview,
    )
    assert binding.expires_at - binding.created_at == KEY.ttl


def test_a_replay_reads_once_returns_the_original_ids_and_writes_nothing(django_assert_num_queries):
    first = diamond(KEY).enqueue()
    before = rows()

    with django_assert_num_queries(1):
        again = diamond(KEY).enqueue()

    assert again == WorkflowResult(first.workflow_id, EnqueueOutcome.REPLAYED, first.jobs)
    assert list(again.jobs) == ["a", "b", "c", "d"]
    assert rows() == before


def _changed_payload() -> Workflow:
    return diamond(KEY, d_payload={"changed": True})


def _added_step() -> Workflow:
    wf = diamond(KEY)
    wf.add("e", request(), after="d")
    return wf


def _changed_dependency() -> Workflow:
    wf = Workflow("diamond", idempotency=KEY)
    a = wf.add("a", request("charge", {"order": 1}))
    b = wf.add("b", request("pack", {"order": 1}, queue="warehouse"), after=a)
    c = wf.add("c", request("mail", {"order": 1}), after=[a, b])  # now after b too
    wf.add("d", request("close"), after=[b, c])
    return wf


def _tolerant_sink() -> Workflow:
    wf = Workflow("diamond", idempotency=KEY)
    a = wf.add("a", request("charge", {"order": 1}))
    b = wf.add("b", request("pack", {"order": 1}, queue="warehouse"), after=a)
    c = wf.add("c", request("mail", {"order": 1}), after=[a])
    wf.add("d", request("close"), after=[b, c], allow_failure=True)
    return wf


def _renamed() -> Workflow:
    wf = diamond(KEY)
    wf.name = "other"
    return wf


@pytest.mark.parametrize(
    ("changed", "steps", "fields"),
    [
        pytest.param(_changed_payload, ("d",), ("step:d",), id="payload"),
        pytest.param(_added_step, ("e",), ("step:e",), id="added-step"),
        pytest.param(_changed_dependency, ("c",), ("step:c",), id="dependency"),
        pytest.param(_tolerant_sink, ("d",), ("step:d",), id="allow-failure"),
        pytest.param(_renamed, (), ("name",), id="name"),
    ],
)
def test_a_changed_graph_under_a_live_key_conflicts_naming_the_steps(changed, steps, fields):
    first = diamond(KEY).enqueue()
    before = rows()

    with transaction.atomic():
        with pytest.raises(WorkflowConflictError) as caught:
            changed().enqueue()
        enqueue("t")  # the transaction is usable
        transaction.set_rollback(True)

    error = caught.value
    assert isinstance(error, EnqueueIdempotencyConflictError)
    assert (error.steps, error.conflicting_fields) == (steps, fields)
    assert (error.workflow_id, error.job_id, error.scope) == (first.workflow_id, first.jobs["a"], "fulfilment")
    assert "fulfil:order-1" not in str(error)
    assert rows() == before


def test_a_removed_step_is_named():
    first = _added_step().enqueue()

    with pytest.raises(WorkflowConflictError) as caught:
        diamond(KEY).enqueue()

    assert caught.value.steps == ("e",) and caught.value.workflow_id == first.workflow_id


def test_a_key_held_by_a_plain_job_conflicts_naming_the_workflow_field():
    job_id = enqueue("t", idempotency=KEY)

    with pytest.raises(WorkflowConflictError) as caught:
        diamond(KEY).enqueue()

    assert (caught.value.conflicting_fields, caught.value.steps) == (("workflow",), ())
    assert (caught.value.job_id, caught.value.workflow_id) == (job_id, None)
    assert rows()["workhorse_workflow"] == 0


def test_a_plain_keyed_job_meeting_a_workflows_key_conflicts_naming_the_workflow_field():
    first = diamond(KEY).enqueue()

    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue("charge", {"order": 1}, idempotency=KEY)

    assert caught.value.conflicting_fields == ("workflow",) and caught.value.job_id == first.jobs["a"]
    assert rows()["workhorse_job"] == 4


def test_an_expired_binding_is_taken_over_by_a_new_workflow():
    first = diamond(KEY).enqueue()
    IdempotencyBinding.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    second = _changed_payload().enqueue()

    assert second.outcome is EnqueueOutcome.ACCEPTED and second.workflow_id != first.workflow_id
    binding = IdempotencyBinding.objects.get()
    assert binding.job_id == second.jobs["a"]
    assert bytes(binding.request_digest) == bytes(WorkflowRow.objects.get(pk=second.workflow_id).fingerprint)
    assert Job.objects.filter(workflow_id=first.workflow_id).count() == 4  # history stays
    assert diamond(KEY, d_payload={"changed": True}).enqueue().outcome is EnqueueOutcome.REPLAYED


# -- racing producers and the claim -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_sixteen_racing_producers_make_one_workflow():
    results = race(16, lambda i: diamond(KEY).enqueue())

    assert all(isinstance(result, WorkflowResult) for result in results), results
    assert sorted(result.outcome for result in results) == [EnqueueOutcome.ACCEPTED] + [EnqueueOutcome.REPLAYED] * 15
    assert len({(result.workflow_id, tuple(result.jobs.items())) for result in results}) == 1
    counts = rows()
    assert (counts["workhorse_workflow"], counts["workhorse_job"], counts["workhorse_binding"]) == (1, 4, 1)
    assert counts["workhorse_job_dependency"] == 4


def test_no_claim_takes_a_waiting_step():
    result = diamond().enqueue()
    wf = Workflow("second root")
    wf.add("r1", request(queue="warehouse"))
    wf.add("r2", request(queue="warehouse"), after="r1")
    other = wf.enqueue()

    claimed = claim("default", queues=["default", "warehouse"], limit=100, lease=timedelta(minutes=5), worker="w")

    assert sorted(job.id for job in claimed) == sorted([result.jobs["a"], other.jobs["r1"]])
    assert Job.objects.filter(status=JobStatus.WAITING).count() == 4


def test_a_replay_reads_the_steps_through_a_workflow_index():
    for order in range(20):  # other workflows in the table, so the planner has a choice
        wf = Workflow("fan", idempotency=Idempotency(f"order-{order}"))
        for i in range(50):
            wf.add(f"s{i}", request())
        wf.enqueue()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workhorse_job")
        cursor.execute("ANALYZE workhorse_binding")
        key = Idempotency("order-7")
        params = {"scope": key.scope, "key_hash": key_hash(key.scope, key.key)}
        cursor.execute("EXPLAIN (FORMAT JSON) " + FIND_WORKFLOW, params)
        value = cursor.fetchone()[0]
    plan = (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]

    # The steps are found through a workflow index, never by reading the job table (a tiny binding
    # table may be read whole: the planner's choice, not ours).
    nodes = _nodes(plan)
    assert not [node for node in nodes if node["Node Type"] == "Seq Scan" and node["Relation Name"] == "workhorse_job"]
    indexes = {node.get("Index Name") for node in nodes}
    assert indexes & {"workhorse_job_workflow_step_uniq", "workhorse_job_workflow_idx"}, indexes


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]
