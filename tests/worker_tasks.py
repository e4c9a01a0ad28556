"""Handlers for the worker tests, and the helpers those tests share.

Imported by the test modules and by worker subprocesses (``tests/worker_main.py``), so a job
enqueued by a test finds its handler in whichever process claims it. Handlers that run in this
process record their calls in ``CALLS``; handlers meant for subprocesses signal through the
database (a checkpoint named ``started``), which the test process can see.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import connection

from django_workhorse.exceptions import InvalidArgumentError, StepNotSucceededError
from django_workhorse.tasks.decorator import task
from django_workhorse.tasks.registry import register
from django_workhorse.worker import HandlerContext, Worker, WorkerStats

T = TypeVar("T")

# -- helpers shared by the worker tests ---------------------------------------------------------

POLL_SECONDS = 0.015


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, *, what: str = "") -> T:
    """Poll ``predicate`` every 15 ms until it returns something truthy; return that value.

    Fail with a message naming ``what`` (or the predicate) if ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate!r}; last value {value!r}")
        tick.wait(POLL_SECONDS)


class WorkerThread:
    """A :class:`Worker` running on its own thread; ``join`` fails the test if it does not end."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.stats: WorkerStats | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-worker", daemon=True)

    def _run(self) -> None:
        try:
            self.stats = self.worker.run()
        except BaseException as exc:  # reported by join()
            self.error = exc

    def start(self) -> WorkerThread:
        self._thread.start()
        return self

    def join(self, timeout: float = 60) -> WorkerStats:
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.worker.stop()
            self._thread.join(30)
            raise AssertionError(f"the worker did not end within {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats

    def stop(self, timeout: float = 60) -> WorkerStats:
        self.worker.stop()
        return self.join(timeout)


def make_worker(**options: Any) -> Worker:
    """A worker that polls fast and does not LISTEN unless asked to."""
    return Worker(**{"listen_using": None, "poll_interval": 0.05, **options})


def run_worker(timeout: float = 60, **options: Any) -> WorkerStats:
    """Run a burst (or ``max_jobs``) worker to its end on a thread; return its stats."""
    options.setdefault("burst", options.get("max_jobs") is None)
    return WorkerThread(make_worker(**options)).start().join(timeout)


@contextmanager
def running(worker: Worker) -> Iterator[WorkerThread]:
    """Run a non-burst worker on a thread for the duration of the block, then stop it."""
    handle = WorkerThread(worker).start()
    try:
        yield handle
    finally:
        handle.stop()


class Calls:
    """A thread-safe record of handler calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Any] = []

    def add(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)

    def items(self) -> list[Any]:
        with self._lock:
            return list(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


CALLS = Calls()

# Set in a worker subprocess when the worker is asked to stop (tests/worker_main.py wraps
# Worker.stop), so a handler can observe that a SIGTERM arrived while it was running.
STOP_REQUESTED = threading.Event()


# -- handlers run in the test process ------------------------------------------------------------


@register("tests.record")
def record(payload: Any) -> Any:
    """Record the payload; return it (stored as the job's result)."""
    CALLS.add(payload)
    return payload


@register("tests.record_ctx")
def record_ctx(ctx: HandlerContext, payload: Any) -> dict[str, Any]:
    """Record what the context says; return the attempt."""
    CALLS.add({"job_id": ctx.job_id, "attempt": ctx.attempt, "key": ctx.idempotency_key, "payload": payload})
    return {"attempt": ctx.attempt}


@register("tests.scheduled")
def scheduled(ctx: HandlerContext, payload: Any) -> dict[str, Any]:
    """Return the tick the job runs for (None for a job no schedule enqueued) and this process's id."""
    tick = ctx.scheduled_for
    return {"scheduled_for": None if tick is None else tick.isoformat(), "pid": os.getpid(), "payload": payload}


@register("tests.fail_until")
def fail_until(ctx: HandlerContext, payload: dict[str, int]) -> dict[str, int]:
    """Fail every attempt before ``payload["succeed_on"]``."""
    CALLS.add((ctx.attempt, ctx.idempotency_key))
    if ctx.attempt < payload["succeed_on"]:
        raise RuntimeError(f"boom on attempt {ctx.attempt}")
    return {"attempt": ctx.attempt}


@register("tests.always_fail")
def always_fail(payload: Any) -> None:
    CALLS.add(payload)
    raise ValueError("always broken")


@register("tests.hold_db_clock")
def hold_db_clock(payload: dict[str, int]) -> str:
    """Return once the database clock moved ``payload["ms"]`` milliseconds past the handler's start."""
    CALLS.add(payload)
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        start = cursor.fetchone()[0]
        tick = threading.Event()
        while True:
            cursor.execute("SELECT extract(epoch FROM clock_timestamp() - %s) * 1000", [start])
            if cursor.fetchone()[0] >= payload["ms"]:
                return "done"
            tick.wait(0.001)


@register("tests.checkpointed")
def checkpointed(ctx: HandlerContext, payload: dict[str, Any]) -> Any:
    """Run a stage once per job, crash after it on attempt 1, return its stored value on attempt 2."""

    def charge() -> dict[str, Any]:
        CALLS.add(("charge", ctx.attempt))
        return {"charge_id": f"ch_{payload['order']}", "amount": payload["amount"]}

    value = ctx.checkpoint("charge", charge)
    CALLS.add(("after", ctx.attempt, value))
    if ctx.attempt == 1:
        raise RuntimeError("crashed after the charge")
    return value


@register("tests.wait_for_cancel")
def wait_for_cancel(ctx: HandlerContext, payload: dict[str, float]) -> dict[str, bool]:
    """Poll ``ctx.cancelled`` for up to ``payload["seconds"]``; report whether it was set."""
    deadline = time.monotonic() + payload["seconds"]
    tick = threading.Event()
    while not ctx.cancelled and time.monotonic() < deadline:
        tick.wait(0.01)
    CALLS.add(ctx.cancelled)
    return {"cancelled": ctx.cancelled}


@register("tests.fail_when_cancelled")
def fail_when_cancelled(ctx: HandlerContext, payload: Any) -> None:
    """Run until cancellation is requested, then fail (a retry the recording turns into a cancel)."""
    _started(ctx)
    deadline = time.monotonic() + 60
    tick = threading.Event()
    while not ctx.cancelled and time.monotonic() < deadline:
        tick.wait(0.01)
    raise RuntimeError("failed after the cancellation request" if ctx.cancelled else "never cancelled")


# -- workflow context handlers (tests/test_workflow_context.py, tests/test_workflow_canvas.py) -------


def _read_step(ctx: HandlerContext, step: Any) -> dict[str, Any]:
    try:
        return {"result": ctx.result_of(step)}
    except StepNotSucceededError as exc:
        return {"not_succeeded": exc.status, "job_id": exc.job_id}
    except InvalidArgumentError as exc:
        return {"invalid": exc.field}


@register("tests.wf.context")
def workflow_context(ctx: HandlerContext, payload: dict[str, Any]) -> Any:
    """Record what the context says of the step (and ``result_of`` each step named in
    ``payload["read"]``); fail the attempts before ``payload["succeed_on"]`` (1: none) and every
    attempt while ``payload["die"]``; return ``payload["result"]``."""
    CALLS.add(
        {
            "job_id": ctx.job_id,
            "attempt": ctx.attempt,
            "key": ctx.idempotency_key,
            "workflow_id": ctx.workflow_id,
            "step": ctx.step_name,
            "parents": ctx.parent_results,
            "failed": ctx.failed_parents,
            "read": {str(step): _read_step(ctx, step) for step in payload.get("read", ())},
        }
    )
    if payload.get("die") or ctx.attempt < payload.get("succeed_on", 1):
        raise RuntimeError(f"step {ctx.step_name} fails attempt {ctx.attempt}")
    return payload.get("result")


# -- handlers run by worker subprocesses ------------------------------------------------------------


def _started(ctx: HandlerContext) -> Any:
    """Signal "the handler runs" to the test process: a checkpoint it can see (once per job)."""
    return ctx.checkpoint("started", lambda: {"pid": os.getpid(), "attempt": ctx.attempt})


@register("tests.proc.block_on_first_attempt")
def block_on_first_attempt(ctx: HandlerContext, payload: Any) -> dict[str, Any]:
    """Attempt 1 blocks until its process is killed; later attempts return at once."""
    started = _started(ctx)
    if ctx.attempt == 1:
        threading.Event().wait(600)
        raise RuntimeError("attempt 1 was meant to be killed")
    return {"attempt": ctx.attempt, "started": started}


@register("tests.proc.finish_after_stop")
def finish_after_stop(ctx: HandlerContext, payload: Any) -> dict[str, bool]:
    """Keep running until the worker was asked to stop, then finish normally."""
    _started(ctx)
    return {"stop_seen": STOP_REQUESTED.wait(60)}


@register("tests.proc.until_cancelled")
def until_cancelled(ctx: HandlerContext, payload: Any) -> dict[str, int]:
    """Attempt 1 runs until the worker cancels it (cooperatively); later attempts return at once."""
    _started(ctx)
    if ctx.attempt == 1:
        deadline = time.monotonic() + 120
        tick = threading.Event()
        while time.monotonic() < deadline:
            ctx.raise_if_cancelled()
            tick.wait(0.01)
        raise RuntimeError("attempt 1 was never cancelled")
    return {"attempt": ctx.attempt}


# -- @task functions ----------------------------------------------------------------------------------


@task(name="tests.add", queue="math", priority=5, max_attempts=3)
def add(x: int, y: int = 10, *, scale: int = 1) -> int:
    CALLS.add(("add", x, y, scale))
    return (x + y) * scale


@task
def greet(ctx: HandlerContext, name: str, punctuation: str = "!") -> dict[str, Any]:
    CALLS.add(("greet", ctx.attempt, name))
    return {"text": f"Hello {name}{punctuation}", "key": ctx.idempotency_key}


@task(name="tests.annotated")
def annotated(c: HandlerContext, n: int) -> dict[str, int]:
    CALLS.add(("annotated", c.job_id, n))
    return {"job_id": c.job_id, "n": n}


@task(name="tests.spread")
def spread(first: int, *rest: int, flag: bool = False, **extra: Any) -> dict[str, Any]:
    CALLS.add(("spread", first, rest, flag, extra))
    return {"first": first, "rest": list(rest), "flag": flag, "extra": extra}


@task(name="tests.keywords_only")
def keywords_only(*, a: int, b: int = 2, **extra: Any) -> dict[str, Any]:
    CALLS.add(("keywords_only", a, b, extra))
    return {"a": a, "b": b, "extra": extra}


@register("tests.plain_with_context")
def plain_with_context(c: HandlerContext, payload: Any) -> dict[str, Any]:
    CALLS.add(("plain_with_context", c.attempt, payload))
    return {"attempt": c.attempt, "payload": payload}


# -- a gate for concurrency-key tests (tests/test_concurrency_keys.py) ------------------------------


class Gate:
    """Where ``tests.gated`` handlers wait, counted per label, until the test lets them out.

    A handler enters (counted in flight; the most ever in flight at once is kept), then waits
    until the test lets one handler of its label out (``let_out``) or opens the label for good
    (``open``). A handler nobody lets out within ``payload["timeout"]`` seconds fails its job.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._in_flight: dict[str, int] = {}
        self._most: dict[str, int] = {}
        self._entered: dict[str, int] = {}
        self._exited: dict[str, int] = {}
        self._exits: dict[str, int] = {}
        self._open: set[str] = set()

    def reset(self) -> None:
        with self._cond:
            for counts in (self._in_flight, self._most, self._entered, self._exited, self._exits):
                counts.clear()
            self._open.clear()
            self._cond.notify_all()

    def pass_through(self, label: str, timeout: float) -> None:
        with self._cond:
            self._in_flight[label] = self._in_flight.get(label, 0) + 1
            self._most[label] = max(self._most.get(label, 0), self._in_flight[label])
            self._entered[label] = self._entered.get(label, 0) + 1
            self._cond.notify_all()
            let_out = self._cond.wait_for(lambda: label in self._open or self._exits.get(label, 0) > 0, timeout)
            if let_out and label not in self._open:
                self._exits[label] -= 1
            self._in_flight[label] -= 1
            self._exited[label] = self._exited.get(label, 0) + 1
            self._cond.notify_all()
        if not let_out:
            raise TimeoutError(f"no one let a {label!r} handler out within {timeout} s")

    def let_out(self, label: str, count: int = 1) -> None:
        with self._cond:
            self._exits[label] = self._exits.get(label, 0) + count
            self._cond.notify_all()

    def open(self, label: str) -> None:
        with self._cond:
            self._open.add(label)
            self._cond.notify_all()

    def in_flight(self, label: str) -> int:
        with self._cond:
            return self._in_flight.get(label, 0)

    def most_in_flight(self, label: str) -> int:
        with self._cond:
            return self._most.get(label, 0)

    def entered(self, label: str) -> int:
        with self._cond:
            return self._entered.get(label, 0)

    def exited(self, label: str) -> int:
        with self._cond:
            return self._exited.get(label, 0)


GATE = Gate()


@register("tests.gated")
def gated(ctx: HandlerContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Pass through ``GATE`` under ``payload["label"]``; return the job id and the label."""
    GATE.pass_through(payload["label"], payload.get("timeout", 30.0))
    return {"job_id": ctx.job_id, "label": payload["label"]}


# -- outcomes PostgreSQL cannot store (tests/test_worker_poison.py) -----------------------------------


class UnprintableError(Exception):
    """An exception whose message cannot be formatted: ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ of UnprintableError failed")


class NotTextError(Exception):
    """An exception whose ``__str__`` returns no text and whose ``__repr__`` raises."""

    def __str__(self) -> Any:
        return 42

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ of NotTextError failed")


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


POISONS: dict[str, Callable[[HandlerContext, dict[str, Any]], Any]] = {
    "surrogate_result": lambda ctx, p: {"a": "bad\udc80"},
    "nul_result": lambda ctx, p: {"a": ["fine", "bad\x00"]},
    "nul_key_result": lambda ctx, p: {"bad\x00key": 1},
    "big_result": lambda ctx, p: "x" * (p["bytes"] - 2),  # its JSON text is p["bytes"] bytes
    "unserializable_result": lambda ctx, p: {"a": object()},
    "nan_result": lambda ctx, p: [float("nan")],
    "deep_result": lambda ctx, p: _nested(101),
    "nul_error": lambda ctx, p: _raise(RuntimeError("bad\x00text")),
    "surrogate_error": lambda ctx, p: _raise(RuntimeError("bad\udc80text")),
    "unprintable_error": lambda ctx, p: _raise(UnprintableError("hidden")),
    "not_text_error": lambda ctx, p: _raise(NotTextError()),
    "bad_checkpoint": lambda ctx, p: ctx.checkpoint("stage", lambda: {"a": "bad\x00"}),
    "bad_checkpoint_name": lambda ctx, p: ctx.checkpoint("st\x00age", lambda: 1),
}


def _raise(exc: BaseException) -> Any:
    raise exc


@register("tests.poison")
def poison(ctx: HandlerContext, payload: dict[str, Any]) -> Any:
    """Return or raise what ``POISONS[payload["kind"]]`` does; ``good`` returns the payload."""
    CALLS.add((payload["kind"], ctx.attempt))
    if payload["kind"] == "good":
        return payload
    return POISONS[payload["kind"]](ctx, payload)


# -- handlers that raise outcomes (tests/test_outcomes*.py), in this process or a worker's ----------


def _outcome(payload: dict[str, Any]) -> BaseException:
    """The outcome ``payload`` names: ``{"kind": "snooze", "seconds": 1}``, ``{"kind": "fail", "reason": ...}``…"""
    from datetime import datetime, timedelta

    from django_workhorse.outcomes.values import Cancel, Fail, Retry, Snooze

    kind = payload["kind"]
    reason = payload.get("reason", "") + ("\x00" if payload.get("nul") else "")  # a payload cannot hold NUL
    if kind == "snooze":
        return Snooze(timedelta(seconds=payload["seconds"]))
    if kind == "snooze_until":
        return Snooze(until=datetime.fromisoformat(payload["until"]))
    if kind == "retry":
        return Retry(after=None if payload.get("seconds") is None else timedelta(seconds=payload["seconds"]))
    if kind == "cancel":
        return Cancel(reason)
    return Fail(reason)


@register("tests.outcome")
def raise_outcome(ctx: HandlerContext, payload: dict[str, Any]) -> Any:
    """Raise the outcome ``payload`` describes (built in the handler: a bad value fails the attempt)."""
    CALLS.add((payload["kind"], ctx.attempt))
    raise _outcome(payload)


@register("tests.outcome.snooze_times")
def snooze_times(ctx: HandlerContext, payload: dict[str, Any]) -> dict[str, int]:
    """Snooze for ``payload["ms"]`` ms until the job has snoozed ``payload["snoozes"]`` times, then return
    the attempt and the count (read from the job's row, which the worker wrote)."""
    from datetime import timedelta

    from django_workhorse.models import Job
    from django_workhorse.outcomes.values import Snooze

    snoozes = Job.objects.values_list("snoozes", flat=True).get(pk=ctx.job_id)
    if snoozes < payload["snoozes"]:
        raise Snooze(timedelta(milliseconds=payload.get("ms", 1)))
    return {"attempt": ctx.attempt, "snoozes": snoozes, "pid": os.getpid()}


@register("tests.outcome.snooze_breaker")
def snooze_with_breaker(payload: dict[str, Any]) -> Any:
    """Snooze and open the job's breaker, for a job that runs behind none: a failure of this job."""
    from datetime import timedelta

    from django_workhorse.outcomes.values import Snooze

    raise Snooze(timedelta(minutes=5), breaker=True)
