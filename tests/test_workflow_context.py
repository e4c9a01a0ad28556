"""A workflow step's context (decision 0022 §3 and §6, increment 6): ``ctx.idempotency_key`` of a
keyed workflow's step is derived from the workflow's key and the step name, one key per step across
attempts, replays, redrives and a re-run after the binding expired; ``ctx.workflow_id``,
``ctx.step_name``, ``ctx.result_of``, ``ctx.parent_results`` and ``ctx.failed_parents``. Real
PostgreSQL, real worker threads."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_workhorse import (
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    Idempotency,
    InvalidArgumentError,
    StepNotSucceededError,
    enqueue,
    models,
    redrive,
    sql,
)
from django_workhorse.enqueueing.fingerprints import derived_step_key, key_hash
from django_workhorse.models import IdempotencyBinding, Job, JobStatus
from django_workhorse.sql.claims import ClaimedJob, claim
from django_workhorse.tasks.retry import RetryPolicy
from django_workhorse.worker.context import HandlerContext
from django_workhorse.worker.execution import Outcome, record
from django_workhorse.workflows import Workflow, WorkflowResult
from tests.worker_tasks import CALLS, run_worker

KEY = Idempotency("order-7", scope="tests.context")
LEASE = timedelta(minutes=5)


def step(payload: dict[str, Any] | None = None, *, queue: str = "default", max_attempts: int = 3) -> EnqueueRequest:
    options = EnqueueOptions(
        queue=queue, max_attempts=max_attempts, retry_policy=RetryPolicy.fixed(timedelta(milliseconds=1))
    )
    return EnqueueRequest("tests.wf.context", payload or {}, options)


def calls_by_step() -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for call in CALLS.items():
        found.setdefault(call["step"], []).append(call)
    return found


def claim_all() -> dict[int, ClaimedJob]:
    """Claim every ready job of the default queue, by id."""
    return {job.id: job for job in claim("default", queues=["default"], limit=100, lease=LEASE, worker="t")}


def context(job: ClaimedJob) -> HandlerContext:
    return HandlerContext(job, alias="default", on_heartbeat=lambda: None)


def finish(job: ClaimedJob, status: str, result_json: str | None = None) -> None:
    outcome = Outcome(job, status, result_json=result_json, error="" if status == "succeeded" else "boom",
                      events=((status, {}),))  # fmt: skip
    assert record("default", [outcome]) == [status]


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()


# -- step keys ----------------------------------------------------------------------------------------


def test_the_step_key_recipe_is_pinned():
    # "wf:" + sha256(key_hash + b"\x1f" + utf8(step_name)), first 32 hex, key_hash = sha256(scope \x1f key).
    hashed = key_hash("fulfilment", "fulfil:42")
    assert hashed.hex() == "2f4116ac058f2fdca9e48ff7e215a609e1f2080e61c5657db45b8c2968b27808"
    assert derived_step_key(hashed, "charge") == "wf:d5ee67a9570314bd182babbd6d11b1fd"
    assert derived_step_key(hashed, "café") == "wf:7146c5947b6cd976711a64b6c3232fa9"
    assert derived_step_key(hashed, "pack") != derived_step_key(hashed, "charge")
    assert derived_step_key(key_hash("fulfilment", "fulfil:43"), "charge") != derived_step_key(hashed, "charge")


def keyed_workflow() -> Workflow:
    """a (one retry) -> b (dies until the operator fixes it)."""
    wf = Workflow("keyed", idempotency=KEY)
    wf.add("a", step({"succeed_on": 2, "result": "a done"}))
    wf.add("b", step({"die": True}, max_attempts=1), after="a")
    return wf


@pytest.mark.django_db(transaction=True)
def test_a_keyed_steps_key_is_one_across_attempts_replays_redrives_and_a_rerun_after_expiry():
    first = keyed_workflow().enqueue()
    assert keyed_workflow().enqueue() == WorkflowResult(first.workflow_id, EnqueueOutcome.REPLAYED, first.jobs)
    run_worker()
    assert Job.objects.get(pk=first.jobs["b"]).status == JobStatus.DEAD
    Job.objects.filter(pk=first.jobs["b"]).update(payload={})  # the operator fixed the data
    copy = redrive(first.jobs["b"], request_id="fix")
    run_worker()
    assert Job.objects.get(pk=copy).status == JobStatus.SUCCEEDED
    # The binding expires; the same key makes a second workflow, whose steps share the first's keys.
    IdempotencyBinding.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    second = keyed_workflow().enqueue()
    assert (second.outcome, second.workflow_id != first.workflow_id) == (EnqueueOutcome.ACCEPTED, True)
    run_worker()

    calls = calls_by_step()
    hashed = key_hash(KEY.scope, KEY.key)
    assert [(call["workflow_id"], call["attempt"]) for call in calls["a"]] == [
        (first.workflow_id, 1), (first.workflow_id, 2), (second.workflow_id, 1), (second.workflow_id, 2)]  # fmt: skip
    assert [call["job_id"] for call in calls["b"]] == [first.jobs["b"], copy, second.jobs["b"]]
    assert {step: {call["key"] for call in found} for step, found in calls.items()} == {
        "a": {derived_step_key(hashed, "a")},
        "b": {derived_step_key(hashed, "b")},
    }
    assert derived_step_key(hashed, "a").startswith("wf:") and len(derived_step_key(hashed, "a")) == 35
    # The redriven copy keeps its step's name and reads the parent through the copied edge.
    assert calls["b"][1]["step"] == "b" and calls["b"][1]["parents"] == {"a": "a done"}


@pytest.mark.django_db(transaction=True)
def test_an_unkeyed_workflows_steps_and_plain_jobs_keep_the_job_key():
    wf = Workflow("unkeyed")
    wf.add("a", step({"succeed_on": 2}))
    jobs = wf.enqueue().jobs
    plain = enqueue("tests.wf.context", {})

    run_worker()

    calls = calls_by_step()
    assert [(call["key"], call["step"]) for call in calls["a"]] == [(f"workhorse-job-{jobs['a']}", "a")] * 2
    assert calls[None] == [{"job_id": plain, "attempt": 1, "key": f"workhorse-job-{plain}", "workflow_id": None,
                            "step": None, "parents": {}, "failed": (), "read": {}}]  # fmt: skip


@pytest.mark.django_db
def test_the_step_is_loaded_once_on_first_use_and_never_for_a_plain_job(django_assert_num_queries):
    wf = Workflow("lazy", idempotency=KEY)
    wf.add("a", step())
    jobs = wf.enqueue().jobs
    plain = enqueue("tests.wf.context", {})
    claims = claim_all()

    with django_assert_num_queries(0):
        ctx = context(claims[plain])
        assert (ctx.idempotency_key, ctx.step_name, ctx.workflow_id) == (f"workhorse-job-{plain}", None, None)
        assert (ctx.parent_results, ctx.failed_parents) == ({}, ())
    with django_assert_num_queries(1):
        ctx = context(claims[jobs["a"]])
        assert ctx.idempotency_key == derived_step_key(key_hash(KEY.scope, KEY.key), "a")
        assert (ctx.step_name, ctx.idempotency_key_for("charge")) == ("a", f"{ctx.idempotency_key}:charge")
    with django_assert_num_queries(1):
        assert (ctx.parent_results, ctx.failed_parents, ctx.parent_results) == ({}, (), {})


# -- results ------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_diamonds_steps_read_their_parents_and_any_step_of_the_workflow():
    wf = Workflow("diamond")
    wf.add("a", step({"result": {"charged": 10}}))
    wf.add("b", step({"result": ["packed"]}), after="a")
    wf.add("c", step({"result": "mailed"}), after="a")
    wf.add("late", step({"result": "never"}, queue="elsewhere"))  # no worker serves its queue
    wf.add("d", step({"read": ["a", "late", "nope", ""]}), after=["b", "c"])
    result = wf.enqueue()

    run_worker()

    calls = {name: found[-1] for name, found in calls_by_step().items()}
    assert {name: (call["parents"], call["failed"]) for name, call in calls.items()} == {
        "a": ({}, ()),
        "b": ({"a": {"charged": 10}}, ()),
        "c": ({"a": {"charged": 10}}, ()),
        "d": ({"b": ["packed"], "c": "mailed"}, ()),
    }
    assert calls["d"]["read"] == {
        "a": {"result": {"charged": 10}},
        "late": {"not_succeeded": "queued", "job_id": result.jobs["late"]},
        "nope": {"invalid": "step"},
        "": {"invalid": "step"},
    }
    assert {call["workflow_id"] for call in calls.values()} == {result.workflow_id}
    assert {name: call["step"] for name, call in calls.items()} == {name: name for name in calls}


@pytest.mark.django_db(transaction=True)
def test_allow_failure_names_the_dead_parent_and_leaves_it_out_of_the_results():
    wf = Workflow("tolerant")
    wf.add("a", step({"die": True}, max_attempts=1))
    wf.add("b", step({"result": 2}))
    wf.add("sink", step({"read": ["a", "b"]}), after=["a", "b"], allow_failure=True)
    jobs = wf.enqueue().jobs

    run_worker()

    sink = calls_by_step()["sink"][-1]
    assert (sink["parents"], sink["failed"]) == ({"b": 2}, ("a",))
    assert sink["read"] == {"a": {"not_succeeded": "dead", "job_id": jobs["a"]}, "b": {"result": 2}}


@pytest.mark.django_db(transaction=True)
def test_a_tolerated_dead_parent_redriven_since_is_read_through_its_current_job():
    wf = Workflow("tolerant")
    wf.add("a", step(max_attempts=1))
    wf.add("sink", step(), after="a", allow_failure=True)
    jobs = wf.enqueue().jobs
    finish(claim_all()[jobs["a"]], "dead")  # releases the sink, which has not run yet
    copy = redrive(jobs["a"], request_id="again")
    claims = claim_all()
    finish(claims[copy], "succeeded", '{"late": true}')

    ctx = context(claims[jobs["sink"]])

    assert (ctx.parent_results, ctx.failed_parents, ctx.result_of("a")) == ({"a": {"late": True}}, (), {"late": True})


@pytest.mark.django_db
def test_result_of_refuses_what_is_no_step_of_the_workflow():
    wf = Workflow("one")
    wf.add("a", step())
    jobs = wf.enqueue().jobs
    plain = enqueue("tests.wf.context", {})
    claims = claim_all()
    ctx = context(claims[jobs["a"]])

    with pytest.raises(
        StepNotSucceededError, match="step 'a' has not succeeded: its current job .* is running"
    ) as caught:
        ctx.result_of("a")
    assert (caught.value.step, caught.value.status, caught.value.job_id) == ("a", "running", jobs["a"])
    for bad in ("b", "", "x" * 201, "a\x00", 3):
        with pytest.raises(InvalidArgumentError, match="step"):
            ctx.result_of(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="step.*this job is none"):
        context(claims[plain]).result_of("a")


@pytest.mark.django_db
def test_the_reads_go_through_the_edge_and_step_indexes_among_many_steps():
    for n in range(5):  # 5,000 steps of other workflows
        other = Workflow(f"other {n}")
        other.add("root", step(queue="elsewhere"))
        for m in range(998):
            other.add(f"m{m}", step(), after="root")
        other.add("sink", step(), after=[f"m{m}" for m in range(998)])
        other.enqueue()
    wf = Workflow("diamond")
    wf.add("a", step())
    wf.add("b", step(), after="a")
    wf.add("c", step(), after="a")
    wf.add("d", step(), after=["b", "c"])
    result = wf.enqueue()
    reads = {
        "parents": (sql.steps.PARENT_RESULTS, {"job_id": result.jobs["d"]}),
        "result": (sql.steps.STEP_RESULT, {"workflow_id": result.workflow_id, "step_name": "b"}),
        "identity": (sql.steps.STEP_IDENTITY, {"job_id": result.jobs["d"]}),
    }

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workhorse_job; ANALYZE workhorse_job_dependency")
        plans = {}
        for name, (statement, params) in reads.items():
            cursor.execute("EXPLAIN (COSTS OFF) " + statement, params)
            plans[name] = "\n".join(line for (line,) in cursor.fetchall())

    assert all("Seq Scan" not in plan for plan in plans.values()), plans
    assert models.DEPENDENCY_CHILD_PARENT_UNIQ in plans["parents"], plans["parents"]
    assert models.JOB_WORKFLOW_IDX in plans["parents"] and models.JOB_WORKFLOW_IDX in plans["result"], plans
