"""What admission at claim reads besides the job: paused queues and circuit breakers.

Both are rows every worker's claim consults (decision 0021): a paused queue is left out of the
claim; a job whose breaker is open is held back (``Job.held_since``, ``run_at`` moved to when the
breaker may admit it), consuming no attempt.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Length

from django_workhorse import conf
from django_workhorse.models.base import (
    BREAKER_KEY_CHECK,
    BREAKER_STATE_CHECK,
    QUEUE_NAME_CHECK,
    RATE_BUDGET_UNIQ,
    octet_length,
)


class QueueState(models.Model):
    """A queue an operator paused (or resumed): no worker claims a paused queue's jobs.

    A queue without a row runs; ``resume_queue`` keeps the row (with who resumed it, and when).
    """

    queue = models.CharField(max_length=conf.MAX_QUEUE_CHARS, primary_key=True)
    paused = models.BooleanField(default=False)
    changed_at = models.DateTimeField(help_text="When it was last paused or resumed.")
    changed_by = models.CharField(max_length=conf.MAX_REQUESTED_BY_CHARS, blank=True, default="")

    class Meta:
        db_table = "workhorse_queue"
        verbose_name = "queue"
        permissions = [
            ("pause_queue", "Can pause queues"),
            ("resume_queue", "Can resume queues"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.lookups.GreaterThanOrEqual(Length("queue"), 1), name=QUEUE_NAME_CHECK
            )
        ]

    def __str__(self) -> str:
        return self.queue


class BreakerState(models.TextChoices):
    """Where a circuit breaker is: ``closed`` admits every job, ``open`` none, ``half_open`` its canaries."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Breaker(models.Model):
    """The shared state of one circuit breaker (a destination or a job type), as every worker sees it.

    A row exists once a job behind it failed. ``recent_failures`` keeps the instants of the last
    ``policy.failures`` failed attempts (an exact sliding window); ``open_until`` is when an open
    breaker starts admitting canaries; ``probes_admitted`` counts the canaries of this half-open
    period; ``transitions`` keeps the latest state changes, newest last.
    """

    key = models.CharField(max_length=conf.MAX_BREAKER_KEY_BYTES, primary_key=True)
    state = models.CharField(max_length=16, choices=BreakerState.choices, default=BreakerState.CLOSED)
    # Epoch seconds (PostgreSQL's clock) of the latest failed attempts, oldest first; jsonb, not an
    # array column, so that django.contrib.postgres need not be installed.
    recent_failures = models.JSONField(default=list, blank=True)
    opened_at = models.DateTimeField(null=True, blank=True)
    open_until = models.DateTimeField(null=True, blank=True)
    cooldown = models.DurationField(null=True, blank=True, help_text="The cooldown of the current open period.")
    probes = models.SmallIntegerField(default=1, help_text="Canaries admitted while half-open.")
    probes_admitted = models.SmallIntegerField(default=0)
    policy = models.JSONField(default=dict, blank=True, help_text="The breaker's settings as a worker last wrote them.")
    transitions = models.JSONField(default=list, blank=True)
    changed_at = models.DateTimeField()

    class Meta:
        db_table = "workhorse_breaker"
        verbose_name = "circuit breaker"
        permissions = [("reset_breaker", "Can reset circuit breakers")]
        constraints = [
            models.CheckConstraint(condition=models.Q(state__in=BreakerState.values), name=BREAKER_STATE_CHECK),
            models.CheckConstraint(
                condition=models.lookups.LessThanOrEqual(octet_length("key"), conf.MAX_BREAKER_KEY_BYTES)
                & models.lookups.GreaterThanOrEqual(octet_length("key"), 1),
                name=BREAKER_KEY_CHECK,
            ),
        ]

    def __str__(self) -> str:
        return self.key


class RateBudget(models.Model):
    """The shared budget of one rate limit (``WORKHORSE_RATE_LIMITS``), or of one partition of a
    partitioned limit, as every worker's claim spends it.

    ``tat`` is the budget's theoretical arrival time (the generic cell rate algorithm): an attempt
    may start at ``now`` while ``tat - now`` is within the limit's burst tolerance, and each start
    moves ``tat`` one emission interval (``per / limit``) on; jobs held for it are given consecutive
    slots up to ``reserved_until``. The claim updates the row with a
    conditional ``UPDATE`` (decision 0021), so two claims never spend the same budget. ``partition``
    is ``""`` for a limit that is not partitioned.
    """

    name = models.CharField(max_length=conf.MAX_RATE_LIMIT_NAME_CHARS)
    partition = models.CharField(max_length=conf.MAX_RATE_PARTITION_BYTES, blank=True, default="")
    tat = models.DateTimeField(help_text="The budget's theoretical arrival time (GCRA).")
    reserved_until = models.DateTimeField(
        null=True, blank=True, help_text="The first slot not yet promised to a job held for this budget."
    )
    granted = models.IntegerField(default=0, help_text="Attempts the latest claim admitted under it.")
    admitted = models.BigIntegerField(default=0, help_text="Attempts admitted under it, in all.")
    deferred = models.BigIntegerField(default=0, help_text="Jobs held back for it, in all.")
    changed_at = models.DateTimeField()

    class Meta:
        db_table = "workhorse_rate_budget"
        verbose_name = "rate budget"
        constraints = [models.UniqueConstraint(fields=["name", "partition"], name=RATE_BUDGET_UNIQ)]

    def __str__(self) -> str:
        return f"{self.name}[{self.partition}]" if self.partition else self.name
