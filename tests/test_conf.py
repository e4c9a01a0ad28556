"""Settings: each WORKHORSE_* name read at access time, with its default; one constant per default."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import load_command_class
from django.test import override_settings
from django.test.signals import setting_changed

from django_workhorse import RateLimit, conf
from django_workhorse.conf import app_settings
from django_workhorse.models import Job
from django_workhorse.types import EnqueueOptions
from django_workhorse.worker import Worker

DEFAULTS = {
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    "MAX_RESULT_BYTES": 1024 * 1024,
    "MAX_SNOOZES": 100,
    "NOTIFY_CHANNEL": "workhorse",
    "RESULT_CHANNEL": "workhorse_result",
    "PREPARED_STATEMENTS": True,
    "JOB_RETENTION": timedelta(days=14),
    "RESULT_RETENTION": timedelta(hours=24),
    "MAINTENANCE_INTERVAL": timedelta(minutes=1),
    "WORKER_STALE_AFTER": timedelta(minutes=5),
    "CONCURRENCY_LIMITS": {},
    "DEFAULT_CONCURRENCY_LIMIT": 1,
    "EAGER": False,
    "EAGER_PROPAGATES": True,
    "SCHEDULES": {},
    "QUEUES": {},
    "RATE_LIMITS": {},
    "SCHEDULE_MAX_CATCH_UP": 100,
    "SCHEDULE_INTERVAL": timedelta(seconds=1),
    "IDEMPOTENT_RESPONSE_MAX_BYTES": 1024 * 1024,
    "WORKFLOW_MAX_STEPS": 1000,
    "METRICS_TOKEN": None,
    "METRICS_JOB_TYPE_LABEL": False,
    "TASK_MODULES": (),
    "ALLOW_FUTURE_NOW": False,
    "RESULT_LISTEN_DATABASE": None,
    "ENCRYPTION": None,
}
OVERRIDES = {
    "MAX_PAYLOAD_BYTES": 2048,
    "MAX_RESULT_BYTES": 4096,
    "MAX_SNOOZES": 7,
    "NOTIFY_CHANNEL": "elsewhere",
    "RESULT_CHANNEL": "results_elsewhere",
    "PREPARED_STATEMENTS": False,
    "JOB_RETENTION": timedelta(days=1),
    "RESULT_RETENTION": timedelta(hours=2),
    "MAINTENANCE_INTERVAL": timedelta(seconds=5),
    "WORKER_STALE_AFTER": timedelta(minutes=1),
    "CONCURRENCY_LIMITS": {"k": 3},
    "DEFAULT_CONCURRENCY_LIMIT": 2,
    "EAGER": True,
    "EAGER_PROPAGATES": False,
    "SCHEDULES": {"s": {"task": "t", "every": timedelta(minutes=5)}},
    "QUEUES": {"reports": {"fair": True}},
    "RATE_LIMITS": {"stripe": RateLimit(100)},
    "SCHEDULE_MAX_CATCH_UP": 5,
    "SCHEDULE_INTERVAL": timedelta(seconds=10),
    "IDEMPOTENT_RESPONSE_MAX_BYTES": 8192,
    "WORKFLOW_MAX_STEPS": 10,
    "METRICS_TOKEN": "s" * 16,
    "METRICS_JOB_TYPE_LABEL": True,
    "TASK_MODULES": ("myproject.tasks",),
    "ALLOW_FUTURE_NOW": True,
    "RESULT_LISTEN_DATABASE": "other",
    "ENCRYPTION": {"keys": {"2026-12": "A" * 43 + "="}, "active": "2026-12", "fingerprint_key": "B" * 43 + "="},
}


def test_every_setting_is_listed_here():
    names = {name for name, value in vars(conf.WorkhorseSettings).items() if isinstance(value, conf.Setting)}
    assert names == set(DEFAULTS) == set(OVERRIDES)


# What tests/settings.py configures (the django.tasks modules the test workers may claim from).
TEST_SETTINGS = {"TASK_MODULES": ("tests.test_django_tasks_backend", "tests.test_outcomes_integrations")}


@pytest.mark.parametrize("name", DEFAULTS)
def test_each_setting_has_its_default(name, settings):
    if hasattr(settings, f"WORKHORSE_{name}"):
        delattr(settings, f"WORKHORSE_{name}")
        # Deleting a setting sends no setting_changed (pytest-django): say it, as Django would.
        setting_changed.send(sender=type(settings), setting=f"WORKHORSE_{name}", value=None, enter=True)
    assert getattr(app_settings, name) == DEFAULTS[name]


@pytest.mark.parametrize("name", OVERRIDES)
def test_each_setting_is_read_at_access_time(name):
    with override_settings(**{f"WORKHORSE_{name}": OVERRIDES[name]}):
        assert getattr(app_settings, name) == OVERRIDES[name]
    assert getattr(app_settings, name) == TEST_SETTINGS.get(name, DEFAULTS[name])


def test_max_attempts_has_one_default_everywhere():
    assert EnqueueOptions().max_attempts == conf.DEFAULT_MAX_ATTEMPTS
    assert Job._meta.get_field("max_attempts").default == conf.DEFAULT_MAX_ATTEMPTS


def test_the_worker_and_its_command_share_the_lease_and_drain_defaults():
    worker = Worker()
    assert (worker.lease, worker.drain_timeout) == (conf.DEFAULT_LEASE, conf.DEFAULT_DRAIN_TIMEOUT)
    parser = load_command_class("django_workhorse", "workhorse_worker").create_parser("manage.py", "workhorse_worker")
    options = parser.parse_args([])
    assert timedelta(seconds=options.lease) == conf.DEFAULT_LEASE
    assert timedelta(seconds=options.drain_timeout) == conf.DEFAULT_DRAIN_TIMEOUT
