"""App configuration."""

from __future__ import annotations

import functools
from typing import Any

from django.apps import AppConfig

# The migrations that create the database functions; post_migrate keeps each current after its own.
FUNCTIONS_MIGRATION = "0011_enqueue_one_function"  # workhorse_enqueue_one (sql.enqueue)
HTTP_FUNCTIONS_MIGRATION = "0012_http_records"  # workhorse_http_claim (sql.http_records)
# The migration that adds workhorse_job.cipher_salt, which workhorse_enqueue_one writes once it is applied.
CIPHER_SALT_MIGRATION = "0025_job_cipher_salt"


class WorkhorseConfig(AppConfig):
    """django-workhorse: a durable PostgreSQL job queue with idempotent enqueue."""

    name = "django_workhorse"
    label = "workhorse"
    verbose_name = "Workhorse"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from django_workhorse import checks  # noqa: F401 (registers the system checks)
        from django_workhorse.awaiting.waiting import wait_for
        from django_workhorse.enqueueing.after_write import set_inline_runner
        from django_workhorse.types import set_result_waiter
        from django_workhorse.worker import eager

        # Eager mode: writes run their accepted jobs inline through the worker's own steps.
        set_inline_runner(eager.is_active, eager.run_accepted, eager.run_workflow)
        # EnqueueResult.wait: the value object waits through the awaiting room, which it cannot import.
        set_result_waiter(wait_for)

        post_migrate.connect(_install_functions, sender=self, dispatch_uid="workhorse.install_functions")


def _install_functions(sender: AppConfig, using: str, **kwargs: Any) -> None:
    """Keep the database functions (enqueue's, and ``@idempotent``'s claim) at this version's body
    after every ``migrate``.

    Each only where the migration that creates it (0011, 0012) is applied, or where the app's tables
    were made without migrations (test databases built with migrations disabled); never on a
    database the routers keep the app out of.
    """
    from django.db import connections, router
    from django.db.migrations.loader import MigrationLoader

    from django_workhorse import sql

    if not router.allow_migrate(using, sender.label):
        return
    loader = MigrationLoader(connections[using], ignore_no_migrations=True)
    migrated = sender.label in loader.migrated_apps
    applied = loader.applied_migrations
    # Migrated back before 0025, the enqueue function must not write the column it removed.
    salted = not migrated or (sender.label, CIPHER_SALT_MIGRATION) in applied
    for migration, install in (
        (FUNCTIONS_MIGRATION, functools.partial(sql.enqueue.install_functions, cipher_salt=salted)),
        (HTTP_FUNCTIONS_MIGRATION, sql.http_records.install_functions),
    ):
        if not migrated or (sender.label, migration) in applied:
            install(using)
