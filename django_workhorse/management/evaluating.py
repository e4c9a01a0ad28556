"""The base of the commands that evaluate the schedules (``workhorse_worker``, ``workhorse_scheduler``).

They run the system checks as every command does, with the database checks of the alias they run
on, but not the schedules' (``workhorse.E203``-``E208``): one bad schedule must not stop every
queue. Their ``handle()`` leaves it out and reports it (``report_left_out_schedules``). Nor the
census of stored encryption keys (``workhorse.W005``): it reads the encrypted history, and is
``migrate``'s and ``check --database``'s.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from django_workhorse.checks import schedule_problems_reported_elsewhere, stored_keys_left_out


class EvaluatingCommand(BaseCommand):
    """A command with a ``--database`` option whose process evaluates the schedules."""

    def check(self, *args: Any, **kwargs: Any) -> None:
        with schedule_problems_reported_elsewhere(), stored_keys_left_out():  # handle() reports the schedules
            super().check(*args, **kwargs)

    def get_check_kwargs(self, options: dict[str, Any]) -> Any:
        kwargs = super().get_check_kwargs(options)
        kwargs["databases"] = [options["database"]]  # the database checks too, of the alias it runs on
        return kwargs
