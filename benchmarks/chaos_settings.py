"""Django settings of the chaos run: its worker subprocesses and ``benchmarks/chaos.py`` itself.

``DATABASE_URL`` is required (``benchmarks/chaos.py`` sets it to the embedded server it started,
or passes on the one it was given). ``CHAOS_MAX_RESULT_BYTES`` sets ``WORKHORSE_MAX_RESULT_BYTES``
(4096 by default), small so that the oversized-result poison class trips it.
"""

from __future__ import annotations

import os

import environ
from django.core.exceptions import ImproperlyConfigured

if not os.environ.get("DATABASE_URL"):
    raise ImproperlyConfigured("benchmarks.chaos_settings needs DATABASE_URL (benchmarks/chaos.py sets it)")

SECRET_KEY = "chaos-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DATABASES = {"default": {**environ.Env.db_url_config(os.environ["DATABASE_URL"]), "CONN_MAX_AGE": None}}
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_workhorse",
    "benchmarks.chaos_tasks",
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
WORKHORSE_MAX_RESULT_BYTES = int(os.environ.get("CHAOS_MAX_RESULT_BYTES", "4096"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s pid=%(process)d %(threadName)s %(levelname)s %(name)s %(message)s"}
    },
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"django_workhorse": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}},
}
