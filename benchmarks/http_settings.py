"""Django settings of ``benchmarks/http_idempotency.py``'s server (gunicorn) and of the script itself.

The database is DATABASE_URL, or the embedded PostgreSQL (database ``workhorse_bench``).
``HTTP_BENCH_PREPARED_STATEMENTS=0`` turns prepared statements off (behind PgBouncer).
``HTTP_BENCH_STACK=project`` adds what ``startproject`` gives a project: its middleware, sessions
and messages; unset, the views run with no middleware at all.
"""

from __future__ import annotations

import os
from pathlib import Path

import environ

from example_project.devdb import database_settings

ROOT = Path(__file__).resolve().parent.parent
SECRET_KEY = "http-bench-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": {**environ.Env.db_url_config(os.environ["DATABASE_URL"]), "CONN_MAX_AGE": None}}
else:
    DATABASES = {"default": {**database_settings(ROOT, name="workhorse_bench"), "CONN_MAX_AGE": None}}
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_workhorse"]
MIDDLEWARE: list[str] = []
if os.environ.get("HTTP_BENCH_STACK") == "project":
    INSTALLED_APPS += ["django.contrib.sessions", "django.contrib.messages"]
    MIDDLEWARE = [  # as django-admin startproject writes it
        "django.middleware.security.SecurityMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    ]
ROOT_URLCONF = "benchmarks.http_views"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Off behind a pooler that keeps no prepared statements (http_idempotency.py --pgbouncer).
WORKHORSE_PREPARED_STATEMENTS = os.environ.get("HTTP_BENCH_PREPARED_STATEMENTS", "1") == "1"
LOGGING_CONFIG = None
