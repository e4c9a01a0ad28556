"""System checks of declared schedules (workhorse.E203-E208): each names the schedule, each at its edge."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from django_workhorse import Schedule, register, task
from django_workhorse.checks import check_schedules
from django_workhorse.schedules import sources

TASK = "tests.schedule_checks.tick"


@register(TASK)
def tick(payload: Any) -> Any:
    return payload


def errors(schedules: Any) -> list[tuple[str, str]]:
    with override_settings(WORKHORSE_SCHEDULES=schedules):
        return [(message.id, message.msg) for message in check_schedules()]


def ids(schedules: Any) -> list[str]:
    return [check_id for check_id, _ in errors(schedules)]


def test_valid_schedules_pass():
    assert errors({"a": {"task": TASK, "cron": "*/5 * * * *"}, "b": {"task": TASK, "every": timedelta(days=1)}}) == []


@pytest.mark.parametrize("cron", ["* * * * *", "0 0 * * *", "*/15 * * * * *", "0 3 * * 1-5", "0 0 L * *"], ids=repr)
def test_cron_expressions_cronsim_reads_pass(cron):
    assert errors({"s": {"task": TASK, "cron": cron}}) == []


@pytest.mark.parametrize(
    "cron", ["* * * *", "61 * * * *", "* * * * * * *", "not cron", "", "0 25 * * *", "@daily"], ids=repr
)
def test_an_invalid_cron_expression_is_e203_naming_the_schedule(cron):
    [(check_id, message)] = errors({"nightly": {"task": TASK, "cron": cron}})
    assert check_id == "workhorse.E203"
    assert "'nightly'" in message and "WORKHORSE_SCHEDULES" in message and "cron" in message


@pytest.mark.parametrize("zone", ["Europe/Pariss", "Mars/Olympus", "", "../etc/passwd", "UTC\x00"], ids=repr)
def test_an_unknown_time_zone_is_e204(zone):
    [(check_id, message)] = errors({"z": {"task": TASK, "cron": "0 3 * * *", "timezone": zone}})
    assert check_id == "workhorse.E204" and "'z'" in message and "timezone" in message


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "America/New_York", "Asia/Kathmandu"])
def test_known_time_zones_pass(zone):
    assert errors({"z": {"task": TASK, "cron": "0 3 * * *", "timezone": zone}}) == []


@pytest.mark.parametrize("name", ["shop.nope", "tests.schedule_checks.tick2", "os.path.join", ""], ids=repr)
def test_an_unknown_task_is_e205(name):
    check = ids({"u": {"task": name, "every": timedelta(minutes=1)}})
    assert check == (["workhorse.E207"] if name == "" else ["workhorse.E205"])


def test_a_name_declared_twice_is_e206_and_neither_runs(task_schedules):
    @task(name="tests.schedule_checks.dup", schedule=Schedule(every=timedelta(minutes=1), name="twice"))
    def dup() -> None: ...

    [(check_id, message)] = errors({"twice": {"task": TASK, "every": timedelta(minutes=2)}})
    assert check_id == "workhorse.E206" and "'twice'" in message and "2 times" in message
    with override_settings(WORKHORSE_SCHEDULES={"twice": {"task": TASK, "every": timedelta(minutes=2)}}):
        declared, _ = sources.declared_schedules()
    assert "twice" not in {d.name for d in declared}


@pytest.mark.parametrize(
    ("field", "good", "bad"),
    [
        ("every", timedelta(seconds=1), timedelta(seconds=1) - timedelta(microseconds=1)),
        ("every", timedelta(days=365), timedelta(days=365, microseconds=1)),
        ("priority", 100, 101),
        ("priority", 0, -1),
        ("queue", "q" * 100, "q" * 101),
        ("catch_up", "skip", "none"),
        ("overlap", "skip", "queue"),
        ("args", [], "x"),
        ("kwargs", {"n": 1}, {1: 1}),
    ],
)
def test_other_values_at_their_edge_and_one_past_it_are_e207(field, good, bad):
    base = {"task": TASK, "every": timedelta(minutes=1)}
    assert errors({"s": {**base, field: good}}) == []
    [(check_id, message)] = errors({"s": {**base, field: bad}})
    assert check_id == "workhorse.E207" and "'s'" in message and field in message


def test_a_name_at_its_bound_passes_and_one_past_it_is_e207():
    assert errors({"n" * 200: {"task": TASK, "every": timedelta(minutes=1)}}) == []
    assert ids({"n" * 201: {"task": TASK, "every": timedelta(minutes=1)}}) == ["workhorse.E207"]
    assert ids({"é" * 200: {"task": TASK, "every": timedelta(minutes=1)}}) == []  # 400 bytes
    assert ids({"é" * 199 + "ab": {"task": TASK, "every": timedelta(minutes=1)}}) == ["workhorse.E207"]  # 401 bytes


@pytest.mark.parametrize(
    "entry",
    [
        "0 3 * * *",
        {"task": TASK},
        {"task": TASK, "cron": "* * * * *", "every": timedelta(minutes=1)},
        {"task": TASK, "every": 60},
        {"task": TASK, "cron": "* * * * *", "when": "now"},
        {"cron": "* * * * *"},
    ],
    ids=repr,
)
def test_malformed_entries_are_e207(entry):
    assert ids({"s": entry}) == ["workhorse.E207"]


def test_a_setting_that_is_not_a_dict_is_e207():
    assert ids(["s"]) == ["workhorse.E207"]


def test_arguments_that_do_not_fit_the_task_are_e208(task_schedules):
    @task(name="tests.schedule_checks.typed", schedule=Schedule(every=timedelta(minutes=1), kwargs={"nope": 1}))
    def typed(region: str = "eu") -> str:
        return region

    [(check_id, message)] = errors({})
    assert check_id == "workhorse.E208" and "'tests.schedule_checks.typed'" in message and "nope" in message


def test_arguments_that_are_not_storable_are_e208():
    assert ids({"s": {"task": TASK, "every": timedelta(minutes=1), "kwargs": {"t": "\x00"}}}) == ["workhorse.E208"]
    assert ids({"s": {"task": TASK, "every": timedelta(minutes=1), "kwargs": {"t": object()}}}) == ["workhorse.E208"]


def test_the_checks_run_with_manage_py_check():
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    bad = {"s": {"task": TASK, "cron": "61 * * * *"}}
    with override_settings(WORKHORSE_SCHEDULES=bad), pytest.raises(SystemCheckError, match="workhorse.E203"):
        call_command("check")


@pytest.mark.django_db
@pytest.mark.parametrize("command", ["workhorse_worker", "workhorse_scheduler"])
def test_a_worker_or_scheduler_leaves_an_invalid_schedule_out_but_stops_at_other_errors(command, caplog):
    """The commands run the system checks first (as manage.py does), but one bad schedule does not
    stop every queue: it is left out and logged (tests/test_schedule_problems_runtime.py runs them)."""
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    argv = ["--burst" if command == "workhorse_worker" else "--once"]
    bad = {"s": {"task": "shop.nope", "every": timedelta(minutes=1)}}
    stopped = pytest.raises(SystemCheckError, match="workhorse.E002")
    with override_settings(WORKHORSE_SCHEDULES=bad, WORKHORSE_MAX_PAYLOAD_BYTES=0), stopped as excinfo:
        call_command(command, *argv, skip_checks=False)
    assert "workhorse.E205" not in str(excinfo.value)
    with override_settings(WORKHORSE_SCHEDULES=bad), caplog.at_level("ERROR", "django_workhorse"):
        call_command(command, *argv, skip_checks=False, verbosity=0)
    assert "Schedule left out name=s check=workhorse.E205 origin=WORKHORSE_SCHEDULES['s']: task 'shop.nope'" in (
        caplog.text
    )
