"""The two versions of a rolling deploy, for tests/test_capability_processes.py: the old code has a
handler for Y only, the new code for X and Y (``tests/worker_main.py`` loads one, as
``WORKHORSE_TEST_DEPLOY`` says)."""

from __future__ import annotations

from typing import Any

from django_workhorse import register

X, Y = "tests.deploy.x", "tests.deploy.y"


def run(payload: Any) -> None:
    return None


def load(version: str) -> None:
    """Register the handlers of ``version``: "old" (Y) or "new" (X and Y)."""
    for job_type in (Y,) if version == "old" else (X, Y):
        register(job_type, run)
