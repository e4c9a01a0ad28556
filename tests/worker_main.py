"""Run ``manage.py workhorse_worker`` for the process tests, with the test handlers loaded.

Usage: ``DATABASE_URL=... python tests/worker_main.py [workhorse_worker options]``. The settings are
``tests.settings``; pass the test database through ``DATABASE_URL``, and schedules through
``WORKHORSE_TEST_SCHEDULES`` (JSON, ``every`` in seconds) and ``WORKHORSE_TEST_SCHEDULE_INTERVAL``, queue
options through ``WORKHORSE_TEST_QUEUES`` (JSON), and rate limits through ``WORKHORSE_TEST_RATE_LIMITS``
(JSON: name -> [limit, per in seconds, burst, partitioned]), the version of ``tests.deploy_tasks``
to load through ``WORKHORSE_TEST_DEPLOY`` ("old" or "new"; none by default), and the cap of the backoff
while the database is unreachable through ``WORKHORSE_TEST_DB_BACKOFF_CAP`` (seconds). ``Worker.stop`` is wrapped to
set ``tests.worker_tasks.STOP_REQUESTED`` as well, so a running handler can observe the stop.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

    import django

    django.setup()
    _schedules_from_environment()
    if cap := os.environ.get("WORKHORSE_TEST_DB_BACKOFF_CAP"):
        from django_workhorse.worker import database_wait

        database_wait.BACKOFF_CAP = float(cap)

    from django.core.management import call_command

    from django_workhorse.worker import Worker
    from tests import breaker_tasks, fleet_tasks, rate_tasks, worker_tasks, workflow_tasks  # noqa: F401 (their handlers register on import)

    deploy = os.environ.get("WORKHORSE_TEST_DEPLOY")
    if deploy:
        from tests import deploy_tasks

        deploy_tasks.load(deploy)
    stop = Worker.stop

    def stop_and_tell_handlers(self: Worker) -> None:
        stop(self)
        worker_tasks.STOP_REQUESTED.set()

    Worker.stop = stop_and_tell_handlers  # type: ignore[method-assign]
    call_command("workhorse_worker", *argv)
    return 0


def _schedules_from_environment() -> None:
    """``WORKHORSE_TEST_SCHEDULES`` (JSON: name -> entry, ``every`` in seconds) becomes WORKHORSE_SCHEDULES."""
    import json
    from datetime import timedelta

    from django.test import override_settings

    overrides: dict[str, object] = {}
    text = os.environ.get("WORKHORSE_TEST_SCHEDULES")
    if text:
        entries = json.loads(text)
        for entry in entries.values():
            if "every" in entry:
                entry["every"] = timedelta(seconds=entry["every"])
        overrides["WORKHORSE_SCHEDULES"] = entries
    limits = os.environ.get("WORKHORSE_TEST_RATE_LIMITS")
    if limits:
        from django_workhorse import RateLimit

        overrides["WORKHORSE_RATE_LIMITS"] = {
            name: RateLimit(limit, per=timedelta(seconds=per), burst=burst, partitioned=partitioned)
            for name, (limit, per, burst, partitioned) in json.loads(limits).items()
        }
    interval = os.environ.get("WORKHORSE_TEST_SCHEDULE_INTERVAL")
    if interval:
        overrides["WORKHORSE_SCHEDULE_INTERVAL"] = timedelta(seconds=float(interval))
    queues = os.environ.get("WORKHORSE_TEST_QUEUES")
    if queues:
        overrides["WORKHORSE_QUEUES"] = json.loads(queues)
    if overrides:
        override_settings(**overrides).enable()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
