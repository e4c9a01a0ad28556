"""``manage.py workhorse_maintenance``: run the housekeeping once."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_workhorse.maintenance import prune_expired_bindings


class Command(BaseCommand):
    help = "Delete expired idempotency bindings (and, later, other housekeeping)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=None, help="Database alias (default: the router's choice).")

    def handle(self, *args: Any, database: str | None, verbosity: int, **options: Any) -> None:
        pruned = prune_expired_bindings(using=database)
        if verbosity:
            self.stdout.write(f"Pruned {pruned} expired binding(s).")
