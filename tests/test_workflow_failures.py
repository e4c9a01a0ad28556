"""Workflow failures (decision 0022 §2, increment 5): cancellation cascades to waiting descendants
(from a queued or waiting step, a running step asked to stop, a whole workflow); a dead step blocks
its children until a redrive resumes them; ``allow_failure`` runs a child after a death, never after
a cancel; the derived state; purge leaves steps alone. Real PostgreSQL, real worker threads."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from django_workhorse import EnqueueOptions, EnqueueRequest, InvalidArgumentError, cancel, enqueue, purge, redrive
from django_workhorse.exceptions import JobNotDeadError, WorkflowDoesNotExist
from django_workhorse.models import Job, JobDependency, JobEvent, JobStatus
from django_workhorse.operations.actions import plan_redrive
from django_workhorse.workflows import Workflow
from django_workhorse.workflows.operations import (
    WorkflowStatus,
    cancel_workflow,
    workflow_state,
    workflow_states,
)
from tests.conftest import race
from tests.worker_tasks import CALLS, make_worker, run_worker, running, wait_for

# A running handler learns of a cancellation request at its worker's heartbeat, every third of the
# lease: a 3 s lease has it within a second, well inside wait_for's deadline (the default lease,
# 30 s, would take up to 10 s).
HEARTBEAT_EVERY_SECOND = timedelta(seconds=3)


def request(job_type: str = "tests.record", payload: object = None, max_attempts: int = 3) -> EnqueueRequest:
    return EnqueueRequest(job_type, {"n": 1} if payload is None else payload, EnqueueOptions(max_attempts=max_attempts))


def dying() -> EnqueueRequest:
    return request("tests.always_fail", "boom", max_attempts=1)


def statuses(jobs: dict[str, int]) -> dict[str, str]:
    found = dict(Job.objects.filter(pk__in=jobs.values()).values_list("id", "status"))
    return {step: found[job_id] for step, job_id in jobs.items()}


def cancelled_causes(jobs: dict[str, int]) -> dict[str, int]:
    """The cause named by each step's cascaded ``cancelled`` event."""
    events = JobEvent.objects.filter(job_id__in=jobs.values(), kind="cancelled", details__has_key="cause")
    by_id = {job_id: step for step, job_id in jobs.items()}
    return {by_id[event.job_id]: event.details["cause"] for event in events}


def diamond_with_tail(first: EnqueueRequest | None = None) -> dict[str, int]:
    """a -> (b, c) -> d -> e, and an independent x."""
    wf = Workflow("diamond")
    wf.add("a", first or request())
    wf.add("b", request(), after="a")
    wf.add("c", request(), after="a")
    wf.add("d", request(), after=["b", "c"])
    wf.add("e", request(), after="d")
    wf.add("x", request())
    return dict(wf.enqueue().jobs)


# -- cancellation -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_cancelling_a_queued_step_cancels_every_waiting_descendant_naming_the_cause():
    jobs = diamond_with_tail()

    assert cancel(jobs["a"], requested_by="ops") == JobStatus.QUEUED

    assert statuses(jobs) == {**dict.fromkeys("abcde", "cancelled"), "x": "queued"}
    assert cancelled_causes(jobs) == dict.fromkeys("bcde", jobs["a"])
    assert set(JobEvent.objects.filter(kind="cancelled").values_list("details__requested_by", flat=True)) == {"ops"}
    assert all(job.finished_at is not None for job in Job.objects.filter(status=JobStatus.CANCELLED))


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_waiting_step_cancels_it_and_what_follows_it_only():
    jobs = diamond_with_tail()

    assert cancel(jobs["b"]) == JobStatus.WAITING

    assert statuses(jobs) == {"a": "queued", "b": "cancelled", "c": "waiting", "d": "cancelled", "e": "cancelled",
                              "x": "queued"}  # fmt: skip
    assert cancelled_causes(jobs) == {"d": jobs["b"], "e": jobs["b"]}
    # c still runs when a succeeds; d, cancelled, is not released (it no longer waits).
    run_worker()
    assert statuses(jobs) == {"a": "succeeded", "b": "cancelled", "c": "succeeded", "d": "cancelled",
                              "e": "cancelled", "x": "succeeded"}  # fmt: skip


@pytest.mark.django_db
def test_cancelling_a_finished_step_cancels_nothing():
    jobs = diamond_with_tail()
    Job.objects.filter(pk=jobs["a"]).update(status=JobStatus.SUCCEEDED)

    assert cancel(jobs["a"]) == JobStatus.SUCCEEDED
    assert statuses(jobs)["b"] == "waiting"


