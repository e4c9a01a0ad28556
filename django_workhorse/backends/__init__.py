"""A backend for Django's tasks framework: ``@django.tasks.task`` functions run as workhorse jobs.

Configure it with ``TASKS = {"default": {"BACKEND": "django_workhorse.backends.WorkhorseBackend"}}``
(Django 6.0+, or Django 5.2 with the ``django-tasks`` backport). See docs/django-tasks.md.

``backend`` holds the enqueue side (``WorkhorseBackend``), ``request`` the job a call becomes,
``results`` how a job reads back as a ``TaskResult``, ``runner`` the worker's side, ``task`` the
``WorkhorseTask`` options and ``_framework`` the framework's names. Importing the package imports
the runner, which lets workers resolve django.tasks jobs by module path.
"""

from __future__ import annotations

from django_workhorse.backends.backend import WorkhorseBackend
from django_workhorse.backends.results import WorkhorseTaskResult
from django_workhorse.backends.runner import TaskRunner, resolve_handler
from django_workhorse.backends.task import WorkhorseTask

__all__ = ["TaskRunner", "WorkhorseBackend", "WorkhorseTask", "WorkhorseTaskResult", "resolve_handler"]
