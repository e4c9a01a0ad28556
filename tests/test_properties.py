"""Property tests: any value at any public entry point is either refused or stored faithfully.

For arbitrary text (NUL and lone surrogates included), datetimes over Python's whole range at odd
offsets, nested JSON, numbers at and past every bound and wrong types, each entry point either

- raises its typed error, with every workhorse table unchanged and the caller's transaction
  still usable, or
- succeeds, and what it stored reads back equal to what was given.

Each example runs in a savepoint that is rolled back afterwards, so examples do not see each
other's rows. Profiles (``ci`` by default, ``long`` by hand) are set in ``tests/conftest.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import django_workhorse
from django_workhorse import Debounce, EnqueueRequest, Idempotency, Throttle, Unique, once, task
from django_workhorse.conf import MAX_ID, MAX_JSON_DEPTH
from django_workhorse.exceptions import (
    EffectValidationError,
    EnqueueValidationError,
    InvalidArgumentError,
    JobDoesNotExist,
)
from django_workhorse.models import Job
from django_workhorse.operations.actions import cancel, purge, redrive, release_bindings, run_now
from tests.conftest import count_rows, example_savepoint
from tests.values import as_stored, nested, read_back

pytestmark = pytest.mark.django_db


def assert_refused_cleanly(error: type[Exception], call: Callable[[], Any]) -> Any:
    """Run ``call``: return its value, or (when it raises ``error``) assert nothing changed and the transaction works.

    Any other exception fails the property.
    """
    before = count_rows()
    try:
        value = call()
    except error as exc:
        event("refused")  # shown by --hypothesis-show-statistics: both branches must be exercised
        assert getattr(exc, "field", "x"), "a typed error names its field"
        assert count_rows() == before
        django_workhorse.enqueue("tests.noop", {"after": "refusal"})  # the transaction is usable
        return exc
    event("accepted")
    return value


# -- strategies ------------------------------------------------------------------------------------

# Any code point, surrogates (category Cs) included, with NUL and a lone surrogate over-represented.
any_char = st.characters(exclude_categories=()) | st.sampled_from(["\x00", "\udc80", "\ud800", "\u2028", "é"])
any_text = st.text(any_char, max_size=12)
names = any_text | st.sampled_from(["default", "q", "x" * 100, "x" * 101, "x" * 255, "x" * 256])

odd_offsets = st.builds(
    timezone, st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59))
)
any_datetime = st.datetimes(min_value=datetime.min, max_value=datetime.max, timezones=odd_offsets | st.none())
edge_datetime = st.sampled_from(
    [
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc),
        datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5))),
        datetime(1, 1, 1, tzinfo=timezone.utc),
        datetime(1, 1, 1, 4, 59, tzinfo=timezone(timedelta(hours=5))),
    ]
)
datetimes = any_datetime | edge_datetime

durations = st.timedeltas(min_value=timedelta(days=-2), max_value=timedelta(days=400)) | st.sampled_from(
    [timedelta(0), timedelta(milliseconds=1), timedelta(days=365), timedelta(days=365, microseconds=1)]
)
numbers = st.integers() | st.floats() | st.sampled_from([0, 1, 100, 101, -1, 2**15, 2**63, 10**4400])
wrong_types = (
    st.none() | st.binary(max_size=4) | st.booleans() | st.just(object()) | st.lists(st.integers(), max_size=2)
)


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | any_text
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4),
    max_leaves=20,
) | st.integers(MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 2).map(nested)


# What each entry point accepts, so that about half the examples exercise the "stored and read
# back equal" branch (hostile values alone are nearly always refused somewhere).
valid_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=12)
valid_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | valid_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(valid_text, children, max_size=4),
    max_leaves=20,
)
valid_duration = st.timedeltas(min_value=timedelta(milliseconds=1), max_value=timedelta(days=365))
valid_datetime = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=odd_offsets
) | st.sampled_from(
    [datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc), datetime(1, 1, 1, tzinfo=timezone.utc)]
)


def arguments(**fields: tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments: all valid (``fields[name][0]``), or each valid or hostile (``[1]``)."""
    valid = st.fixed_dictionaries({name: good for name, (good, _) in fields.items()})
    mixed = st.fixed_dictionaries({name: good | bad for name, (good, bad) in fields.items()})
    return valid | mixed


def key_strategy() -> st.SearchStrategy[Any]:
    return any_text | st.sampled_from(["k", "x" * 512, "x" * 513]) | wrong_types