@pytest.mark.django_db(transaction=True)
def test_a_running_step_asked_to_stop_cancels_its_descendants_when_it_ends_cancelled():
    jobs = diamond_with_tail(request("tests.proc.until_cancelled"))

    with running(make_worker(concurrency=2, lease=HEARTBEAT_EVERY_SECOND)):
        wait_for(lambda: Job.objects.filter(pk=jobs["a"], status=JobStatus.RUNNING, checkpoints__name="started").exists(),
                 what="step a running")  # fmt: skip
        assert cancel(jobs["a"], requested_by="ops") == JobStatus.RUNNING
        wait_for(lambda: statuses(jobs)["a"] == "cancelled", what="step a cancelled")
        wait_for(lambda: statuses(jobs)["x"] == "succeeded", what="step x run")

    assert statuses(jobs) == {**dict.fromkeys("abcde", "cancelled"), "x": "succeeded"}
    assert cancelled_causes(jobs) == dict.fromkeys("bcde", jobs["a"])


@pytest.mark.django_db(transaction=True)
def test_a_retry_that_meets_a_cancellation_request_cancels_the_steps_descendants():
    jobs = diamond_with_tail(request("tests.fail_when_cancelled"))

    with running(make_worker(concurrency=2, lease=HEARTBEAT_EVERY_SECOND)):
        wait_for(lambda: Job.objects.filter(pk=jobs["a"], status=JobStatus.RUNNING, checkpoints__name="started").exists(),
                 what="step a running")  # fmt: skip
        assert cancel(jobs["a"]) == JobStatus.RUNNING
        wait_for(lambda: statuses(jobs)["a"] == "cancelled", what="step a cancelled")
        wait_for(lambda: statuses(jobs)["x"] == "succeeded", what="step x run")

    assert statuses(jobs) == {**dict.fromkeys("abcde", "cancelled"), "x": "succeeded"}
    assert cancelled_causes(jobs) == dict.fromkeys("bcde", jobs["a"])
    assert Job.objects.get(pk=jobs["a"]).last_error.startswith("RuntimeError: failed after the cancellation request")


@pytest.mark.django_db
def test_cancel_workflow_cancels_waiting_and_queued_steps_and_asks_running_ones_to_stop_once():
    jobs = diamond_with_tail()
    Job.objects.filter(pk=jobs["x"]).update(status=JobStatus.RUNNING)  # as a claim leaves it

    assert cancel_workflow(Job.objects.get(pk=jobs["a"]).workflow_id, requested_by="ops") == 6
    workflow_id = Job.objects.get(pk=jobs["a"]).workflow_id

    assert statuses(jobs) == {**dict.fromkeys("abcde", "cancelled"), "x": "running"}
    assert Job.objects.get(pk=jobs["x"]).cancel_requested
    assert JobEvent.objects.filter(kind="cancel_requested", job_id=jobs["x"]).count() == 1
    assert cancel_workflow(workflow_id) == 0  # a second call changes nothing
    assert JobEvent.objects.filter(job_id__in=jobs.values()).exclude(kind="enqueued").count() == 6
    assert workflow_state(workflow_id).status == WorkflowStatus.CANCELLED


@pytest.mark.django_db
def test_cancel_workflow_and_state_refuse_bad_ids_and_name_missing_workflows():
    for bad in (0, -1, 2**63, True, "1", None):
        with pytest.raises(InvalidArgumentError, match="workflow_id"):
            cancel_workflow(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="workflow_id"):
            workflow_state(bad)  # type: ignore[arg-type]
    largest = 2**63 - 1
    with pytest.raises(WorkflowDoesNotExist, match=str(largest)):
        cancel_workflow(largest)
    with transaction.atomic():  # the caller's transaction stays usable after each error
        with pytest.raises(WorkflowDoesNotExist):
            workflow_state(largest)
        with pytest.raises(InvalidArgumentError, match="requested_by"):
            cancel_workflow(1, requested_by="x" * 201)
        assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_cancel_workflow_racing_the_recordings_of_its_steps_leaves_no_step_waiting():
    # Workers release steps while the workflow is cancelled: whichever commits first, every step
    # ends succeeded or cancelled, none waits for ever and none runs after the cancel committed.
    for round_ in range(5):
        wf = Workflow(f"race {round_}")
        for i in range(8):
            wf.add(f"p{i}", request())
            wf.add(f"c{i}", request(), after=f"p{i}")
        result = wf.enqueue()

        def work(i: int, result=result) -> object:
            return result.cancel() if i == 0 else run_worker(concurrency=4)

        outcomes = race(2, work)
        assert not any(isinstance(outcome, BaseException) for outcome in outcomes), outcomes
        run_worker()
        left = set(Job.objects.filter(workflow_id=result.workflow_id).values_list("status", flat=True))
        assert left <= {JobStatus.SUCCEEDED, JobStatus.CANCELLED}, left


