"""Retry policies: exponential and fixed delays, the cap, jitter bounds and the stored form."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from django_workhorse.conf import MAX_ATTEMPTS
from django_workhorse.tasks.retry import DEFAULT_RETRY_POLICY, RetryPolicy

NO_JITTER = RetryPolicy(jitter=0.0)


@pytest.mark.parametrize(("attempt", "seconds"), [(0, 1), (1, 1), (2, 2), (3, 4), (10, 512), (12, 2048)])
def test_exponential_delay_doubles_from_the_base(attempt, seconds):
    policy = RetryPolicy(jitter=0.0, max_delay=timedelta(hours=2))
    assert policy.delay_for(attempt) == timedelta(seconds=seconds)


@pytest.mark.parametrize("attempt", [13, 50, MAX_ATTEMPTS])
def test_exponential_delay_is_capped_at_max_delay_up_to_the_last_attempt(attempt):
    assert NO_JITTER.delay_for(attempt) == timedelta(hours=1)


def test_fixed_policy_always_waits_its_delay():
    policy = RetryPolicy.fixed(timedelta(seconds=7))
    assert [policy.delay_for(n) for n in (1, 2, 50)] == [timedelta(seconds=7)] * 3


@pytest.mark.parametrize("draw", [0.0, 0.5, 0.999999])
def test_jitter_only_shortens_a_delay_by_up_to_its_fraction(draw):
    class Fixed(random.Random):
        def random(self) -> float:
            return draw

    policy = RetryPolicy(jitter=0.25, max_delay=timedelta(hours=2))
    delay = policy.delay_for(3, rng=Fixed())
    assert delay == timedelta(seconds=4) * (1 - draw * 0.25)
    assert timedelta(seconds=3) < delay <= timedelta(seconds=4)


def test_jitter_spreads_delays_within_bounds():
    rng = random.Random(7)
    delays = {DEFAULT_RETRY_POLICY.delay_for(2, rng=rng) for _ in range(200)}
    assert len(delays) > 100
    assert all(timedelta(seconds=1.8) <= delay <= timedelta(seconds=2) for delay in delays)


@pytest.mark.parametrize(
    "policy",
    [
        DEFAULT_RETRY_POLICY,
        RetryPolicy.fixed(timedelta(minutes=5), jitter=0.5),
        RetryPolicy(base=timedelta(milliseconds=250), factor=3, max_delay=timedelta(days=1), jitter=0),
    ],
    ids=["default", "fixed", "custom"],
)
def test_to_json_round_trips_and_is_json_ready(policy):
    stored = policy.to_json()
    assert RetryPolicy.from_json(stored) == policy
    assert RetryPolicy.from_json(stored).to_json() == stored
    assert {type(value) for value in stored.values()} <= {str, int, float}


def test_default_policy_is_stored_in_milliseconds():
    assert DEFAULT_RETRY_POLICY.to_json() == {
        "kind": "exponential",
        "base_ms": 1000,
        "factor": 2.0,
        "max_ms": 3_600_000,
        "jitter": 0.1,
    }
