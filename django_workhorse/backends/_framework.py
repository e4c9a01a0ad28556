"""The tasks framework this backend plugs into: ``django.tasks`` (Django 6.0+) or the ``django_tasks`` backport.

Everything the backend uses from the framework is imported here, once, under one set of names. The
backport spells two exceptions differently (``InvalidTaskError``, ``InvalidTaskBackendError``); they
are exported as Django's ``InvalidTask`` and ``InvalidTaskBackend``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

BACKPORT_HINT = (
    "django_workhorse.backends needs Django's tasks framework: Django 6.0 or later has it built in "
    "(django.tasks); on Django 5.2 install the backport with `pip install 'django-tasks>=0.12'` "
    "and add 'django_tasks' to INSTALLED_APPS."
)

if TYPE_CHECKING:
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
else:
    try:
        from django.tasks import task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json

        FRAMEWORK = "django.tasks"
    except ImportError:
        try:
            from django_tasks import task_backends
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
            from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.signals import task_enqueued, task_finished, task_started
            from django_tasks.utils import normalize_json

            FRAMEWORK = "django_tasks"
        except ImportError as exc:
            raise ImportError(BACKPORT_HINT) from exc

__all__ = [
    "BACKPORT_HINT",
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
