"""The django.tasks backend imports a job type's module only from the installed apps, the modules
already imported and ``WORKHORSE_TASK_MODULES``: a job type is text from the database, and importing
a module runs its code. A worker claims no job naming any other module: it waits, its module not imported."""

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
def test_a_job_naming_a_module_of_no_installed_app_waits_without_importing_it(job_type, caplog):
    module = job_type.rpartition(".")[0]
    job_id = enqueue_call(job_type, "t-forbidden")
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(job_id))
    runner_logger = "django_workhorse.backends.runner"
    caplog.set_level(logging.WARNING, logger=runner_logger)

    stats = run_worker(queues=["t-forbidden"])

    # The worker advertises only its installed apps and WORKHORSE_TASK_MODULES: it never claims the job.
    assert module not in sys.modules
    assert stats.claimed == 0
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 0)
    assert [record.getMessage() for record in caplog.records if record.name == runner_logger] == []


def test_a_module_named_in_the_setting_is_imported_and_its_task_runs(settings):
    waiting = enqueue_call(f"{PROBE}.probe", "t-allowed")
    assert run_worker(queues=["t-allowed"]).claimed == 0
    assert PROBE not in sys.modules
    assert (Job.objects.get(pk=waiting).status, Job.objects.get(pk=waiting).attempt) == (JobStatus.QUEUED, 0)

    settings.WORKHORSE_TASK_MODULES = [PROBE]
    job_id = enqueue_call(f"{PROBE}.probe", "t-allowed")
    run_worker(queues=["t-allowed"])

    assert PROBE in sys.modules
    for done in (waiting, job_id):  # the job that waited runs too, on its first attempt
        job = Job.objects.get(pk=done)
        assert (job.status, job.result, job.attempt) == (JobStatus.SUCCEEDED, 2, 1)
    assert task_backends["default"].get_result(str(job_id)).return_value == 2
