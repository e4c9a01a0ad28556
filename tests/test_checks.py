"""System checks: PostgreSQL only (workhorse.E001), settings within their bounds (E002-E010), each at its edge."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import pytest
from django.core.checks import Error, Tags, registry, run_checks
from django.core.management import call_command
from django.db import connections
from django.db.utils import ConnectionHandler
from django.test import override_settings

from django_workhorse.checks import check_database, check_settings
from django_workhorse.conf import WorkhorseSettings

MiB = 1024 * 1024


def check_ids(messages: list) -> list[str]:
    return [message.id for message in messages]


@pytest.fixture
def sqlite_alias() -> Iterator[str]:
    """Make ``connections["sqlite"]`` a SQLite wrapper for this thread, without touching DATABASES.

    A private ConnectionHandler (which insists on a "default" alias) builds the wrapper with
    Django's own defaults; assigning it to the global handler only fills a thread-local slot, so
    nothing else sees it and deleting it restores the handler exactly. Overriding DATABASES would
    warn (an error under filterwarnings) and leave cached connections behind; editing
    ``connections.settings`` would leak the alias into other tests. The wrapper never connects.
    """
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    wrapper = ConnectionHandler({"default": sqlite, "sqlite": sqlite})["sqlite"]
    connections["sqlite"] = wrapper
    try:
        yield "sqlite"
    finally:
        del connections["sqlite"]
        wrapper.close()


def test_check_settings_passes_with_defaults():
    assert check_settings() == []


@pytest.mark.parametrize("size", [1, 16 * MiB], ids=["1-byte", "16-MiB"])
def test_check_settings_accepts_payload_limit_at_edge(size):
    with override_settings(WORKHORSE_MAX_PAYLOAD_BYTES=size):
        assert check_settings() == []


@pytest.mark.parametrize("size", [0, 16 * MiB + 1, "1048576", True, 1048576.0, None], ids=repr)
def test_check_settings_rejects_bad_payload_limit(size):
    with override_settings(WORKHORSE_MAX_PAYLOAD_BYTES=size):
        assert check_settings() == [
            Error(
                f"WORKHORSE_MAX_PAYLOAD_BYTES must be an integer in 1..{16 * MiB}, got {size!r}.", id="workhorse.E002"
            )
        ]


CHANNELS = [("NOTIFY_CHANNEL", "workhorse.E003"), ("RESULT_CHANNEL", "workhorse.E012")]


@pytest.mark.parametrize(("name", "check_id"), CHANNELS)
@pytest.mark.parametrize("channel", ["w", "c" * 63, "é" * 31 + "a"], ids=["1-byte", "63-bytes", "63-bytes-multibyte"])
def test_check_settings_accepts_a_channel_at_edge(channel, name, check_id):
    with override_settings(**{f"WORKHORSE_{name}": channel}):
        assert check_settings() == []


@pytest.mark.parametrize(("name", "check_id"), CHANNELS)
@pytest.mark.parametrize(
    "channel", ["", "c" * 64, "é" * 32, 123, None], ids=["empty", "64-bytes", "64-bytes-multibyte", "int", "none"]
)
def test_check_settings_rejects_a_bad_channel(channel, name, check_id):
    with override_settings(**{f"WORKHORSE_{name}": channel}):
        assert check_settings() == [
            Error(f"WORKHORSE_{name} must be a string of 1..63 bytes, got {channel!r}.", id=check_id)
        ]


def test_check_settings_reports_each_bad_setting():
    with override_settings(WORKHORSE_MAX_PAYLOAD_BYTES=0, WORKHORSE_NOTIFY_CHANNEL=""):
        assert check_ids(check_settings()) == ["workhorse.E002", "workhorse.E003"]


def test_check_database_passes_for_postgresql_alias():
    assert check_database(databases=["default"]) == []


def test_check_database_rejects_non_postgresql_alias(sqlite_alias):
    assert check_database(databases=["default", sqlite_alias]) == [
        Error(
            "django-workhorse needs PostgreSQL; database 'sqlite' is sqlite.",
            hint="Use the django.db.backends.postgresql engine (PostgreSQL 14+, 15+ with Django 6.1; psycopg 3).",
            id="workhorse.E001",
        )
    ]


def test_check_database_runs_only_when_databases_are_checked(sqlite_alias):
    assert Tags.database in check_database.tags
    assert "workhorse.E001" not in check_ids(run_checks())
    assert check_ids(run_checks(tags=[Tags.database], databases=[sqlite_alias])) == ["workhorse.E001"]


def test_checks_are_registered():
    assert {check_settings, check_database} <= set(registry.registry.get_checks())


def test_manage_py_check_passes_with_test_settings():
    out = StringIO()
    call_command("check", stdout=out)
    assert out.getvalue() == "System check identified no issues (0 silenced).\n"


@pytest.mark.django_db
def test_manage_py_check_passes_for_default_database():
    out = StringIO()
    call_command("check", databases=["default"], stdout=out)
    assert out.getvalue() == "System check identified no issues (0 silenced).\n"


@pytest.mark.parametrize(
    ("setting", "check_id"),
    [
        ("WORKHORSE_JOB_RETENTION", "workhorse.E004"),
        ("WORKHORSE_MAINTENANCE_INTERVAL", "workhorse.E005"),
        ("WORKHORSE_WORKER_STALE_AFTER", "workhorse.E006"),
        ("WORKHORSE_RESULT_RETENTION", "workhorse.E011"),
    ],
)
@pytest.mark.parametrize(
    "value", [timedelta(0), timedelta(seconds=-1), 60, None], ids=["zero", "negative", "int", "none"]
)
def test_check_settings_rejects_non_positive_durations(setting, check_id, value):
    with override_settings(**{setting: value}):
        assert check_ids(check_settings()) == [check_id]


@pytest.mark.parametrize(
    "setting",
    [
        "WORKHORSE_JOB_RETENTION",
        "WORKHORSE_MAINTENANCE_INTERVAL",
        "WORKHORSE_WORKER_STALE_AFTER",
        "WORKHORSE_RESULT_RETENTION",
    ],
)
def test_check_settings_accepts_the_smallest_positive_duration(setting):
    with override_settings(**{setting: timedelta(microseconds=1)}):
        assert check_settings() == []


@pytest.mark.parametrize("value", [None, "none", "default", "other"], ids=repr)
def test_check_settings_accepts_no_result_listener_or_an_alias_of_databases(value):
    with override_settings(WORKHORSE_RESULT_LISTEN_DATABASE=value):
        assert check_settings() == []


@pytest.mark.parametrize("value", ["nowhere", "None", "", 0, ["default"]], ids=repr)
def test_check_settings_rejects_a_result_listen_database_that_is_no_alias(value):
    with override_settings(WORKHORSE_RESULT_LISTEN_DATABASE=value):
        assert check_settings() == [
            Error(
                f"WORKHORSE_RESULT_LISTEN_DATABASE must be None, 'none' or an alias of DATABASES, got {value!r}.",
                id="workhorse.E013",
            )
        ]


@pytest.mark.parametrize("limit", [1, 1000], ids=["1", "1000"])
def test_check_settings_accepts_concurrency_limits_at_edge(limit):
    with override_settings(WORKHORSE_DEFAULT_CONCURRENCY_LIMIT=limit, WORKHORSE_CONCURRENCY_LIMITS={"k": limit}):
        assert check_settings() == []


@pytest.mark.parametrize("limit", [0, 1001, True, "2", None], ids=repr)
def test_check_settings_rejects_bad_default_concurrency_limit(limit):
    with override_settings(WORKHORSE_DEFAULT_CONCURRENCY_LIMIT=limit):
        assert check_settings() == [
            Error(
                f"WORKHORSE_DEFAULT_CONCURRENCY_LIMIT must be an integer in 1..1000, got {limit!r}.",
                id="workhorse.E007",
            )
        ]


@pytest.mark.parametrize("limits", [{"k": 0}, {"k": 1001}, {1: 2}, [("k", 2)], None], ids=repr)
def test_check_settings_rejects_bad_concurrency_limits(limits):
    with override_settings(WORKHORSE_CONCURRENCY_LIMITS=limits):
        assert check_settings() == [
            Error("WORKHORSE_CONCURRENCY_LIMITS must map concurrency keys to integers in 1..1000.", id="workhorse.E008")
        ]


@pytest.mark.parametrize("size", [1024, 16 * MiB], ids=["1-KiB", "16-MiB"])
def test_check_settings_accepts_result_limit_at_edge(size):
    with override_settings(WORKHORSE_MAX_RESULT_BYTES=size):
        assert check_settings() == []


@pytest.mark.parametrize("size", [1023, 16 * MiB + 1, "1048576", True, 1048576.0, None], ids=repr)
def test_check_settings_rejects_bad_result_limit(size):
    with override_settings(WORKHORSE_MAX_RESULT_BYTES=size):
        assert check_settings() == [
            Error(
                f"WORKHORSE_MAX_RESULT_BYTES must be an integer in 1024..{16 * MiB}, got {size!r}.",
                id="workhorse.E009",
            )
        ]


@pytest.mark.parametrize("size", [1024, 16 * MiB], ids=["1-KiB", "16-MiB"])
def test_check_settings_accepts_idempotent_response_limit_at_edge(size):
    with override_settings(WORKHORSE_IDEMPOTENT_RESPONSE_MAX_BYTES=size):
        assert check_settings() == []


@pytest.mark.parametrize("size", [1023, 16 * MiB + 1, "1048576", True, None], ids=repr)
def test_check_settings_rejects_bad_idempotent_response_limit(size):
    with override_settings(WORKHORSE_IDEMPOTENT_RESPONSE_MAX_BYTES=size):
        assert check_settings() == [
            Error(
                f"WORKHORSE_IDEMPOTENT_RESPONSE_MAX_BYTES must be an integer in 1024..{16 * MiB}, got {size!r}.",
                id="workhorse.E209",
            )
        ]


@pytest.mark.parametrize("prepared", [True, False])
def test_check_settings_accepts_prepared_statements_flag(prepared):
    with override_settings(WORKHORSE_PREPARED_STATEMENTS=prepared):
        assert check_settings() == []


@pytest.mark.parametrize("prepared", [1, 0, "False", None], ids=repr)
def test_check_settings_rejects_a_prepared_statements_value_that_is_not_a_bool(prepared):
    with override_settings(WORKHORSE_PREPARED_STATEMENTS=prepared):
        assert check_settings() == [
            Error(f"WORKHORSE_PREPARED_STATEMENTS must be True or False, got {prepared!r}.", id="workhorse.E010")
        ]


@pytest.mark.parametrize(
    ("name", "bad", "check_id"),
    [
        ("MAX_PAYLOAD_BYTES", 0, "workhorse.E002"),
        ("NOTIFY_CHANNEL", "", "workhorse.E003"),
        ("RESULT_CHANNEL", "", "workhorse.E012"),
        ("JOB_RETENTION", timedelta(0), "workhorse.E004"),
        ("MAINTENANCE_INTERVAL", timedelta(0), "workhorse.E005"),
        ("WORKER_STALE_AFTER", timedelta(0), "workhorse.E006"),
        ("RESULT_RETENTION", timedelta(0), "workhorse.E011"),
        ("RESULT_LISTEN_DATABASE", "nowhere", "workhorse.E013"),
        ("DEFAULT_CONCURRENCY_LIMIT", 0, "workhorse.E007"),
        ("CONCURRENCY_LIMITS", {"k": 0}, "workhorse.E008"),
        ("MAX_RESULT_BYTES", 0, "workhorse.E009"),
        ("PREPARED_STATEMENTS", "yes", "workhorse.E010"),
        ("SCHEDULE_MAX_CATCH_UP", 0, "workhorse.E201"),
        ("SCHEDULE_INTERVAL", timedelta(0), "workhorse.E202"),
        ("IDEMPOTENT_RESPONSE_MAX_BYTES", 0, "workhorse.E209"),
        ("MAX_SNOOZES", 0, "workhorse.E401"),
        ("QUEUES", {"q": {"fair": 1}}, "workhorse.E410"),
        ("WORKFLOW_MAX_STEPS", 0, "workhorse.E501"),
    ],
)
def test_checks_read_each_setting_through_app_settings(monkeypatch, name, bad, check_id):
    """A default (or any value) that app_settings hands out is what the check judges."""
    monkeypatch.setattr(WorkhorseSettings, name, property(lambda self: bad))
    assert check_ids(check_settings()) == [check_id]


@pytest.mark.parametrize("limit", [1, 10_000], ids=["1", "10000"])
def test_check_settings_accepts_schedule_max_catch_up_at_edge(limit):
    with override_settings(WORKHORSE_SCHEDULE_MAX_CATCH_UP=limit):
        assert check_settings() == []


@pytest.mark.parametrize("limit", [0, 10_001, True, "100", 100.0, None], ids=repr)
def test_check_settings_rejects_bad_schedule_max_catch_up(limit):
    with override_settings(WORKHORSE_SCHEDULE_MAX_CATCH_UP=limit):
        assert check_settings() == [
            Error(
                f"WORKHORSE_SCHEDULE_MAX_CATCH_UP must be an integer in 1..10000, got {limit!r}.", id="workhorse.E201"
            )
        ]


@pytest.mark.parametrize("interval", [timedelta(milliseconds=1), timedelta(days=1)], ids=["1-ms", "1-day"])
def test_check_settings_accepts_schedule_interval_at_edge(interval):
    with override_settings(WORKHORSE_SCHEDULE_INTERVAL=interval):
        assert check_settings() == []


@pytest.mark.parametrize(
    "interval",
    [timedelta(microseconds=999), timedelta(days=1, microseconds=1), timedelta(0), 1, None],
    ids=["999-us", "1-day-1-us", "zero", "int", "none"],
)
def test_check_settings_rejects_bad_schedule_interval(interval):
    with override_settings(WORKHORSE_SCHEDULE_INTERVAL=interval):
        assert check_settings() == [
            Error(
                f"WORKHORSE_SCHEDULE_INTERVAL must be a timedelta in 0:00:00.001000..1 day, 0:00:00, got {interval!r}.",
                id="workhorse.E202",
            )
        ]


def test_schedule_settings_defaults():
    settings = WorkhorseSettings()
    assert settings.SCHEDULE_MAX_CATCH_UP == 100
    assert settings.SCHEDULE_INTERVAL.total_seconds() == 1
