"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class WorkhorseConfig(AppConfig):
    """django-workhorse: a durable PostgreSQL job queue with idempotent enqueue."""

    name = "django_workhorse"
    label = "workhorse"
    verbose_name = "Workhorse"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_workhorse import checks  # noqa: F401 (registers the system checks)
