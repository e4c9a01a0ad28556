"""Helpers for your own tests: eager mode and running queued jobs synchronously.

``with eager():`` (or ``WORKHORSE_EAGER = True``) runs accepted jobs right after enqueue, in the
caller's thread and transaction; keys deduplicate exactly as in production. ``run_jobs()`` runs
what is queued, including scheduled jobs when asked.
"""

from __future__ import annotations

from django_workhorse.worker.eager import EagerMode, eager, run_job, run_jobs

__all__ = ["EagerMode", "eager", "run_job", "run_jobs"]
