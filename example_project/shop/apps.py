"""App config of the demo shop."""

from __future__ import annotations

from django.apps import AppConfig


class ShopConfig(AppConfig):
    """The demo shop."""

    name = "example_project.shop"
    label = "shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from example_project.shop import tasks  # noqa: F401 (registers the job handlers)