valid_modes = st.one_of(
    st.builds(Idempotency, valid_text, scope=valid_text, ttl=valid_duration),
    st.builds(Unique, valid_text, scope=valid_text),
    st.builds(Debounce, valid_text, window=valid_duration, scope=valid_text),
    st.builds(Throttle, valid_text, window=valid_duration, scope=valid_text),
)
keyed_modes = st.one_of(
    st.builds(Idempotency, key_strategy(), scope=names, ttl=durations),
    st.builds(Unique, key_strategy(), scope=names),
    st.builds(Debounce, key_strategy(), window=durations, scope=names),
    st.builds(Throttle, key_strategy(), window=durations, scope=names),
)
LIVES_THROUGH_THE_EXAMPLE = timedelta(minutes=1)
MODE_NAMES = {Idempotency: "idempotency", Unique: "unique", Debounce: "debounce", Throttle: "throttle"}


valid_options = st.fixed_dictionaries(
    {},
    optional={
        "queue": valid_text,
        "priority": st.integers(0, 100),
        "run_at": valid_datetime,
        "tags": st.lists(valid_text, max_size=20, unique=True),
        "max_attempts": st.integers(1, 100),
        "deadline": valid_datetime,
        "timeout": valid_duration,
        "concurrency_key": valid_text,
    },
)


def options_strategy() -> st.SearchStrategy[dict[str, Any]]:
    optional = {
        "queue": names | wrong_types,
        "priority": numbers | wrong_types,
        "run_at": datetimes | wrong_types,
        "delay": durations,
        "tags": st.lists(names, max_size=22) | wrong_types | any_text,
        "max_attempts": numbers,
        "deadline": datetimes,
        "timeout": durations,
        "concurrency_key": names | wrong_types,
        "concurrency_limit": numbers,
    }
    return st.fixed_dictionaries({}, optional=optional)


# -- reading back ----------------------------------------------------------------------------------


def utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(timezone.utc)


@task(name="tests.property_echo", idempotent=True)
def echo(value: Any, *, label: Any = "x") -> None:
    """A task for the properties: its payload is its bound arguments."""


# -- properties ------------------------------------------------------------------------------------


@given(
    args=arguments(job_type=(valid_text, names | wrong_types), payload=(valid_json, json_values)),
    options=valid_options | options_strategy(),
)
def test_enqueue_refuses_cleanly_or_stores_faithfully(args, options):
    job_type, payload = args["job_type"], args["payload"]
    with example_savepoint():
        outcome = assert_refused_cleanly(
            EnqueueValidationError, lambda: django_workhorse.enqueue_with_result(job_type, payload, **options)
        )
        if isinstance(outcome, Exception):
            return
        job = Job.objects.get(pk=outcome.job_id)
        assert job.job_type == job_type
        assert read_back(job.payload) == as_stored(payload)
        assert job.queue == options.get("queue", "default")
        assert job.tags == sorted(options.get("tags", ()))
        assert job.priority == options.get("priority", 0)
        assert job.concurrency_key == options.get("concurrency_key")
        if options.get("run_at") is not None:  # None means omitted: now
            assert job.run_at == utc(options["run_at"])
        assert job.deadline == utc(options.get("deadline"))
        assert job.timeout == options.get("timeout")


@given(args=arguments(mode=(valid_modes, keyed_modes), payload=(valid_json, json_values)))
def test_keyed_enqueue_refuses_cleanly_or_replays(args):
    mode, payload = args["mode"], args["payload"]
    option = {MODE_NAMES[type(mode)]: mode}
    with example_savepoint():
        first = assert_refused_cleanly(
            EnqueueValidationError, lambda: django_workhorse.enqueue_with_result("tests.noop", payload, **option)
        )
        if isinstance(first, Exception):
            return
        lifetime = getattr(mode, "ttl", None) or getattr(mode, "window", None)  # None: unique lives with its job
        if lifetime is not None and lifetime < LIVES_THROUGH_THE_EXAMPLE:
            return  # the key may expire before the repeat: nothing to compare
        before = count_rows()
        again = django_workhorse.enqueue_with_result("tests.noop", payload, **option)
        assert again.job_id == first.job_id
        if not isinstance(mode, Debounce):  # a debounce repeat replaces the pending job in place
            assert count_rows() == before
        assert read_back(Job.objects.get(pk=first.job_id).payload) == as_stored(payload)


