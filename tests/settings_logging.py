"""tests.settings plus a LOGGING that has its own handler for django_workhorse (for a worker process
whose project configures logging: the command must add nothing)."""

from __future__ import annotations

from tests.settings import *  # noqa: F403

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"configured": {"format": "configured: %(levelname)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "configured"}},
    "loggers": {"django_workhorse": {"handlers": ["console"], "level": "INFO"}},
}
