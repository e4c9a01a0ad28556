"""The worker registry and named leases (the maintenance lease)."""

from __future__ import annotations

from django.db import models

from django_workhorse.models.base import (
    WORKER_NAME_UNIQ,
)


class WorkerRecord(models.Model):
    """A running worker process, registered at start and removed on a clean exit."""

    name = models.CharField(max_length=255)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.IntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()

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
