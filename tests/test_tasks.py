"""``@task`` and ``register``: arguments bound at enqueue, task defaults, handlers and their context."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_workhorse import EnqueueOutcome, EnqueueResult, Idempotency, enqueue, task
from django_workhorse.models import Job, JobStatus
from django_workhorse.tasks.decorator import Task
from django_workhorse.tasks.registry import get_handler, register
from tests import worker_tasks
from tests.conftest import count_rows
from tests.worker_tasks import CALLS, add, annotated, greet, keywords_only, run_worker, spread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_calls() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


def payload_of(job_id: int) -> object:
    return Job.objects.values_list("payload", flat=True).get(pk=job_id)


# -- binding at enqueue ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("enqueue_call", "message"),
    [
        (lambda: add.enqueue(), "missing a required argument: 'x'"),
        (lambda: add.enqueue(1, 2, 3), "too many positional arguments"),
        (lambda: add.enqueue(1, z=3), "got an unexpected keyword argument 'z'"),
        (lambda: add.enqueue(1, x=2), "multiple values for argument 'x'"),
        (lambda: add.delay(y=2), "missing a required argument: 'x'"),
        (lambda: add.enqueue_with_result(1, 2, 3), "too many positional arguments"),
        (lambda: add.apply_async(args=(1, 2, 3)), "too many positional arguments"),
        (lambda: add.apply_async(kwargs={"nope": 1}), "missing a required argument: 'x'"),
        (lambda: greet.enqueue(), "missing a required argument: 'name'"),
        (lambda: greet.enqueue("ctx-is-not-an-argument", "Ada", "!"), "too many positional arguments"),
        (lambda: keywords_only.enqueue(1), "too many positional arguments"),
    ],
)
def test_wrong_arguments_raise_type_error_in_the_caller_and_write_nothing(enqueue_call, message):
    with pytest.raises(TypeError, match=message):
        enqueue_call()
    assert count_rows() == {"workhorse_job": 0, "workhorse_binding": 0, "workhorse_job_event": 0}


def test_defaults_are_applied_and_stored_in_the_payload():
    job_id = add.enqueue(1)

    assert payload_of(job_id) == {"x": 1, "y": 10, "scale": 1}


def test_keyword_order_and_positional_or_keyword_give_the_same_payload():
    job_ids = [add.enqueue(x=1, y=2), add.enqueue(y=2, x=1), add.enqueue(1, 2), add.enqueue(1, y=2, scale=1)]

    assert [payload_of(job_id) for job_id in job_ids] == [{"x": 1, "y": 2, "scale": 1}] * 4


def test_the_same_call_spelled_differently_replays_one_idempotent_job():
    key = Idempotency("add:1:2", scope="tests")
    first = add.apply_async(kwargs={"y": 2, "x": 1}, idempotency=key)
    second = add.apply_async(args=(1,), kwargs={"y": 2}, idempotency=key)

    assert first.outcome == EnqueueOutcome.ACCEPTED
    assert second == EnqueueResult(first.job_id, EnqueueOutcome.REPLAYED)
    assert Job.objects.count() == 1


def test_varargs_and_keyword_only_arguments_are_stored_by_name():
    job_id = spread.enqueue(1, 2, 3, flag=True, color="red")
    other = keywords_only.enqueue(a=1, z=9)

    assert payload_of(job_id) == {"first": 1, "rest": [2, 3], "flag": True, "extra": {"color": "red"}}
    assert payload_of(other) == {"a": 1, "b": 2, "extra": {"z": 9}}


# -- the four ways to enqueue, and the task's defaults ---------------------------------------------------------


def test_enqueue_delay_enqueue_with_result_and_apply_async_each_create_a_job_with_the_task_defaults():
    job_ids = [
        add.enqueue(1),
        add.delay(2),
        add.enqueue_with_result(3).job_id,
        add.apply_async(args=(4,)).job_id,
        add.apply_async(args=[5], kwargs={"y": 1}).job_id,
    ]

    jobs = Job.objects.filter(pk__in=job_ids).order_by("id")
    assert [(j.job_type, j.queue, j.priority, j.max_attempts) for j in jobs] == [("tests.add", "math", 5, 3)] * 5
    assert [j.payload["x"] for j in jobs] == [1, 2, 3, 4, 5]
    assert add.enqueue_with_result(6).outcome == EnqueueOutcome.ACCEPTED


def test_apply_async_overrides_the_task_defaults():
    result = add.apply_async(
        args=(1,), queue="urgent", priority=90, max_attempts=7, idempotency=Idempotency("k", scope="tests")
    )

    job = Job.objects.get(pk=result.job_id)
    assert (job.queue, job.priority, job.max_attempts, job.payload) == ("urgent", 90, 7, {"x": 1, "y": 10, "scale": 1})
    assert result.outcome == EnqueueOutcome.ACCEPTED
    assert job.bindings.count() == 1


def test_a_task_without_options_uses_the_global_defaults_and_its_dotted_path():
    job_id = greet.enqueue("Ada")

    job = Job.objects.get(pk=job_id)
    assert (job.job_type, job.queue, job.priority, job.max_attempts) == ("tests.worker_tasks.greet", "default", 0, 25)
    assert job.payload == {"name": "Ada", "punctuation": "!"}
    assert greet.name == "tests.worker_tasks.greet" and isinstance(greet, Task)


# -- handlers on the worker ----------------------------------------------------------------------------------


def test_a_task_runs_on_the_worker_with_its_bound_arguments():
    job_id = add.enqueue(2, scale=3)

    run_worker(queues=["math"])

    assert CALLS.items() == [("add", 2, 10, 3)]
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, 36)


def test_a_task_whose_first_parameter_is_ctx_gets_the_context():
    job_id = greet.enqueue("Ada", punctuation="?")

    run_worker()

    assert CALLS.items() == [("greet", 1, "Ada")]
    assert Job.objects.get(pk=job_id).result == {"text": "Hello Ada?", "key": f"workhorse-job-{job_id}"}


def test_a_first_parameter_annotated_handler_context_gets_the_context_whatever_its_name():
    task_job = annotated.enqueue(5)
    plain_job = enqueue("tests.plain_with_context", {"p": 1})

    run_worker()

    assert Job.objects.get(pk=task_job).result == {"job_id": task_job, "n": 5}
    assert Job.objects.get(pk=plain_job).result == {"attempt": 1, "payload": {"p": 1}}


def test_a_registered_handler_receives_the_payload():
    job_id = enqueue("tests.record", {"a": [1, 2]})

    run_worker()

    assert CALLS.items() == [{"a": [1, 2]}]
    assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED


def test_register_works_as_a_call_and_as_a_decorator():
    def handler(payload: object) -> object:
        return payload

    assert register("tests.register_call", handler) is handler

    @register("tests.register_decorator")
    def decorated(payload: object) -> object:
        return payload

    assert get_handler("tests.register_call").func is handler
    assert get_handler("tests.register_decorator").func is decorated
    assert not get_handler("tests.register_call").takes_context


def test_keyword_only_and_var_keyword_arguments_reach_the_task():
    job_id = keywords_only.enqueue(a=1, z=9)

    run_worker()

    assert CALLS.items() == [("keywords_only", 1, 2, {"z": 9})]
    assert Job.objects.get(pk=job_id).result == {"a": 1, "b": 2, "extra": {"z": 9}}


def test_a_task_with_star_args_after_a_positional_parameter_runs_with_its_arguments():
    job_id = spread.enqueue(1, 2, 3, flag=True, color="red")

    run_worker()

    job = Job.objects.get(pk=job_id)
    assert job.last_error == ""
    assert (job.status, job.result) == (
        JobStatus.SUCCEEDED,
        {"first": 1, "rest": [2, 3], "flag": True, "extra": {"color": "red"}},
    )


def test_a_payload_missing_an_argument_fails_instead_of_shifting_the_others():
    # Enqueued by job type (not through the task), as another service or an older release might.
    job_id = enqueue("tests.add", {"y": 5}, queue="math", max_attempts=1)

    run_worker(queues=["math"])

    assert CALLS.items() == []
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.DEAD
    assert job.last_error.startswith("TypeError: ") and "'x'" in job.last_error.splitlines()[0]


# -- in-process calls ------------------------------------------------------------------------------------------


def test_calling_the_task_runs_the_function_in_process_and_enqueues_nothing():
    assert add(1, 2, scale=3) == 9
    assert spread(1, 2, flag=True) == {"first": 1, "rest": [2], "flag": True, "extra": {}}

    assert CALLS.items() == [("add", 1, 2, 3), ("spread", 1, (2,), True, {})]
    assert count_rows() == {"workhorse_job": 0, "workhorse_binding": 0, "workhorse_job_event": 0}


def test_the_task_module_registers_its_handlers_on_import():
    assert get_handler("tests.add").func is worker_tasks.add.func
    assert get_handler("tests.worker_tasks.greet").takes_context
    assert get_handler("tests.annotated").takes_context
    assert not get_handler("tests.add").takes_context


def test_idempotent_task_coalesces_a_repeated_call_onto_the_live_job():
    @task(name="tests.idempotent_flag", idempotent=True)
    def charge(ctx: object, customer_id: int) -> None: ...

    first = charge.enqueue_with_result(42)
    again = charge.enqueue_with_result(customer_id=42)

    assert isinstance(charge, Task) and charge.idempotent
    assert first.outcome is EnqueueOutcome.ACCEPTED
    assert again == EnqueueResult(first.job_id, EnqueueOutcome.COALESCED)
    assert count_rows()["workhorse_job"] == 1
