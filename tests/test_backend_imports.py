"""The django.tasks backend imports a job type's module only from the installed apps, the modules
already imported and ``WORKHORSE_TASK_MODULES``: a job type is text from the database, and importing
a module runs its code. A job naming any other module dies without importing it."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator

import pytest
from django.test import override_settings

from django_workhorse import enqueue
from django_workhorse.models import Job, JobStatus
from django_workhorse.tasks import registry
from tests.worker_tasks import run_worker

try:
    from django_workhorse.backends._framework import TaskResultDoesNotExist, task_backends
except ImportError as exc:  # neither django.tasks (Django 6.0+) nor the django-tasks backport
    pytest.skip(f"no tasks framework: {exc}", allow_module_level=True)

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = "tests.task_import_probe"
TASKS = {"default": {"BACKEND": "django_workhorse.backends.WorkhorseBackend", "QUEUES": []}}
# A task in a module of no installed app, and a standard-library module that prints when imported.
FORBIDDEN = [f"{PROBE}.probe", "this.s"]


@pytest.fixture(autouse=True)
def fresh_worker(monkeypatch) -> Iterator[None]:
    """As in a worker process that never imported the modules and resolved no job type."""
    monkeypatch.setattr(registry, "_handlers", {})
    for module in (PROBE, "this"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    with override_settings(TASKS=TASKS):
        yield
    sys.modules.pop(PROBE, None)


def enqueue_call(job_type: str, queue: str) -> int:
    return enqueue(job_type, {"args": [1], "kwargs": {}}, queue=queue, max_attempts=1)


@pytest.mark.parametrize("job_type", FORBIDDEN)
def test_a_job_naming_a_module_of_no_installed_app_dies_without_importing_it(job_type, caplog):
    module = job_type.rpartition(".")[0]
    job_id = enqueue_call(job_type, "t-forbidden")
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(job_id))
    runner_logger = "django_workhorse.backends.runner"
    caplog.set_level(logging.WARNING, logger=runner_logger)

    run_worker(queues=["t-forbidden"])

    assert module not in sys.modules
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.DEAD
    assert f"no handler is registered for job type {job_type!r}" in job.last_error
    assert [record.getMessage() for record in caplog.records if record.name == runner_logger] == [
        f"Not importing module={module} for job type={job_type}: "
        "it is in no installed app and not in WORKHORSE_TASK_MODULES"
    ]


def test_a_module_named_in_the_setting_is_imported_and_its_task_runs(settings):
    refused = enqueue_call(f"{PROBE}.probe", "t-allowed")
    run_worker(queues=["t-allowed"])
    assert PROBE not in sys.modules and Job.objects.get(pk=refused).status == JobStatus.DEAD

    settings.WORKHORSE_TASK_MODULES = [PROBE]
    job_id = enqueue_call(f"{PROBE}.probe", "t-allowed")
    run_worker(queues=["t-allowed"])

    assert PROBE in sys.modules
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, 2)
    assert task_backends["default"].get_result(str(job_id)).return_value == 2
