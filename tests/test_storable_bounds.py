"""What PostgreSQL cannot store or Python cannot read back is refused before SQL, at every entry point.

Each case runs inside the caller's ``transaction.atomic`` and checks three things: the typed error
names the field, no row was written, and the transaction is still usable (a good enqueue after it
commits). The edges are exact: the last allowed value passes and reads back equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

import django_workhorse
from django_workhorse import (
    Debounce,
    EnqueueRequest,
    EnqueueValidationError,
    Idempotency,
    Throttle,
    Unique,
    once,
)
from django_workhorse.conf import MAX_ID, MAX_JSON_DEPTH
from django_workhorse.enqueueing.storable import json_depth, storable_text
from django_workhorse.exceptions import EffectValidationError, InvalidArgumentError, JobDoesNotExist
from django_workhorse.models import JOB_DEADLINE_CHECK, JOB_RUN_AT_CHECK, EffectRecord, Job
from django_workhorse.operations.actions import cancel, purge, redrive, release_bindings, run_now
from tests.conftest import count_rows
from tests.values import nested

pytestmark = pytest.mark.django_db

TEXT_BOUND = "text without NUL characters or lone surrogates"
UNSTORABLE = {"nul": "a\x00b", "surrogate": "a\udc80b"}
UTC = timezone.utc
LAST_INSTANT = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
FIRST_INSTANT = datetime(1, 1, 1, tzinfo=UTC)


def refused_in_atomic(error: type[Exception], call: Callable[[], Any]) -> Exception:
    """Run ``call`` in a transaction: assert it raised ``error``, wrote nothing and left the transaction usable."""
    before = count_rows()
    with transaction.atomic():
        with pytest.raises(error) as info:
            call()
        assert count_rows() == before
        good = django_workhorse.enqueue("tests.noop", {"after": "refusal"})
    assert Job.objects.filter(pk=good).exists()
    return info.value


# -- text ------------------------------------------------------------------------------------------

TEXT_FIELDS: dict[str, Callable[[str], Callable[[], Any]]] = {
    "job_type": lambda bad: lambda: django_workhorse.enqueue(f"tests.{bad}"),
    "queue": lambda bad: lambda: django_workhorse.enqueue("tests.noop", queue=bad),
    "tags": lambda bad: lambda: django_workhorse.enqueue("tests.noop", tags=["ok", bad]),
    "concurrency_key": lambda bad: lambda: django_workhorse.enqueue("tests.noop", concurrency_key=bad),
    "idempotency.key": lambda bad: lambda: django_workhorse.enqueue("tests.noop", idempotency=Idempotency(bad)),
    "idempotency.scope": lambda bad: (
        lambda: django_workhorse.enqueue("tests.noop", idempotency=Idempotency("k", scope=bad))
    ),
    "unique.key": lambda bad: lambda: django_workhorse.enqueue("tests.noop", unique=Unique(bad)),
    "debounce.key": lambda bad: (
        lambda: django_workhorse.enqueue("tests.noop", debounce=Debounce(bad, window=timedelta(seconds=1)))
    ),
    "throttle.scope": lambda bad: (
        lambda: django_workhorse.enqueue("tests.noop", throttle=Throttle("k", window=timedelta(seconds=1), scope=bad))
    ),
}


@pytest.mark.parametrize("kind", UNSTORABLE)
@pytest.mark.parametrize("field", TEXT_FIELDS)
def test_enqueue_refuses_unstorable_text_naming_the_field(field, kind):
    error = refused_in_atomic(EnqueueValidationError, TEXT_FIELDS[field](UNSTORABLE[kind]))
    assert (error.field, error.bound) == (field, TEXT_BOUND)


@pytest.mark.parametrize("kind", UNSTORABLE)
def test_a_batch_refuses_unstorable_text_naming_the_ordinal(kind):
    batch = [EnqueueRequest("tests.noop"), EnqueueRequest("tests.noop", {"a": [UNSTORABLE[kind]]})]
    error = refused_in_atomic(EnqueueValidationError, lambda: django_workhorse.enqueue_many(batch))
    assert (error.field, error.bound, error.ordinal) == ("payload['a'][0]", TEXT_BOUND, 1)


def test_a_key_with_unstorable_text_is_never_echoed():
    error = refused_in_atomic(
        EnqueueValidationError, lambda: django_workhorse.enqueue("tests.noop", unique=Unique("SECRET\x00key"))
    )
    assert "SECRET" not in str(error) and "SECRET" not in repr(error.value)


def test_storable_text_escapes_what_postgresql_cannot_store_and_keeps_the_rest():
    assert storable_text("a\x00b\udc80c é ✓") == "a\\x00b\\udc80c é ✓"
    assert storable_text("x" * 10, max_chars=5) == "xxxx…"


# -- time ------------------------------------------------------------------------------------------

PAST_THE_END = {
    "year-10000-utc-5": datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5))),
    "year-0-utc+5": datetime(1, 1, 1, 4, 59, tzinfo=timezone(timedelta(hours=5))),
}


@pytest.mark.parametrize("field", ["run_at", "deadline"])
@pytest.mark.parametrize("value", PAST_THE_END.values(), ids=PAST_THE_END.keys())
def test_an_instant_python_cannot_read_back_is_refused(field, value):
    error = refused_in_atomic(EnqueueValidationError, lambda: django_workhorse.enqueue("tests.noop", **{field: value}))
    assert (error.field, error.bound) == (field, "an instant in UTC years 1..9999")


@pytest.mark.parametrize("field", ["run_at", "deadline"])
@pytest.mark.parametrize(
    "value",
    [LAST_INSTANT, FIRST_INSTANT, datetime(1, 1, 1, 5, 0, tzinfo=timezone(timedelta(hours=5)))],
    ids=["last", "first", "first-at-+05:00"],
)
def test_the_first_and_last_readable_instants_are_stored_and_read_back(field, value):
    job = Job.objects.get(pk=django_workhorse.enqueue("tests.noop", **{field: value}))
    assert getattr(job, field) == value


@pytest.mark.parametrize(("column", "constraint"), [("run_at", JOB_RUN_AT_CHECK), ("deadline", JOB_DEADLINE_CHECK)])
@pytest.mark.parametrize("instant", ["10000-01-01 00:00:00+00", "0001-12-31 23:59:59+00 BC"])
def test_the_instant_bound_is_a_check_constraint_too(column, constraint, instant):
    job_id = django_workhorse.enqueue("tests.noop")
    with pytest.raises(IntegrityError) as info, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE workhorse_job SET {column} = %s::timestamptz WHERE id = %s", [instant, job_id])
    assert constraint in str(info.value)


# -- JSON ------------------------------------------------------------------------------------------


def test_payload_nesting_is_bounded_at_exactly_the_limit():
    assert json_depth(nested(MAX_JSON_DEPTH)) == MAX_JSON_DEPTH
    job = Job.objects.get(pk=django_workhorse.enqueue("tests.noop", nested(MAX_JSON_DEPTH)))
    assert job.payload == nested(MAX_JSON_DEPTH)
    error = refused_in_atomic(
        EnqueueValidationError, lambda: django_workhorse.enqueue("tests.noop", nested(MAX_JSON_DEPTH + 1))
    )
    assert (error.field, error.bound) == ("payload", f"JSON nested at most {MAX_JSON_DEPTH} deep")


def test_a_payload_nested_thousands_deep_is_a_typed_error_not_a_recursion_error():
    error = refused_in_atomic(EnqueueValidationError, lambda: django_workhorse.enqueue("tests.noop", nested(5000)))
    assert error.bound == f"JSON nested at most {MAX_JSON_DEPTH} deep"


def test_brackets_inside_strings_do_not_count_as_nesting():
    payload = {"text": "[" * 500 + "{" * 500}
    assert Job.objects.get(pk=django_workhorse.enqueue("tests.noop", payload)).payload == payload


# -- batches ---------------------------------------------------------------------------------------


def _requests(count: int) -> Iterator[EnqueueRequest]:
    return (EnqueueRequest("tests.noop", {"n": n}) for n in range(count))


def test_enqueue_many_takes_any_iterable():
    results = django_workhorse.enqueue_many(_requests(3))
    assert [Job.objects.get(pk=r.job_id).payload for r in results] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_enqueue_many_takes_a_generator_of_exactly_the_batch_bound_and_refuses_one_more():
    assert len(django_workhorse.enqueue_many(_requests(1000))) == 1000
    error = refused_in_atomic(EnqueueValidationError, lambda: django_workhorse.enqueue_many(_requests(1001)))
    assert (error.field, error.bound) == ("requests", "at most 1000 requests")


@pytest.mark.parametrize("requests", [5, None, "abc", {"job_type": "x"}], ids=["int", "none", "str", "dict"])
def test_enqueue_many_refuses_what_is_not_an_iterable_of_requests(requests):
    error = refused_in_atomic(EnqueueValidationError, lambda: django_workhorse.enqueue_many(requests))
    assert error.field == "requests"


# -- operator actions ------------------------------------------------------------------------------

BAD_IDS = {"str": "12", "bytes": b"12", "int": 12, "strings": ["1", "2"], "bools": [True], "zero": [0]}
BAD_IDS |= {"past-bigint": [MAX_ID + 1], "float": [1.0], "mapping": {1: 1}}


@pytest.mark.parametrize("ids", BAD_IDS.values(), ids=BAD_IDS.keys())
@pytest.mark.parametrize(
    ("field", "action"),
    [
        ("job_ids", lambda ids: purge(job_ids=ids)),
        ("job_ids", lambda ids: run_now(ids)),
        ("binding_ids", lambda ids: release_bindings(ids)),
    ],
    ids=["purge", "run_now", "release_bindings"],
)
def test_id_arguments_take_sequences_of_ints_only(field, action, ids):
    queued = django_workhorse.enqueue("tests.noop")
    error = refused_in_atomic(InvalidArgumentError, lambda: action(ids))
    assert error.field == field
    assert Job.objects.filter(pk=queued).exists()


def test_the_largest_id_is_accepted():
    assert run_now([MAX_ID]) == []
    assert purge(job_ids=[MAX_ID]) == 0
    assert release_bindings([MAX_ID]) == []
    with pytest.raises(JobDoesNotExist):
        cancel(MAX_ID)


@pytest.mark.parametrize("job_id", ["1", True, 0, MAX_ID + 1, 1.0], ids=["str", "bool", "zero", "past", "float"])
def test_cancel_and_redrive_take_one_int_id(job_id):
    error = refused_in_atomic(InvalidArgumentError, lambda: cancel(job_id))
    assert error.field == "job_id"
    error = refused_in_atomic(InvalidArgumentError, lambda: redrive(job_id, request_id="r"))
    assert error.field == "job_id"


@pytest.mark.parametrize("kind", UNSTORABLE)
@pytest.mark.parametrize(
    ("field", "action"),
    [
        ("queue", lambda bad: purge(queue=bad)),
        ("requested_by", lambda bad: run_now([1], requested_by=bad)),
        ("requested_by", lambda bad: cancel(1, requested_by=bad)),
        ("requested_by", lambda bad: release_bindings([1], requested_by=bad)),
        ("request_id", lambda bad: redrive(1, request_id=bad)),
        ("reason", lambda bad: redrive(1, request_id="r", reason=bad)),
    ],
    ids=["purge", "run_now", "cancel", "release", "redrive-request-id", "redrive-reason"],
)
def test_operator_actions_refuse_unstorable_text(field, action, kind):
    error = refused_in_atomic(InvalidArgumentError, lambda: action(UNSTORABLE[kind]))
    assert (error.field, error.bound) == (field, TEXT_BOUND)


def test_request_id_and_requested_by_are_bounded_at_200_characters():
    with pytest.raises(JobDoesNotExist):
        redrive(1, request_id="r" * 200, requested_by="u" * 200)
    for field, kwargs in (("request_id", {"request_id": "r" * 201}), ("requested_by", {"requested_by": "u" * 201})):
        error = refused_in_atomic(
            InvalidArgumentError, lambda kwargs=kwargs: redrive(1, **{"request_id": "r", **kwargs})
        )
        assert error.field == field


# -- the effect ledger -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", UNSTORABLE)
@pytest.mark.parametrize(
    ("field", "call"),
    [
        ("key", lambda bad: once(bad, lambda: 1)),
        ("scope", lambda bad: once("k", lambda: 1, scope=bad)),
        ("result['r']", lambda bad: once("k", lambda: {"r": bad})),
    ],
    ids=["key", "scope", "result"],
)
def test_once_refuses_unstorable_text_and_stores_nothing(field, call, kind):
    error = refused_in_atomic(EffectValidationError, lambda: call(UNSTORABLE[kind]))
    assert (error.field, error.bound) == (field, TEXT_BOUND)
    assert not EffectRecord.objects.exists()


def test_once_bounds_result_nesting():
    assert once("deep-ok", lambda: nested(MAX_JSON_DEPTH)) == nested(MAX_JSON_DEPTH)
    error = refused_in_atomic(EffectValidationError, lambda: once("too-deep", lambda: nested(MAX_JSON_DEPTH + 1)))
    assert error.field == "result"
