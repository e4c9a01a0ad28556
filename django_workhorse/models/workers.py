"""The worker registry and named leases (the maintenance lease)."""

from __future__ import annotations

from django.db import models

from django_workhorse.models.base import (
    WORKER_NAME_UNIQ,
)


class WorkerKind(models.TextChoices):
    """What a registry row stands for: a worker of its own, a supervisor of worker processes, or one
    of a supervisor's children (``workhorse_worker --processes N``)."""

    WORKER = "worker"
    SUPERVISOR = "supervisor"
    CHILD = "child"


class WorkerRecord(models.Model):
    """A running worker process, registered at start and removed on a clean exit."""

    name = models.CharField(max_length=255)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.IntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    job_types = models.JSONField(
        null=True,
        blank=True,
        help_text="The job types this worker has handlers for: its claims take only those (NULL: not said).",
    )
    kind = models.CharField(max_length=20, choices=WorkerKind.choices, default=WorkerKind.WORKER, db_default="worker")
    supervisor = models.CharField(
        max_length=255, blank=True, default="", db_default="", help_text="A child's supervisor (its name)."
    )
    state = models.CharField(
        max_length=20,
        default="running",
        db_default="running",
        help_text="running, draining, recycling or waiting for the database, as the process last said.",
    )

    class Meta:
        db_table = "workhorse_worker"
        verbose_name = "worker"
        constraints = [models.UniqueConstraint(fields=["name"], name=WORKER_NAME_UNIQ)]

    def __str__(self) -> str:
        return self.name


class Lease(models.Model):
    """A named lease one process holds at a time, until it gives it back or ``expires_at`` passes.

    Maintenance runs under the ``maintenance`` lease (``sql.leases``). A row taken by compare and swap,
    not a session advisory lock: it holds behind a transaction pooler, and every statement that takes,
    renews or gives it back commits on its own (see decision 0010).
    """

    name = models.CharField(max_length=100, primary_key=True)
    holder = models.UUIDField(help_text="The token of the run that holds it.")
    expires_at = models.DateTimeField(help_text="Free again from this instant, if not given back before.")

    class Meta:
        db_table = "workhorse_lease"

    def __str__(self) -> str:
        return self.name
