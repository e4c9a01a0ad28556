"""Property tests of evaluation: however evaluations are spaced, repeated, overlapping or out of
order, the jobs are exactly the ticks a single evaluator with a perfect clock would have enqueued.

Each example runs against PostgreSQL in a savepoint rolled back afterwards, with the in-process
next-tick memory left as the previous examples left it (as in a long-running worker).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from django_workhorse import Schedule, enqueue_due_schedules, register
from django_workhorse.models import Job
from django_workhorse.schedules.definition import SKIP_GRACE, ticks
from tests.conftest import example_savepoint

# A property test's time depends on the examples drawn (how many evaluations, over how many ticks):
# 4 s to 70 s on one machine, so the suite's 120 s per test is too tight for it on a loaded one.
pytestmark = [pytest.mark.django_db, pytest.mark.timeout(900)]

TASK = "tests.schedule_properties.tick"
T0 = datetime(2026, 3, 6, tzinfo=timezone.utc)  # two days before New York's spring forward
SPAN = timedelta(days=3)


@register(TASK)
def tick(payload: Any) -> Any:
    return payload


definitions = st.one_of(
    st.builds(
        lambda seconds: {"every": timedelta(seconds=seconds)},
        st.sampled_from([1, 7, 60, 300, 3600, 86400]),
    ),
    st.builds(
        lambda cron, zone: {"cron": cron, "timezone": zone},
        st.sampled_from(["*/5 * * * *", "30 2 * * *", "0 * * * *", "15 1,13 * * *", "0 0 * * 1"]),
        st.sampled_from(["UTC", "Europe/Paris", "America/New_York"]),
    ),
)
instants = st.lists(st.integers(0, int(SPAN.total_seconds())), min_size=1, max_size=12)


def evaluate(definition: dict[str, Any], catch_up: str, offsets: list[int]) -> tuple[list[datetime], Schedule]:
    schedule = Schedule(**definition, catch_up=catch_up)  # type: ignore[arg-type]
    entry = {"task": TASK, **definition, "catch_up": catch_up}
    with override_settings(WORKHORSE_SCHEDULES={"p": entry}, WORKHORSE_SCHEDULE_MAX_CATCH_UP=10_000):
        for offset in offsets:
            enqueue_due_schedules(T0 + timedelta(seconds=offset))
    jobs = Job.objects.filter(job_type=TASK).order_by("scheduled_for")
    return list(jobs.values_list("scheduled_for", flat=True)), schedule


def model(schedule: Schedule, catch_up: str, offsets: list[int]) -> list[datetime]:
    """One evaluator with a perfect clock: the window (previous, now], never moving back."""
    previous = T0 + timedelta(seconds=offsets[0])
    expected: list[datetime] = []
    for offset in offsets[1:]:
        now = T0 + timedelta(seconds=offset)
        if now <= previous:
            continue
        due = ticks(schedule, previous, now, limit=10_000)
        if catch_up == "latest":
            due = due[-1:]
        elif catch_up == "skip":
            due = [t for t in due[-1:] if now - t <= SKIP_GRACE]
        expected.extend(due)
        previous = now
    return expected


@given(definitions, st.sampled_from(["all", "latest", "skip"]), instants)
def test_jobs_are_exactly_the_ticks_of_a_perfect_evaluator(definition, catch_up, offsets):
    with example_savepoint():
        jobs, schedule = evaluate(definition, catch_up, offsets)
        assert jobs == model(schedule, catch_up, offsets)


@given(definitions, instants, st.data())
def test_repeating_any_evaluation_changes_nothing(definition, offsets, data):
    repeated = offsets + data.draw(st.lists(st.sampled_from(offsets), max_size=6))
    with example_savepoint():
        once, schedule = evaluate(definition, "all", sorted(offsets))
    with example_savepoint():
        again, _ = evaluate(definition, "all", sorted(offsets) + repeated)
        assert again == once == model(schedule, "all", sorted(offsets))
