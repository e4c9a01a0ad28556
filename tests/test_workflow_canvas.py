"""The canvas shorthands (decision 0022 §6, increment 9): ``chain``, ``group`` and ``chord`` build
workflows whose steps are named ``"<index>.<job_type>"``, so the same calls give the same graph and
fingerprint; a keyed chord replays; a chord's callback reads its header's results. Real PostgreSQL
and a real worker where something is enqueued."""

from __future__ import annotations

from typing import Any

import pytest

from django_workhorse import (
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    Idempotency,
    WorkflowDefinitionError,
    chain,
    chord,
    group,
)
from django_workhorse.models import Job, JobStatus
from django_workhorse.workflows import Workflow
from django_workhorse.workflows.fingerprint import field_digests, graph_digest
from tests.test_workflow_enqueue import rows
from tests.worker_tasks import CALLS, run_worker

KEY = Idempotency("chord:1", scope="tests.canvas")


def request(job_type: str = "tests.wf.context", payload: Any = None) -> EnqueueRequest:
    return EnqueueRequest(job_type, {} if payload is None else payload, EnqueueOptions())


def graph(workflow: Workflow) -> dict[str, tuple[str, ...]]:
    """Each step's parents, steps in the order they are written."""
    return {step.name: step.parents for step in workflow.plan().steps}


def fingerprint(workflow: Workflow) -> bytes:
    return graph_digest(field_digests(workflow.plan()))


# -- graphs and names ---------------------------------------------------------------------------------


def test_chain_runs_its_requests_one_after_another():
    workflow = chain(request("charge"), request("pack"), request("charge"))

    assert (workflow.name, workflow.idempotency) == ("chain", None)
    assert graph(workflow) == {"0.charge": (), "1.pack": ("0.charge",), "2.charge": ("1.pack",)}


def test_group_runs_its_requests_side_by_side():
    workflow = group(request("mail"), request("mail"), name="mails", idempotency=KEY)

    assert (workflow.name, workflow.idempotency) == ("mails", KEY)
    assert graph(workflow) == {"0.mail": (), "1.mail": ()}


def test_chord_runs_its_callback_after_every_header_step_from_a_group_or_a_list():
    from_group = chord(group(request("a"), request("b")), request("sum"))
    from_list = chord([request("a"), request("b")], request("sum"))

    assert from_group.name == from_list.name == "chord"
    assert graph(from_group) == graph(from_list) == {"0.a": (), "1.b": (), "2.sum": ("0.a", "1.b")}
    assert fingerprint(from_group) == fingerprint(from_list)


def test_chord_over_a_chain_runs_its_callback_after_the_chains_last_step():
    workflow = chord(chain(request("a"), request("b")), request("sum"), name="after chain")

    assert graph(workflow) == {"0.a": (), "1.b": ("0.a",), "2.sum": ("1.b",)}


def test_the_same_calls_give_the_same_fingerprint_and_a_changed_one_another():
    assert fingerprint(chain(request("a"), request("b"))) == fingerprint(chain(request("a"), request("b")))
    assert fingerprint(chain(request("a"), request("b"))) != fingerprint(chain(request("b"), request("a")))
    assert fingerprint(chain(request("a", {"n": 1}))) != fingerprint(chain(request("a", {"n": 2})))
    assert fingerprint(group(request("a"), request("b"))) != fingerprint(chain(request("a"), request("b")))


def test_a_long_job_type_is_cut_to_a_step_name_of_200_characters():
    long = "t" * 255  # the longest job type

    names = list(graph(group(*[request(long)] * 11)))

    assert [len(name) for name in names] == [200] * 11
    assert names[10] == "10." + "t" * 197 and len(set(names)) == 11


def test_bad_input_is_a_workflow_definition_error_naming_the_field():
    for build in (chain, group):
        with pytest.raises(WorkflowDefinitionError, match="steps must be at least 1 step") as caught:
            build()
        assert caught.value.field == "steps"
    with pytest.raises(WorkflowDefinitionError, match="steps must be at least 1 step"):
        chord([], request())
    with pytest.raises(WorkflowDefinitionError, match="steps must be at least 1 step"):
        chord(Workflow("empty"), request())
    with pytest.raises(WorkflowDefinitionError, match="header.idempotency") as caught:
        chord(group(request(), idempotency=KEY), request())
    with pytest.raises(WorkflowDefinitionError, match="header") as caught:
        chord(request(), request())  # type: ignore[arg-type]
    assert caught.value.field == "header"
    with pytest.raises(WorkflowDefinitionError, match="request") as caught:
        chain(request(), "tests.record")  # type: ignore[arg-type]
    assert (caught.value.step, caught.value.field) == ("1", "request")
    with pytest.raises(WorkflowDefinitionError, match="request") as caught:
        chord([request()], None)  # type: ignore[arg-type]
    assert (caught.value.step, caught.value.field) == ("1", "request")
    with pytest.raises(WorkflowDefinitionError, match="name"):
        chain(request(), name="")


# -- enqueued -----------------------------------------------------------------------------------------


def keyed_chord() -> Workflow:
    return chord(group(request(payload={"n": 1}), request(payload={"n": 2})), request(), idempotency=KEY)


@pytest.mark.django_db
def test_a_replayed_keyed_chord_returns_the_same_ids_and_writes_nothing(django_assert_num_queries):
    first = keyed_chord().enqueue()
    before = rows()

    with django_assert_num_queries(1):
        again = keyed_chord().enqueue()

    assert (first.outcome, again.outcome) == (EnqueueOutcome.ACCEPTED, EnqueueOutcome.REPLAYED)
    assert (again.workflow_id, dict(again.jobs)) == (first.workflow_id, dict(first.jobs))
    assert list(first.jobs) == ["0.tests.wf.context", "1.tests.wf.context", "2.tests.wf.context"]
    assert rows() == before


@pytest.mark.django_db(transaction=True)
def test_a_chords_callback_reads_its_headers_results():
    CALLS.clear()
    header = group(request(payload={"result": 3}), request(payload={"result": 4}), request("tests.record", {"n": 5}))
    result = chord(header, request()).enqueue()

    run_worker(concurrency=3)

    assert set(Job.objects.filter(pk__in=result.jobs.values()).values_list("status", flat=True)) == {
        JobStatus.SUCCEEDED
    }
    callback = next(
        call for call in CALLS.items() if isinstance(call, dict) and call.get("step") == "3.tests.wf.context"
    )
    assert callback["parents"] == {"0.tests.wf.context": 3, "1.tests.wf.context": 4, "2.tests.record": {"n": 5}}
    assert callback["failed"] == ()
