"""A django.tasks task in a module of no installed app, for tests/test_backend_imports.py: a worker
may import it only when ``WORKHORSE_TASK_MODULES`` names it (whether it did shows in ``sys.modules``)."""

from __future__ import annotations

import importlib

from django_workhorse.backends._framework import FRAMEWORK

task = importlib.import_module(FRAMEWORK).task


@task()
def probe(n: int) -> int:
    return n + 1
