"""Settings for the test suite: the embedded PostgreSQL unless DATABASE_URL is set."""

from __future__ import annotations

import os
from pathlib import Path

from example_project.devdb import database_settings
from tests.pgbouncer import pooled_databases

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "tests-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
DATABASES = {"default": {**database_settings(BASE_DIR, name="workhorse_tests"), "CONN_MAX_AGE": 0}}
# A second alias on its own test database, named after the first so parallel runs do not collide.
DATABASES["other"] = {**DATABASES["default"], "TEST": {"NAME": f"test_{DATABASES['default']['NAME']}_other"}}
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_workhorse",
    # The example shop, for tests/test_example_shop.py (its tables and job handlers; its URLs are
    # only used by that module, through @pytest.mark.urls).
    "example_project.shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"
# PgBouncer in transaction mode in front of the test database (tests/pgbouncer.py): the "pgbouncer"
# fixture starts it and fills in the address, and a worker subprocess reads it from the environment.
DATABASES.update(pooled_databases(DATABASES["default"]))
# A worker subprocess behind a PgBouncer that keeps no prepared statements is started with "0".
# The test modules that declare django.tasks tasks: a worker claims such a task's jobs only under an
# installed app or one of these (it advertises them as module prefixes).
WORKHORSE_TASK_MODULES = ["tests.test_django_tasks_backend", "tests.test_outcomes_integrations"]
WORKHORSE_PREPARED_STATEMENTS = os.environ.get("WORKHORSE_TEST_PREPARED_STATEMENTS", "1") == "1"