# -- death, redrive -----------------------------------------------------------------------------------


def chain_with_a_dying_middle() -> tuple[int, dict[str, int]]:
    wf = Workflow("chain")
    wf.add("a", request())
    wf.add("b", dying(), after="a")
    wf.add("c", request(), after="b")
    result = wf.enqueue()
    return result.workflow_id, dict(result.jobs)


@pytest.mark.django_db(transaction=True)
def test_a_dead_step_blocks_its_children_until_a_redrive_resumes_the_workflow():
    workflow_id, jobs = chain_with_a_dying_middle()
    run_worker()
    assert statuses(jobs) == {"a": "succeeded", "b": "dead", "c": "waiting"}
    state = workflow_state(workflow_id)
    assert (state.status, state.steps.dead, state.steps.waiting, state.steps.blocked) == (
        WorkflowStatus.BLOCKED, 1, 1, True)  # fmt: skip

    Job.objects.filter(pk=jobs["b"]).update(job_type="tests.record")  # the operator fixed the bug
    copy = redrive(jobs["b"], request_id="fix-1", requested_by="ops")

    moved = Job.objects.get(pk=copy)
    assert (moved.workflow_id, moved.step_name, moved.pending_parents, moved.status) == (
        workflow_id, "b", 0, JobStatus.QUEUED)  # fmt: skip
    assert set(JobDependency.objects.filter(child_id=copy).values_list("parent_id", flat=True)) == {jobs["a"]}
    assert set(JobDependency.objects.filter(parent_id=copy).values_list("child_id", flat=True)) == {jobs["c"]}
    assert not JobDependency.objects.filter(parent_id=jobs["b"]).exists()
    assert workflow_state(workflow_id).status == WorkflowStatus.RUNNING

    CALLS.clear()
    run_worker()
    assert statuses({**jobs, "b again": copy}) == {"a": "succeeded", "b": "dead", "c": "succeeded",
                                                   "b again": "succeeded"}  # fmt: skip
    assert CALLS.items() == ["boom", {"n": 1}]  # the copy (b's payload), then c: once each
    assert (
        JobEvent.objects.filter(job_id=jobs["c"], kind="ready").values_list("details__released_by", flat=True).get()
        == copy
    )
    state = workflow_state(workflow_id)
    assert (state.status, state.steps.succeeded, state.steps.dead) == (WorkflowStatus.SUCCEEDED, 3, 0)


@pytest.mark.django_db(transaction=True)
def test_only_a_steps_latest_job_can_be_redriven():
    workflow_id, jobs = chain_with_a_dying_middle()
    run_worker()
    first = redrive(jobs["b"], request_id="r1")
    assert redrive(jobs["b"], request_id="r1") == first  # the same request: the same copy
    run_worker()  # the copy dies too
    assert Job.objects.get(pk=first).status == JobStatus.DEAD

    for attempt in (lambda: redrive(jobs["b"], request_id="r2"), lambda: plan_redrive(jobs["b"], request_id="r2")):
        with pytest.raises(
            InvalidArgumentError, match=f"job_id.*latest job of its workflow step 'b' \\(job {first}\\)"
        ):
            attempt()
    second = redrive(first, request_id="r2")
    assert set(JobDependency.objects.filter(parent_id=second).values_list("child_id", flat=True)) == {jobs["c"]}
    with pytest.raises(JobNotDeadError):
        redrive(jobs["c"], request_id="r3")


@pytest.mark.django_db(transaction=True)
def test_concurrent_redrives_of_one_dead_step_make_one_copy_that_owns_its_children():
    workflow_id, jobs = chain_with_a_dying_middle()
    run_worker()

    results = race(8, lambda i: redrive(jobs["b"], request_id=f"racer-{i}"))

    copies = [result for result in results if isinstance(result, int)]
    refused = [result for result in results if isinstance(result, InvalidArgumentError)]
    assert (len(copies), len(refused)) == (1, 7), results
    assert set(JobDependency.objects.filter(parent_id=copies[0]).values_list("child_id", flat=True)) == {jobs["c"]}
    assert Job.objects.filter(workflow_id=workflow_id, step_name="b").count() == 2


