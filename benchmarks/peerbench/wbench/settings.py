"""Django settings for the django-workhorse peer adapter; the harness sets PEERBENCH_DSN."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from adapter_base import django_db_settings  # noqa: E402

SECRET_KEY = "peerbench-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_workhorse"]
DATABASES = {"default": {**django_db_settings(os.environ["PEERBENCH_DSN"]), "CONN_MAX_AGE": None}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
