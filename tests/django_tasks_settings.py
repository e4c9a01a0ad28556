"""Settings of the worker processes that the django.tasks backend tests start: tests.settings plus TASKS.

A worker process cannot take the tests' ``override_settings(TASKS=...)``; it reads TASKS from here.
"""

from __future__ import annotations

from tests.settings import *  # noqa: F403

TASKS = {
    "default": {
        "BACKEND": "django_workhorse.backends.WorkhorseBackend",
        "QUEUES": ["default", "emails"],
    }
}

# The backend imports task modules of installed apps only: these tests' tasks live in a test module.
WORKHORSE_TASK_MODULES = ["tests.test_django_tasks_backend"]
