"""Periodic schedules' state and their operator events."""

from __future__ import annotations

from django.db import models

from django_workhorse import conf
from django_workhorse.models.base import (
    SCHEDULE_EVENT_REQUEST_UNIQ,
    SCHEDULE_NAME_UNIQ,
)


class ScheduleState(models.Model):
    """What the database knows of one periodic schedule: synced from code at each evaluation.

    A schedule removed from code is kept, marked inactive, with its history. ``evaluated_until``
    is where the next evaluation's window starts: ticks up to it have been enqueued or skipped.
    """

    name = models.CharField(max_length=conf.MAX_SCHEDULE_NAME_CHARS)
    task = models.CharField(max_length=conf.MAX_JOB_TYPE_CHARS, help_text="The job type each tick enqueues.")
    definition = models.JSONField(help_text="The schedule as declared in code, for display.")
    digest = models.CharField(max_length=64, help_text="SHA-256 of the definition; changes when the code does.")
    active = models.BooleanField(default=True, help_text="Declared by the code of the last evaluator.")
    paused = models.BooleanField(default=False, help_text="A paused schedule makes no ticks.")
    evaluated_until = models.DateTimeField(help_text="Ticks up to this instant have been enqueued or skipped.")
    last_tick_at = models.DateTimeField(null=True, blank=True, help_text="The newest tick enqueued.")
    # A plain id, not a foreign key: maintenance prunes finished jobs, the schedule outlives them.
    last_job_id = models.BigIntegerField(null=True, blank=True, help_text="The job of the newest tick or run-now.")
    last_skip_at = models.DateTimeField(null=True, blank=True, help_text="The newest tick not enqueued.")
    last_skip_reason = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "workhorse_schedule"
        verbose_name = "schedule"
        ordering = ["name"]
        permissions = [
            ("pause_schedule", "Can pause and resume schedules"),
            ("run_schedule_now", "Can run schedules now"),
        ]
        constraints = [models.UniqueConstraint(fields=["name"], name=SCHEDULE_NAME_UNIQ)]

    def __str__(self) -> str:
        return self.name


class ScheduleEventKind(models.TextChoices):
    """What an operator did to a schedule."""

    PAUSED = "paused"
    RESUMED = "resumed"
    RUN_NOW = "run_now"


class ScheduleEvent(models.Model):
    """One operator action on a schedule, with who asked; a run-now is one per request id."""

    schedule = models.ForeignKey(ScheduleState, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=16, choices=ScheduleEventKind.choices)
    at = models.DateTimeField()
    requested_by = models.CharField(max_length=conf.MAX_REQUESTED_BY_CHARS, blank=True)
    request_id = models.CharField(max_length=conf.MAX_REQUEST_ID_CHARS, blank=True)
    job_id = models.BigIntegerField(null=True, blank=True, help_text="The job a run-now enqueued.")

    class Meta:
        db_table = "workhorse_schedule_event"
        ordering = ["schedule", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "request_id"],
                name=SCHEDULE_EVENT_REQUEST_UNIQ,
                condition=models.Q(kind="run_now"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} ({self.schedule_id})"
