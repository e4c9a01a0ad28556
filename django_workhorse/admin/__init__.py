"""The operator's Django admin: jobs, dead letters, idempotency bindings, the effect ledger, workers, schedules,
queues, workflows and a dashboard.

Everything is read-only by hand. Changing actions (cancel, run now, redrive, purge, release) each
need their own permission, are checked server-side, and record the acting user in the job's events
(purge, which deletes the job, in the admin log). Raw keys are never shown nor stored.

One module per subject:

- ``base``: the checked changelist and its query-string checks, the base admins (search, read-only),
  who acts and may act;
- ``display``: how stored values show (JSON, error summaries, event details, job links);
- ``confirmation``: the one preview page of the actions that ask for confirmation, and its request id;
- ``jobs``, ``dead_letters``, ``bindings``, ``ledger``, ``workers``, ``schedules``, ``breakers``, ``workflows``: one admin each,
  with its filters and actions; ``queues``: the Queues page (pause and resume);
- ``dashboard``: the dashboard page and the layout of its throughput chart; ``dashboard_entry`` its
  entry in the admin index and side bar.

This module registers the admins on the default ``admin.site``.
"""

from __future__ import annotations

from django.contrib import admin

from django_workhorse.models import (
    Breaker,
    Dashboard,
    DeadJob,
    EffectRecord,
    IdempotencyBinding,
    Job,
    QueueState,
    ScheduleState,
    WorkerRecord,
    Workflow,
)

from .bindings import BindingAdmin, FindKeyForm
from .breakers import BreakerAdmin
from .dashboard_entry import DashboardEntryAdmin
from .dead_letters import DeadJobAdmin
from .display import JSON_DISPLAY_CHARS
from .jobs import JobAdmin
from .ledger import LedgerAdmin
from .queues import QueueAdmin
from .schedules import ScheduleAdmin
from .workers import WorkerAdmin
from .workflows import WorkflowAdmin

__all__ = [
    "JSON_DISPLAY_CHARS",
    "BindingAdmin",
    "BreakerAdmin",
    "DashboardEntryAdmin",
    "DeadJobAdmin",
    "FindKeyForm",
    "JobAdmin",
    "LedgerAdmin",
    "QueueAdmin",
    "ScheduleAdmin",
    "WorkerAdmin",
    "WorkflowAdmin",
]

admin.site.register(Job, JobAdmin)
admin.site.register(DeadJob, DeadJobAdmin)
admin.site.register(Dashboard, DashboardEntryAdmin)
admin.site.register(IdempotencyBinding, BindingAdmin)
admin.site.register(EffectRecord, LedgerAdmin)
admin.site.register(WorkerRecord, WorkerAdmin)
admin.site.register(ScheduleState, ScheduleAdmin)
admin.site.register(QueueState, QueueAdmin)
admin.site.register(Breaker, BreakerAdmin)
admin.site.register(Workflow, WorkflowAdmin)
