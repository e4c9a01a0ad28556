"""The read vocabulary of the models: which bindings still own their key.

Built from the rule table in ``key_lifetimes``, the same one ``sql/keys.py`` turns into the
statements' ``FREE`` fragment.
"""

from __future__ import annotations

import operator
from datetime import datetime
from functools import reduce
from typing import TYPE_CHECKING

from django.db import models
from django.utils import timezone

from django_workhorse.enqueueing.key_lifetimes import FREED_BY, TERMINAL_JOB_STATUSES

if TYPE_CHECKING:
    from django_workhorse.models import IdempotencyBinding  # noqa: F401 (named in a string below)


def free_binding_q(now: datetime) -> models.Q:
    """Bindings that own nothing any more at ``now``: the ORM form of ``FREE`` in ``sql/keys.py``.

    Built from the same rule table (``key_lifetimes.FREED_BY``), so the two cannot drift apart. A
    timed binding without ``expires_at`` is not free, as ``WHERE FREE`` treats it.
    """
    conditions = []
    for mode, rule in FREED_BY.items():
        condition = models.Q(mode=mode)
        if rule.job_terminal:
            condition &= models.Q(job__status__in=TERMINAL_JOB_STATUSES)
        if rule.expired:
            condition &= models.Q(expires_at__lte=now)
        conditions.append(condition)
    return reduce(operator.or_, conditions)


class BindingQuerySet(models.QuerySet["IdempotencyBinding"]):
    """Bindings by whether they still own their key (``now`` defaults to the current time)."""

    def free(self, now: datetime | None = None) -> BindingQuerySet:
        """Bindings the next request for their key may take over."""
        free: BindingQuerySet = self.filter(free_binding_q(now or timezone.now()))
        return free

    def live(self, now: datetime | None = None) -> BindingQuerySet:
        """Bindings that still own their key."""
        live: BindingQuerySet = self.exclude(free_binding_q(now or timezone.now()))
        return live
