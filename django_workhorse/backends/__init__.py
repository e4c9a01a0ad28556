"""A backend for Django's tasks framework: ``@django.tasks.task`` functions run as workhorse jobs.

Configure it with ``TASKS = {"default": {"BACKEND": "django_workhorse.backends.WorkhorseBackend"}}``
(Django 6.0+, or Django 5.2 with the ``django-tasks`` backport). See docs/django-tasks.md.
"""

from __future__ import annotations

from django_workhorse.backends.backend import TaskRunner, WorkhorseBackend, WorkhorseTaskResult, resolve_handler
from django_workhorse.backends.task import WorkhorseTask

__all__ = ["TaskRunner", "WorkhorseBackend", "WorkhorseTask", "WorkhorseTaskResult", "resolve_handler"]
