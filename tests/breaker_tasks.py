"""Handlers behind circuit breakers, and a fake provider they call: a real local HTTP server.

Imported by the breaker tests and by worker subprocesses (``tests/worker_main.py``). The provider
runs in the test process; handlers in any process reach it by the URL in their payload, so the
provider counts every call (every handler start) wherever the handler ran.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django_workhorse import Breaker, Snooze
from django_workhorse.tasks.decorator import task
from django_workhorse.tasks.retry import RetryPolicy
from django_workhorse.worker import HandlerContext

# Trips after 3 failures; a short cooldown so half-open comes quickly; a failed job retries only
# after an hour, so that only breaker holds and canaries bring jobs back within a test.
TRIP_AFTER = 3
PROBES = 2
LATER = RetryPolicy.fixed(timedelta(hours=1))
PROVIDER_BREAKER = Breaker(failures=TRIP_AFTER, within=timedelta(minutes=1), cooldown=timedelta(seconds=1), probes=1)
CANARY_BREAKER = Breaker(failures=TRIP_AFTER, within=timedelta(minutes=1), cooldown=timedelta(seconds=1), probes=PROBES)


class Provider:
    """A fake HTTP provider: answers 500 while ``failing`` (or for paths starting with one of
    ``failing_paths``), else 200; records each call (path, answered ok). While ``gate`` is clear
    a call waits for it (at most 60 s) before answering."""

    def __init__(self) -> None:
        self.failing = True
        self.failing_paths: tuple[str, ...] = ()
        self.calls: list[tuple[str, bool]] = []
        self.gate = threading.Event()
        self.gate.set()
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with provider._lock:
                    provider.calls.append((self.path, False))
                    index = len(provider.calls) - 1
                provider.gate.wait(60)
                with provider._lock:
                    failing = provider.failing or self.path.startswith(provider.failing_paths or ("\0",))
                    provider.calls[index] = (self.path, not failing)
                self.send_response(500 if failing else 200)
                self.end_headers()
                self.wfile.write(b"down" if failing else b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def count(self, prefix: str = "/") -> int:
        """Calls so far whose path starts with ``prefix``."""
        with self._lock:
            return sum(1 for path, _ in self.calls if path.startswith(prefix))

    def succeeded(self, path: str) -> int:
        """Calls of exactly ``path`` answered 200."""
        with self._lock:
            return sum(1 for called, ok in self.calls if called == path and ok)


@contextmanager
def provider() -> Iterator[Provider]:
    """Run a fake provider on a free local port for the block."""
    fake = Provider()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


def _call(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (a local test server)
            return str(response.read().decode())
    except urllib.error.HTTPError as exc:
        exc.close()
        raise RuntimeError(f"the provider answered {exc.code}") from None


@task(name="tests.breaker.provider", breaker=PROVIDER_BREAKER, max_attempts=5, retry_policy=LATER)
def call_provider(url: str, path: str = "/") -> str:
    """Call the provider (an HTTP 500 raises, a failed attempt)."""
    return _call(url + path)


@task(name="tests.breaker.canary", breaker=CANARY_BREAKER, max_attempts=5, retry_policy=LATER)
def call_provider_with_canaries(url: str, path: str = "/") -> str:
    return _call(url + path)


@task(name="tests.breaker.plain", max_attempts=5, retry_policy=LATER)
def call_without_breaker(url: str, path: str = "/") -> str:
    return _call(url + path)


# Opens after 2 failures and stays open for an hour: nothing comes back within a test by itself.
SLOW_BREAKER = Breaker(failures=2, within=timedelta(minutes=1), cooldown=timedelta(hours=1))


@task(name="tests.breaker.destination", breaker=SLOW_BREAKER, max_attempts=5, retry_policy=LATER)
def call_destination(url: str, path: str = "/") -> str:
    return _call(url + path)


@task(name="tests.breaker.quota", breaker=PROVIDER_BREAKER, max_attempts=5, retry_policy=LATER)
def quota_exhausted(ctx: HandlerContext, until: str) -> str:
    """Open the breaker until the quota resets, then fail the attempt."""
    ctx.open_breaker(until=datetime.fromisoformat(until))
    raise RuntimeError("quota exhausted")


@task(name="tests.breaker.snooze_quota", breaker=PROVIDER_BREAKER, max_attempts=5, retry_policy=LATER)
def snooze_until_the_quota_resets(until: str) -> str:
    """Snooze this job and open its breaker until the quota resets (Snooze(until=, breaker=True))."""
    raise Snooze(until=datetime.fromisoformat(until), breaker=True)


@task(name="tests.breaker.bad_quota", breaker=PROVIDER_BREAKER, max_attempts=5, retry_policy=LATER)
def open_with_a_naive_instant(ctx: HandlerContext) -> str:
    """Open the breaker with an instant that has no time zone: a readable failure of this job."""
    ctx.open_breaker(until=datetime(2999, 1, 1))  # noqa: DTZ001 (naive on purpose)
    return "unreachable"