@given(
    st.lists(st.tuples(valid_text, valid_json), max_size=4).map(tuple)
    | st.lists(st.tuples(names, json_values), max_size=4).map(tuple)
    | wrong_types
    | any_text
)
def test_enqueue_many_refuses_cleanly_or_stores_in_order(entries):
    def batch() -> Any:
        if isinstance(entries, tuple):  # a batch, given as a generator
            return (EnqueueRequest(job_type, payload) for job_type, payload in entries)
        return entries

    with example_savepoint():
        results = assert_refused_cleanly(EnqueueValidationError, lambda: django_workhorse.enqueue_many(batch()))
        if isinstance(results, Exception):
            return
        stored = [Job.objects.get(pk=result.job_id) for result in results]
        assert [(job.job_type, read_back(job.payload)) for job in stored] == [(t, as_stored(p)) for t, p in entries]
        assert isinstance(entries, tuple) or entries == []


@given(
    args=arguments(
        key=(valid_text, key_strategy()),
        scope=(valid_text, names | wrong_types),
        retention=(valid_duration, durations),
        result=(valid_json, json_values),
    )
)
def test_once_refuses_cleanly_or_stores_the_result(args):
    key, scope, retention, result = args["key"], args["scope"], args["retention"], args["result"]
    with example_savepoint():
        outcome = assert_refused_cleanly(
            EffectValidationError, lambda: once(key, lambda: result, scope=scope, retention=retention)
        )
        if isinstance(outcome, EffectValidationError):
            return
        assert read_back(outcome) == as_stored(result)
        if retention < LIVES_THROUGH_THE_EXAMPLE:
            return  # the entry may expire before the repeat
        assert read_back(once(key, lambda: "not run again", scope=scope, retention=retention)) == as_stored(result)


ids = (
    st.lists(st.integers(min_value=-1, max_value=MAX_ID + 1) | wrong_types | any_text, max_size=3)
    | st.tuples(st.integers())
    | st.frozensets(st.integers(min_value=-(2**64), max_value=2**64), max_size=3)
    | any_text
    | wrong_types
    | numbers
)


@given(
    args=arguments(
        job_ids=(st.lists(st.integers(1, MAX_ID), max_size=3), ids),
        requested_by=(valid_text, any_text | wrong_types),
        queue=(valid_text, names | wrong_types),
    )
)
def test_operator_actions_refuse_cleanly_or_act_on_ints(args):
    job_ids, requested_by, queue = args["job_ids"], args["requested_by"], args["queue"]
    with example_savepoint():
        for action in (
            lambda: run_now(job_ids, requested_by=requested_by),
            lambda: release_bindings(job_ids, requested_by=requested_by),
            lambda: purge(job_ids=job_ids),
            lambda: purge(queue=queue),
        ):
            outcome = assert_refused_cleanly(InvalidArgumentError, action)
            if not isinstance(outcome, Exception):
                assert isinstance(outcome, (list, int))


@given(
    args=arguments(
        job_id=(st.integers(1, MAX_ID), numbers | wrong_types | any_text),
        request_id=(valid_text, names | wrong_types),
        reason=(valid_text | st.just(""), any_text | wrong_types),
    )
)
def test_cancel_and_redrive_refuse_cleanly_or_look_the_job_up(args):
    job_id, request_id, reason = args["job_id"], args["request_id"], args["reason"]
    with example_savepoint():
        for action in (lambda: cancel(job_id), lambda: redrive(job_id, request_id=request_id, reason=reason)):
            try:
                assert_refused_cleanly(InvalidArgumentError, action)
            except JobDoesNotExist:  # a well-formed id of a job that does not exist
                assert isinstance(job_id, int) and 1 <= job_id <= MAX_ID


@given(
    args=arguments(
        value=(valid_json, json_values),
        label=(valid_text, any_text | wrong_types | numbers),
        key=(valid_text, key_strategy()),
    )
)
def test_task_calls_refuse_cleanly_or_store_the_bound_arguments(args):
    value, label, key = args["value"], args["label"], args["key"]
    with example_savepoint():
        for call in (
            lambda: echo.enqueue_with_result(value, label=label),
            lambda: echo.apply_async(args=(value,), kwargs={"label": label}, unique_key=key),
        ):
            outcome = assert_refused_cleanly(EnqueueValidationError, call)
            if isinstance(outcome, Exception):
                continue
            job_id = outcome if isinstance(outcome, int) else outcome.job_id
            assert read_back(Job.objects.get(pk=job_id).payload) == as_stored({"value": value, "label": label})
