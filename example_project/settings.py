"""Settings of the demo project (``make run``); every value can come from the environment."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import environ

from example_project.devdb import database_settings

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-workhorse-demo-only")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_workhorse",
    "example_project.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": database_settings(BASE_DIR)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

# Periodic jobs: every worker evaluates them, and each tick is one job (see docs/schedules.md).
WORKHORSE_SCHEDULES = {
    "shop.reindex-stale-products": {
        "task": "shop.reindex_stale_products",
        "every": timedelta(minutes=5),
        "overlap": "skip",
    },
    "shop.nightly-digest": {
        "task": "shop.send_digest",
        "cron": "0 3 * * *",
        "timezone": "Europe/Paris",
        "kwargs": {"user": "ops@example.com"},
    },
}

# The worker's console shows what the shop's jobs do (charges, reindexes, digests).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "{asctime} {levelname} {name}: {message}", "style": "{"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "example_project": {"handlers": ["console"], "level": "INFO"},
        # The level follows workhorse_worker's --verbosity (INFO by default).
        "django_workhorse": {"handlers": ["console"]},
    },
}
