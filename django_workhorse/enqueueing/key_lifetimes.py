"""When a binding stops owning its key: the rule, as data, for the SQL statements and the ORM alike.

``sql/keys.py`` generates the ``FREE`` fragment of the statements from ``FREED_BY``, and
``models.free_binding_q`` (behind ``IdempotencyBinding.objects.free()``/``.live()``) builds its
filter from the same table, so the two cannot drift apart. Pure data: no SQL, no models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class FreedBy:
    """What frees the key of a binding of one mode: its job finished, its time is up, or both."""

    job_terminal: bool
    expired: bool


TERMINAL_JOB_STATUSES: Final = ("succeeded", "dead", "cancelled")
# Idempotency and throttle keys are free once their time is up, unique keys once their job is
# terminal, debounce keys once both hold (debounce keeps its key one window past the scheduled run).
FREED_BY: Final = {
    "idempotency": FreedBy(job_terminal=False, expired=True),
    "unique": FreedBy(job_terminal=True, expired=False),
    "debounce": FreedBy(job_terminal=True, expired=True),
    "throttle": FreedBy(job_terminal=False, expired=True),
}
