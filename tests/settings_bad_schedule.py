"""``tests.settings`` with two bad WORKHORSE_SCHEDULES entries beside a good one, for the worker and
scheduler subprocesses of tests/test_schedule_problems_runtime.py."""

from __future__ import annotations

from datetime import timedelta

from tests.settings import *  # noqa: F403

GOOD_ORDER_ID = 7
WORKHORSE_SCHEDULES = {
    # workhorse.E203: there is no hour 25.
    "bad-cron": {"task": "shop.send_confirmation", "cron": "0 25 * * *"},
    # workhorse.E208: a NUL character cannot be stored in the job's payload.
    "bad-arguments": {
        "task": "shop.send_confirmation",
        "every": timedelta(minutes=1),
        "kwargs": {"order_id": "\x00"},
    },
    "good": {"task": "shop.send_confirmation", "every": timedelta(seconds=1), "kwargs": {"order_id": GOOD_ORDER_ID}},
}
WORKHORSE_SCHEDULE_INTERVAL = timedelta(milliseconds=100)
