"""Imported only by the discovery an enqueue by name triggers (see the package docstring)."""

from __future__ import annotations

from django_workhorse import task


@task(name="tests.discovery_app.undiscovered", queue="discovered", priority=7)
def undiscovered() -> None:
    pass
