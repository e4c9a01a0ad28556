"""Property: whatever a handler returns or raises, its job ends retried or finished, with a readable
error if it failed, and the good job claimed in the same batch succeeds exactly once.

Each example runs a real burst worker (two threads, batches of two) in this process against
real PostgreSQL. Each example costs a worker run, so this test takes half the examples of the
Hypothesis profile in use (``tests/conftest.py``: ``ci`` by default, ``long`` by hand).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from django_workhorse import RetryPolicy, enqueue
from django_workhorse.models import Job, JobStatus
from django_workhorse.tasks.registry import register
from tests.values import nested
from tests.worker_tasks import CALLS, NotTextError, UnprintableError, run_worker

pytestmark = pytest.mark.django_db(transaction=True)

NEVER_SOON = RetryPolicy.fixed(timedelta(hours=1))
RESULT_BOUND = 1024
EXAMPLES = settings(max_examples=max(10, settings.default.max_examples // 2))

# What each example's handler does, by the token in its payload: ("return", value) or ("raise", exc).
BEHAVIOURS: dict[int, tuple[str, Any]] = {}
_tokens = itertools.count()


@register("tests.property")
def behave(ctx: Any, payload: dict[str, Any]) -> Any:
    CALLS.add((payload["token"], ctx.attempt))
    action, value = BEHAVIOURS.get(payload["token"], ("return", payload))
    if action == "raise":
        raise value
    return value


@pytest.fixture(autouse=True)
def _fresh_calls() -> Iterator[None]:
    CALLS.clear()
    BEHAVIOURS.clear()
    yield
    BEHAVIOURS.clear()
    CALLS.clear()


odd_text = st.lists(
    st.one_of(st.text(max_size=4), st.sampled_from(["\x00", "\udc80", "\ud83d", "\\u0000", "\\", '"', "\u2028"])),
    max_size=5,
).map("".join)


class OddStrError(Exception):
    """An exception whose ``__str__`` returns whatever text it was given (NUL, surrogates...)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def __str__(self) -> str:
        return self.text


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | odd_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(odd_text, children, max_size=3),
    max_leaves=12,
)
results = st.one_of(
    json_like,
    st.builds(object),
    st.sets(st.integers(), max_size=2),
    st.binary(max_size=4),
    st.complex_numbers(),
    st.integers(RESULT_BOUND - 8, RESULT_BOUND + 8).map(lambda n: "x" * n),  # around the size bound
    st.integers(95, 105).map(nested),  # around the depth bound
)
exceptions = st.one_of(
    st.builds(RuntimeError, odd_text),
    st.builds(ValueError, st.builds(object), odd_text),
    st.builds(OddStrError, odd_text),
    st.builds(UnprintableError, odd_text),
    st.builds(NotTextError),
    st.builds(SystemExit, odd_text),
    st.integers(4000, 6000).map(lambda n: RuntimeError("m" * n)),
)
behaviours = st.one_of(st.tuples(st.just("return"), results), st.tuples(st.just("raise"), exceptions))


@override_settings(WORKHORSE_MAX_RESULT_BYTES=RESULT_BOUND)
@EXAMPLES
@given(behaviour=behaviours, max_attempts=st.integers(1, 2))
def test_any_outcome_ends_its_job_and_spares_the_next_one(behaviour, max_attempts):
    token = next(_tokens)
    BEHAVIOURS[token] = behaviour
    tested = enqueue("tests.property", {"token": token}, priority=1, max_attempts=max_attempts, retry_policy=NEVER_SOON)
    good_token = next(_tokens)
    good = enqueue("tests.property", {"token": good_token})

    stats = run_worker(concurrency=2, batch=2, timeout=30)

    assert stats.failed_threads == [] and stats.claimed == 2
    job = Job.objects.get(pk=tested)
    assert job.lease_token is None
    if job.status == JobStatus.SUCCEEDED:
        assert behaviour[0] == "return" and job.last_error == ""
    else:
        expected = JobStatus.DEAD if max_attempts == 1 else JobStatus.QUEUED
        assert job.status == expected and job.result is None
        error = job.last_error
        assert error and "\x00" not in error and error.split(":", 1)[0].isidentifier(), error
    good_job = Job.objects.get(pk=good)
    assert (good_job.status, good_job.attempt) == (JobStatus.SUCCEEDED, 1)
    assert [call for call in CALLS.items() if call[0] == good_token] == [(good_token, 1)]
