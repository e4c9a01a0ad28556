"""A workflow's definition (decision 0022, increment 2): ``Task.s``/``signature``, ``Workflow.add`` and
``Workflow.plan``. Pure Python: every bad input is a ``WorkflowDefinitionError`` naming its step and
field, with the exact bound; nothing is read or written (one test pins that no query runs)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.core.checks import Error
from django.test import override_settings

from django_workhorse import (
    Debounce,
    EnqueueOptions,
    EnqueueRequest,
    EnqueueValidationError,
    Idempotency,
    InvalidArgumentError,
    Throttle,
    Unique,
    WorkflowDefinitionError,
    task,
)
from django_workhorse.checks import check_settings
from django_workhorse.workflows import Plan, Step, Workflow


@task(name="tests.wf_definition.charge", idempotent=True)
def charge(order_id: int, amount_cents: int = 1000) -> None:
    """An idempotent task: ``as_request`` derives it a key, ``s`` never does."""


@task(name="tests.wf_definition.mail", queue="mail", priority=3)
def mail(order_id: int, *, template: str = "receipt") -> None:
    """A task with its own default options."""


def step_of(exc: pytest.ExceptionInfo[WorkflowDefinitionError]) -> tuple[str | None, str, str, object]:
    error = exc.value
    return (error.step, error.field, error.bound, error.value)


# -- Task.s and Task.signature ---------------------------------------------------------------------------------


def test_s_binds_the_arguments_now_with_the_tasks_default_options():
    request = mail.s(7, template="refund")

    assert request == EnqueueRequest("tests.wf_definition.mail", {"order_id": 7, "template": "refund"}, request.options)
    assert (request.options.queue, request.options.priority) == ("mail", 3)
    assert request == mail.as_request((7,), {"template": "refund"})


def test_s_never_derives_the_key_of_an_idempotent_task():
    assert charge.as_request((1,)).options.unique is not None  # what s must not do
    request = charge.s(1)

    assert request.payload == {"order_id": 1, "amount_cents": 1000}
    assert all(getattr(request.options, mode) is None for mode in ("idempotency", "unique", "debounce", "throttle"))
    assert request == charge.as_request((1,), idempotent=False)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1, 2, 3), {}), ((), {"nope": 1}), ((), {}), ((1,), {"order_id": 1})],
    ids=["too many", "unknown keyword", "missing", "twice"],
)
def test_s_raises_type_error_in_the_caller_for_a_call_that_does_not_fit(args, kwargs):
    with pytest.raises(TypeError):
        charge.s(*args, **kwargs)
    with pytest.raises(TypeError):
        charge.signature(args, kwargs)


def test_signature_binds_the_arguments_and_overrides_options():
    request = mail.signature((7,), {"template": "refund"}, priority=9, tags=["x"])

    assert request.payload == {"order_id": 7, "template": "refund"}
    assert (request.options.queue, request.options.priority, request.options.tags) == ("mail", 9, ["x"])
    assert charge.signature([5]).payload == {"order_id": 5, "amount_cents": 1000}
    assert charge.signature([5]).options.unique is None


def test_signature_takes_no_idempotent_flag():
    with pytest.raises(TypeError, match="idempotent"):
        charge.signature((1,), idempotent=True)


def test_signature_refuses_an_unknown_option_naming_it():
    with pytest.raises(EnqueueValidationError) as caught:
        mail.signature((1,), using="other")
    assert caught.value.field == "using"


def test_a_signature_with_a_key_of_its_own_is_refused_as_a_step():
    request = charge.signature((1,), unique_key="k-1")
    assert request.options.unique is not None

    with pytest.raises(WorkflowDefinitionError) as caught:
        Workflow("w").add("charge", request)
    assert (caught.value.step, caught.value.field) == ("charge", "unique")


# -- the workflow's own name and key ---------------------------------------------------------------------------


def test_a_workflow_name_of_200_characters_is_accepted_and_201_refused():
    assert Workflow("n" * 200).name == "n" * 200
    with pytest.raises(WorkflowDefinitionError) as caught:
        Workflow("n" * 201)
    assert step_of(caught) == (None, "name", "1..200 characters", "n" * 201)


@pytest.mark.parametrize(
    ("name", "bound"),
    [("", "1..200 characters"), ("a\x00b", "text without NUL characters or lone surrogates"), (3, "a string")],
    ids=["empty", "NUL", "not text"],
)
def test_a_bad_workflow_name_is_refused(name, bound):
    with pytest.raises(WorkflowDefinitionError) as caught:
        Workflow(name)
    assert (caught.value.step, caught.value.field, caught.value.bound) == (None, "name", bound)
    assert str(caught.value).startswith("workflow: name must be ")


def test_the_workflow_takes_only_the_idempotency_mode():
    assert Workflow("w", idempotency=Idempotency("k")).idempotency == Idempotency("k")
    assert Workflow("w").idempotency is None
    for other in (Unique("k"), Debounce("k", window=timedelta(seconds=1)), Throttle("k", window=timedelta(1)), "k"):
        with pytest.raises(WorkflowDefinitionError) as caught:
            Workflow("w", idempotency=other)  # type: ignore[arg-type]
        assert (caught.value.step, caught.value.field) == (None, "idempotency")
        assert caught.value.value == type(other).__name__  # never the key itself
        assert "'k'" not in str(caught.value)


@pytest.mark.parametrize(
    ("mode", "field"),
    [
        (Idempotency("k" * 513), "idempotency.key"),
        (Idempotency(""), "idempotency.key"),
        (Idempotency("k", scope="s" * 257), "idempotency.scope"),
        (Idempotency("k", scope="workhorse.ticks"), "idempotency.scope"),
        (Idempotency("k", ttl=timedelta(0)), "idempotency.ttl"),
        (Idempotency("k", ttl=timedelta(days=366)), "idempotency.ttl"),
    ],
    ids=["key 513 bytes", "empty key", "scope 257 bytes", "reserved scope", "ttl 0", "ttl 366 days"],
)
def test_the_workflow_key_is_checked_as_enqueue_checks_it(mode, field):
    with pytest.raises(WorkflowDefinitionError) as caught:
        Workflow("w", idempotency=mode)
    assert (caught.value.step, caught.value.field) == (None, field)
    assert "k" * 20 not in str(caught.value)


def test_the_workflow_key_at_its_bounds_is_accepted():
    Workflow("w", idempotency=Idempotency("k" * 512, scope="s" * 256, ttl=timedelta(days=365)))
    Workflow("w", idempotency=Idempotency("k", ttl=timedelta(milliseconds=1)))


# -- steps -----------------------------------------------------------------------------------------------------


def test_add_returns_a_frozen_handle_named_after_the_step():
    step = Workflow("w").add("charge", charge.s(1))

    assert step == Step("charge")
    assert step.name == "charge"
    with pytest.raises(AttributeError):
        step.name = "other"  # type: ignore[misc]


def test_a_step_name_of_200_characters_is_accepted_and_201_refused():
    workflow = Workflow("w")
    assert workflow.add("s" * 200, charge.s(1)).name == "s" * 200
    with pytest.raises(WorkflowDefinitionError) as caught:
        workflow.add("s" * 201, charge.s(1))
    assert step_of(caught) == (None, "step_name", "1..200 characters", "s" * 201)


@pytest.mark.parametrize(
    ("name", "bound"),
    [("", "1..200 characters"), ("a\x00b", "text without NUL characters or lone surrogates"), (None, "a string")],
    ids=["empty", "NUL", "not text"],
)
def test_a_bad_step_name_is_refused(name, bound):
    with pytest.raises(WorkflowDefinitionError) as caught:
        Workflow("w").add(name, charge.s(1))
    assert (caught.value.field, caught.value.bound) == ("step_name", bound)


def test_a_duplicate_step_name_is_refused_at_add():
    workflow = Workflow("w")
    workflow.add("charge", charge.s(1))

    with pytest.raises(WorkflowDefinitionError) as caught:
        workflow.add("charge", charge.s(2))
    assert step_of(caught) == ("charge", "step_name", "unique in the workflow", None)
    assert str(caught.value) == "workflow step 'charge': step_name must be unique in the workflow"
    assert len(workflow) == 1


def test_a_step_request_must_be_an_enqueue_request():
    with pytest.raises(WorkflowDefinitionError) as caught:
        Workflow("w").add("charge", charge)  # type: ignore[arg-type]
    assert (caught.value.step, caught.value.field, caught.value.value) == ("charge", "request", "Task")


@pytest.mark.parametrize(
    ("option", "mode"),
    [
        ("idempotency", Idempotency("k")),
        ("unique", Unique("k")),
        ("debounce", Debounce("k", window=timedelta(seconds=1))),
        ("throttle", Throttle("k", window=timedelta(seconds=1))),
        ("unique", "a raw key"),
    ],
    ids=["idempotency", "unique", "debounce", "throttle", "unique as text"],
)
def test_a_step_with_a_keyed_mode_is_refused(option, mode):
    request = EnqueueRequest("tests.wf_definition.mail", {"order_id": 1}, EnqueueOptions(**{option: mode}))

    with pytest.raises(WorkflowDefinitionError) as caught:
        Workflow("w").add("mail", request)
    assert (caught.value.step, caught.value.field) == ("mail", option)
    assert caught.value.bound.startswith("omitted: a step has no key of its own")
    assert "k" not in repr(caught.value.value) and "raw key" not in str(caught.value)


@pytest.mark.parametrize(
    ("after", "bound", "value"),
    [
        (3, "Step handles or step names", "int"),
        ([Step("a"), 3], "Step handles or step names", "int"),
        ([Step(3)], "Step handles or step names", "int"),  # type: ignore[arg-type]
        (["a", Step("a")], "distinct steps", "a"),
    ],
    ids=["not iterable", "an int among them", "a handle without a name", "a parent twice"],
)
def test_a_malformed_after_is_refused_naming_the_step(after, bound, value):
    workflow = Workflow("w")
    workflow.add("a", charge.s(1))

    with pytest.raises(WorkflowDefinitionError) as caught:
        workflow.add("b", charge.s(2), after=after)
    assert step_of(caught) == ("b", "after", bound, value)


def test_allow_failure_must_be_a_bool():
    with pytest.raises(WorkflowDefinitionError) as caught:
        Workflow("w").add("a", charge.s(1), allow_failure=1)  # type: ignore[arg-type]
    assert step_of(caught) == ("a", "allow_failure", "True or False", 1)


def test_after_takes_one_handle_one_name_or_any_iterable_of_them():
    workflow = Workflow("w")
    a = workflow.add("a", charge.s(1))
    workflow.add("b", charge.s(2), after=a)
    workflow.add("c", charge.s(3), after="b")
    workflow.add("d", charge.s(4), after=(name for name in ("a", "c")), allow_failure=True)

    plan = workflow.plan()
    assert [(step.name, step.parents, step.allow_failure) for step in plan.steps] == [
        ("a", (), False),
        ("b", ("a",), False),
        ("c", ("b",), False),
        ("d", ("a", "c"), True),
    ]


# -- the number of steps ---------------------------------------------------------------------------------------


def test_an_empty_workflow_is_refused():
    with pytest.raises(WorkflowDefinitionError) as caught:
        Workflow("w").plan()
    assert step_of(caught) == (None, "steps", "at least 1 step", "0 steps")


def test_max_steps_steps_are_accepted_and_one_more_refused_naming_it():
    with override_settings(WORKHORSE_WORKFLOW_MAX_STEPS=3):
        workflow = Workflow("w")
        for index in range(3):
            workflow.add(f"s{index}", charge.s(index))
        assert len(workflow.plan().steps) == 3

        with pytest.raises(WorkflowDefinitionError) as caught:
            workflow.add("s3", charge.s(3))
        assert step_of(caught) == ("s3", "steps", "at most 3 steps (WORKHORSE_WORKFLOW_MAX_STEPS)", "4 steps")
        assert len(workflow) == 3


def test_plan_checks_the_step_count_against_the_setting_in_force_then():
    workflow = Workflow("w")
    for index in range(3):
        workflow.add(f"s{index}", charge.s(index))

    with override_settings(WORKHORSE_WORKFLOW_MAX_STEPS=2), pytest.raises(WorkflowDefinitionError) as caught:
        workflow.plan()
    assert step_of(caught) == (None, "steps", "at most 2 steps (WORKHORSE_WORKFLOW_MAX_STEPS)", "3 steps")


def test_the_default_bound_is_1000_steps():
    workflow = Workflow("w")
    for index in range(1000):
        workflow.add(f"s{index}", charge.s(index), after=() if index == 0 else (f"s{index - 1}",))
    plan = workflow.plan()
    assert [step.name for step in plan.steps] == [f"s{index}" for index in range(1000)]

    with pytest.raises(WorkflowDefinitionError) as caught:
        workflow.add("s1000", charge.s(1000))
    assert step_of(caught) == ("s1000", "steps", "at most 1000 steps (WORKHORSE_WORKFLOW_MAX_STEPS)", "1001 steps")


# -- the graph -------------------------------------------------------------------------------------------------


def test_an_unknown_dependency_is_refused_naming_the_step_and_the_name():
    workflow = Workflow("w")
    workflow.add("a", charge.s(1))
    workflow.add("b", charge.s(2), after=["a", "nope"])

    with pytest.raises(WorkflowDefinitionError) as caught:
        workflow.plan()
    assert step_of(caught) == ("b", "after", "names of steps of this workflow", "nope")


def test_a_cycle_is_refused_naming_the_steps_on_it_not_those_it_holds_back():
    workflow = Workflow("w")
    workflow.add("downstream", charge.s(0), after="c")  # left by Kahn's algorithm, but on no cycle
    workflow.add("root", charge.s(1))
    workflow.add("a", charge.s(2), after=["root", "c"])
    workflow.add("b", charge.s(3), after="a")
    workflow.add("c", charge.s(4), after="b")

    with pytest.raises(WorkflowDefinitionError) as caught:
        workflow.plan()
    assert step_of(caught) == ("a", "after", "free of cycles", ("a", "b", "c"))
    assert str(caught.value) == "workflow step 'a': after must be free of cycles, got ('a', 'b', 'c')"


def test_a_step_after_itself_is_a_cycle_of_one():
    workflow = Workflow("w")
    workflow.add("a", charge.s(1), after="a")

    with pytest.raises(WorkflowDefinitionError) as caught:
        workflow.plan()
    assert step_of(caught) == ("a", "after", "free of cycles", ("a",))


def test_a_diamond_comes_out_in_topological_order_with_forward_references():
    workflow = Workflow("fulfil")
    workflow.add("close", charge.s(4), after=["pack", "mail"])  # both named before they exist
    workflow.add("mail", mail.s(1), after="charge", allow_failure=True)
    workflow.add("pack", charge.s(2), after="charge")
    workflow.add("charge", charge.s(1))

    plan = workflow.plan()

    assert isinstance(plan, Plan)
    assert (plan.name, plan.idempotency) == ("fulfil", None)
    assert [(step.name, step.parents) for step in plan.steps] == [
        ("charge", ()),
        ("mail", ("charge",)),
        ("pack", ("charge",)),
        ("close", ("pack", "mail")),
    ]
    assert plan.edges() == ((1, 0, True), (2, 0, False), (3, 2, False), (3, 1, False))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.steps = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.steps[0].parents = ("x",)  # type: ignore[misc]


def test_steps_ready_together_keep_the_order_they_were_added_in():
    # A graph added in a topological order comes out unchanged (a FIFO queue would put b before x).
    workflow = Workflow("w")
    workflow.add("a", charge.s(1))
    workflow.add("x", charge.s(2), after="a")
    workflow.add("b", charge.s(3))
    workflow.add("y", charge.s(4), after="b")

    assert [step.name for step in workflow.plan().steps] == ["a", "x", "b", "y"]


def test_a_200_step_fan_out_and_fan_in():
    workflow = Workflow("fan", idempotency=Idempotency("fan-1"))
    sink = [f"m{index}" for index in range(198)]
    workflow.add("sink", charge.s(0), after=sink)
    source = workflow.add("source", charge.s(1))
    for index, name in enumerate(sink):
        workflow.add(name, charge.s(index), after=source)

    plan = workflow.plan()

    assert [step.name for step in plan.steps] == ["source", *sink, "sink"]
    assert plan.steps[-1].parents == tuple(sink)
    assert len(plan.edges()) == 2 * 198
    assert plan.idempotency == Idempotency("fan-1")


def test_plan_prepares_each_step_as_enqueue_would():
    workflow = Workflow("w")
    workflow.add("mail", mail.s(7))
    workflow.add("custom", EnqueueRequest("tests.wf_definition.mail", {"order_id": 8}, EnqueueOptions(priority=5)))

    first, second = workflow.plan().steps

    assert (first.prepared.job_type, first.prepared.queue, first.prepared.priority) == (
        "tests.wf_definition.mail",
        "mail",
        3,
    )
    assert first.prepared.payload_json == '{"order_id":7,"template":"receipt"}'
    assert first.prepared.binding is None
    # A hand-built request of a task's job type gets the task's defaults, as enqueue_many gives them.
    assert (second.prepared.queue, second.prepared.priority) == ("mail", 5)


# -- a step enqueue would refuse -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "field", "bound"),
    [
        (mail.signature((1,), priority=101), "priority", "an integer in 0..100"),
        (mail.signature((1,), queue=""), "queue", "1..100 characters"),
        (mail.signature((1,), rate_limit="nowhere"), "rate_limit", "a name in WORKHORSE_RATE_LIMITS"),
        (EnqueueRequest("tests.wf_definition.mail", {"x": object()}), "payload", None),
        (EnqueueRequest("", {}), "job_type", "1..255 characters"),
        (EnqueueRequest("tests.wf_definition.mail", {}, "fast"), "options", "an EnqueueOptions value"),  # type: ignore[arg-type]
    ],
    ids=["priority", "queue", "rate_limit", "payload", "job_type", "options"],
)
def test_a_step_that_enqueue_refuses_is_refused_naming_the_step(request_, field, bound):
    workflow = Workflow("w")
    workflow.add("first", mail.s(1))
    workflow.add("bad", request_, after="first")

    with pytest.raises(WorkflowDefinitionError) as caught:
        workflow.plan()

    assert (caught.value.step, caught.value.field) == ("bad", field)
    if bound is not None:
        assert caught.value.bound == bound
    cause = caught.value.__cause__
    assert isinstance(cause, EnqueueValidationError)
    assert (cause.field, cause.bound, cause.value) == (field, caught.value.bound, caught.value.value)
    assert str(caught.value) == f"workflow step 'bad': {cause}"


def test_a_payload_over_the_bound_is_refused_at_plan_under_the_setting_in_force():
    workflow = Workflow("w")
    workflow.add("big", mail.s(1, template="x" * 100))
    workflow.plan()

    with override_settings(WORKHORSE_MAX_PAYLOAD_BYTES=64), pytest.raises(WorkflowDefinitionError) as caught:
        workflow.plan()
    error = caught.value
    assert (error.step, error.field, error.bound) == ("big", "payload", "at most 64 bytes serialized")


def test_the_error_is_an_invalid_argument_error():
    assert issubclass(WorkflowDefinitionError, InvalidArgumentError)
    assert issubclass(WorkflowDefinitionError, ValueError)


# -- no database -----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_add_and_plan_make_no_query(django_assert_num_queries):
    with django_assert_num_queries(0):
        workflow = Workflow("w", idempotency=Idempotency("k"))
        first = workflow.add("a", charge.s(1))
        workflow.add("b", mail.signature((2,), priority=4), after=first)
        workflow.add("c", charge.s(3), after=["a", "b"])
        assert [step.name for step in workflow.plan().steps] == ["a", "b", "c"]


# -- WORKHORSE_WORKFLOW_MAX_STEPS (workhorse.E501) -------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 1000, 10_000])
def test_check_settings_accepts_workflow_max_steps_in_bounds(limit):
    with override_settings(WORKHORSE_WORKFLOW_MAX_STEPS=limit):
        assert check_settings() == []


@pytest.mark.parametrize("limit", [0, 10_001, -1, True, "100", 100.0, None], ids=repr)
def test_check_settings_rejects_workflow_max_steps_out_of_bounds(limit):
    with override_settings(WORKHORSE_WORKFLOW_MAX_STEPS=limit):
        assert check_settings() == [
            Error(f"WORKHORSE_WORKFLOW_MAX_STEPS must be an integer in 1..10000, got {limit!r}.", id="workhorse.E501")
        ]
