"""Handlers for the worker fleet's process tests (``tests/test_fleet_processes.py``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any

from django_workhorse.tasks.registry import register
from django_workhorse.worker.context import HandlerContext


@register("tests.fleet.work")
def work(payload: dict[str, Any]) -> dict[str, int]:
    """A job with a little to do: waits ``ms`` milliseconds (so jobs overlap), then returns its number."""
    threading.Event().wait(payload.get("ms", 0) / 1000)
    return {"n": payload["n"]}


@register("tests.fleet.stuck_in_c")
def stuck_in_c(ctx: HandlerContext, payload: Any) -> dict[str, int]:
    """Attempt 1 sits in a C call (libc ``sleep``) no cancellation reaches; later attempts return at once."""
    if ctx.attempt == 1:
        ctypes.CDLL(ctypes.util.find_library("c")).sleep(120)
        raise RuntimeError("attempt 1 was meant to be killed")
    return {"attempt": ctx.attempt}