@pytest.mark.django_db
def test_a_plain_job_is_redriven_as_before_without_edges():
    job_id = enqueue("tests.record", {})
    Job.objects.filter(pk=job_id).update(status=JobStatus.DEAD)
    first = redrive(job_id, request_id="a")
    second = redrive(job_id, request_id="b")  # a plain job may be redriven again
    assert Job.objects.filter(pk__in=[first, second], workflow__isnull=True).count() == 2


# -- allow_failure ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_allow_failure_runs_the_child_after_a_death_and_the_workflow_succeeds():
    wf = Workflow("tolerant")
    wf.add("a", dying())
    wf.add("b", request())
    wf.add("sink", request(), after=["a", "b"], allow_failure=True)
    result = wf.enqueue()

    run_worker()

    assert statuses(dict(result.jobs)) == {"a": "dead", "b": "succeeded", "sink": "succeeded"}
    state = result.state()
    assert (state.status, state.steps.dead, state.steps.blocked, state.steps.failed) == (
        WorkflowStatus.SUCCEEDED, 1, False, False)  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_allow_failure_does_not_run_the_child_after_a_cancel():
    wf = Workflow("tolerant")
    wf.add("a", request())
    wf.add("sink", request(), after="a", allow_failure=True)
    result = wf.enqueue()

    cancel(result.jobs["a"])
    run_worker()

    assert statuses(dict(result.jobs)) == {"a": "cancelled", "sink": "cancelled"}
    assert result.state().status == WorkflowStatus.CANCELLED


# -- state --------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_workflow_state_orders_cancelled_blocked_running_failed_succeeded():
    def made(name: str, *steps: tuple[str, EnqueueRequest, str | None]) -> int:
        wf = Workflow(name)
        for step, req, after in steps:
            wf.add(step, req, after=() if after is None else after)
        return wf.enqueue().workflow_id

    running_one = made("running", ("a", request(), None), ("b", request(), "a"))
    failed = made("failed", ("a", request(), None), ("leaf", dying(), "a"))
    blocked = made("blocked", ("a", dying(), None), ("b", request(), "a"), ("slow", request(), None))
    succeeded = made("succeeded", ("a", request(), None))
    cancelled = made("cancelled", ("a", request(), None), ("b", dying(), None))
    run_worker()
    Job.objects.filter(workflow_id=blocked, step_name="slow").update(status=JobStatus.QUEUED)  # still to run
    Job.objects.filter(workflow_id=running_one, step_name="b").update(status=JobStatus.QUEUED)
    cancel_workflow(cancelled)  # a is done; nothing to cancel but its dead step b stays dead
    Job.objects.filter(workflow_id=cancelled, step_name="a").update(status=JobStatus.CANCELLED)

    states = workflow_states([running_one, failed, blocked, succeeded, cancelled, 2**63 - 1])

    assert {wid: state.status for wid, state in states.items()} == {
        running_one: WorkflowStatus.RUNNING,
        failed: WorkflowStatus.FAILED,
        blocked: WorkflowStatus.BLOCKED,
        succeeded: WorkflowStatus.SUCCEEDED,
        cancelled: WorkflowStatus.CANCELLED,
    }
    assert str(WorkflowStatus.BLOCKED) == "blocked"


@pytest.mark.django_db
def test_workflow_states_is_one_query_for_a_page_of_workflows(django_assert_num_queries):
    ids = []
    for n in range(20):
        wf = Workflow(f"page {n}")
        wf.add("a", request())
        wf.add("b", request(), after="a")
        ids.append(wf.enqueue().workflow_id)
    with django_assert_num_queries(1):
        states = workflow_states(ids)
    assert {state.status for state in states.values()} == {WorkflowStatus.RUNNING}


# -- purge --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_purge_never_deletes_a_workflow_step():
    jobs = diamond_with_tail()
    plain = enqueue("tests.record", {})

    assert purge(queue="default") == 1
    assert purge(job_ids=[jobs["a"], jobs["x"]]) == 0

    assert not Job.objects.filter(pk=plain).exists()
    assert statuses(jobs) == {"a": "queued", "b": "waiting", "c": "waiting", "d": "waiting", "e": "waiting",
                              "x": "queued"}  # fmt: skip
