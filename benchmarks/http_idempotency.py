"""What ``@idempotent`` costs a view, through a real HTTP server, in one run.

    python benchmarks/http_idempotency.py [--requests 100] [--rounds 60] [--workers 1] [--json out.json]

Starts gunicorn (``gthread`` workers, keep-alive) on a loopback port with ``benchmarks.http_views``:
a view that reads a JSON body, creates a row and enqueues a job in one transaction, undecorated
(``/plain/``) and under ``@idempotent`` (``/keyed/``). One client on one keep-alive connection
sends, in each round and in turn, ``--requests`` requests of: the plain view; the keyed view with
a new key each (the view runs); the keyed view with keys already answered (replays: the view does
not run); every other round the plain view comes last instead of first. Many short rounds, so
that a pair of neighbouring measurements sees the same machine. Two stacks, each its own server, one after the other in the same run: ``bare`` (no
middleware, no user) and ``project`` (``startproject``'s middleware, and a logged-in user's session
cookie on every request). Medians of the rounds, in requests per second; the ratios are of the
same round, and their median and quartiles are printed.

Uses DATABASE_URL, or the embedded PostgreSQL (database ``workhorse_bench``). With ``--pgbouncer``
the server reaches it through Debian's ``pgbouncer`` in transaction pooling mode (prepared
statements off): a hop more on every round trip, as a pooler or a network puts there.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BODY = json.dumps({"product": "mug", "quantity": 2}).encode()


def start_pgbouncer() -> Any:
    """A PgBouncer in transaction pooling mode before the benchmark's database (the tests' harness)."""
    from django.db import connection

    from tests.pgbouncer import PgBouncer, binary

    executable = binary()
    if executable is None:
        raise SystemExit("--pgbouncer: no pgbouncer on PATH (apt-get install pgbouncer)")
    database = connection.settings_dict
    pooler = PgBouncer.start(executable, database=database)
    pooler.database, pooler.user = database["NAME"], database["USER"] or "postgres"
    return pooler


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


STACKS = ("bare", "project")


def start_server(port: int, workers: int, stack: str, database_url: str | None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchmarks.http_settings", "PYTHONPATH": str(ROOT)}
    env.pop("HTTP_BENCH_STACK", None)
    if stack == "project":
        env["HTTP_BENCH_STACK"] = "project"
    if database_url is not None:  # through the pooler, which keeps no prepared statements
        env["DATABASE_URL"] = database_url
        env["HTTP_BENCH_PREPARED_STATEMENTS"] = "0"
    command = [
        sys.executable, "-m", "gunicorn", "django.core.wsgi:get_wsgi_application()",
        "--bind", f"127.0.0.1:{port}", "--workers", str(workers), "--worker-class", "gthread",
        "--threads", "4", "--keep-alive", "30", "--log-level", "warning",
    ]  # fmt: skip
    return subprocess.Popen(command, cwd=ROOT, env=env)


class Client:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, port: int, cookie: str | None = None) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.cookie = cookie

    def post(self, path: str, key: str | None = None) -> tuple[int, bool]:
        headers = {"Content-Type": "application/json"}
        if self.cookie is not None:
            headers["Cookie"] = self.cookie
        if key is not None:
            headers["Idempotency-Key"] = f'"{key}"'
        self.conn.request("POST", path, body=BODY, headers=headers)
        response = self.conn.getresponse()
        response.read()
        return response.status, response.getheader("Idempotent-Replayed") == "true"


def wait_until_up(port: int, server: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"gunicorn exited with {server.returncode}")
        try:
            Client(port).post("/plain/")
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("gunicorn did not answer in time")


def measure(client: Client, n: int, path: str, keys: list[str] | None, *, expect_replay: bool) -> float:
    start = time.perf_counter()
    for i in range(n):
        status, replayed = client.post(path, None if keys is None else keys[i])
        if status != 201 or replayed != expect_replay:
            raise SystemExit(f"{path}: got {status}, replayed={replayed}")
    return n / (time.perf_counter() - start)


def session_cookie() -> str:
    """A logged-in user's session cookie (the user is created once)."""
    from django.contrib.auth import get_user_model
    from django.contrib.sessions.backends.db import SessionStore

    user, _ = get_user_model().objects.get_or_create(username="http-bench")
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.save()
    return f"sessionid={session.session_key}"


Figures = dict[str, list[float]]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """The median of ``values``, and their first and third quartiles."""
    low, median, high = statistics.quantiles(values, n=4)
    return median, low, high


def run_stack(stack: str, args: argparse.Namespace, database_url: str | None) -> tuple[Figures, Figures]:
    """Serve one stack and measure its three workloads, interleaved over the rounds."""
    port = free_port()
    server = start_server(port, args.workers, stack, database_url)
    try:
        wait_until_up(port, server)
        client = Client(port, session_cookie() if stack == "project" else None)
        n = args.requests
        figures: Figures = {"plain": [], "new_key": [], "replay": []}
        measure(client, 200, "/plain/", None, expect_replay=False)  # warm up both views
        measure(client, 200, "/keyed/", [uuid.uuid4().hex for _ in range(200)], expect_replay=False)
        for round_number in range(args.rounds):
            keys = [uuid.uuid4().hex for _ in range(n)]
            plain_first = round_number % 2 == 0  # alternate, so neither view always follows the other
            if plain_first:
                figures["plain"].append(measure(client, n, "/plain/", None, expect_replay=False))
            figures["new_key"].append(measure(client, n, "/keyed/", keys, expect_replay=False))
            figures["replay"].append(measure(client, n, "/keyed/", keys, expect_replay=True))
            if not plain_first:
                figures["plain"].append(measure(client, n, "/plain/", None, expect_replay=False))
    finally:
        server.terminate()
        server.wait(30)
    ratios = {
        "new_key_cost_over_plain": [p / k - 1 for p, k in zip(figures["plain"], figures["new_key"], strict=True)],
        "replay_over_plain": [r / p for r, p in zip(figures["replay"], figures["plain"], strict=True)],
    }
    return figures, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--workers", type=int, default=1, help="gunicorn worker processes")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--pgbouncer", action="store_true", help="serve through Debian's pgbouncer (transaction pooling), a hop more"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.http_settings"
    os.environ["HTTP_BENCH_STACK"] = "project"  # this process migrates the tables of both stacks
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from common import environment  # noqa: E402 (after Django is set up)

    pooler = start_pgbouncer() if args.pgbouncer else None
    try:
        database_url = None if pooler is None else pooler.url(pooler.database, pooler.user)
        results = {stack: run_stack(stack, args, database_url) for stack in STACKS}
    finally:
        if pooler is not None:
            pooler.stop()
    env = {**environment(), "through": "pgbouncer, transaction pooling" if pooler else "direct"}
    print("\n" + json.dumps(env))
    labels = {"plain": "undecorated", "new_key": "@idempotent, new key (view runs)", "replay": "@idempotent, replay"}
    for stack, (figures, ratios) in results.items():
        print(f"\n### {stack} stack: gunicorn, {args.workers} worker(s), one keep-alive client (requests/s)\n")
        print("| view | median | [min-max] |\n|---|---|---|")
        for name, values in figures.items():
            print(
                f"| {labels[name]} | **{statistics.median(values):,.0f}** | [{min(values):,.0f}-{max(values):,.0f}] |"
            )
        (cost, cost_low, cost_high), (speed, speed_low, speed_high) = (quartiles(v) for v in ratios.values())
        print(
            f"\nA new key costs {cost:+.1%} [{cost_low:+.1%} to {cost_high:+.1%}] over the undecorated view "
            f"(target ≤ +15%);\na replay runs at {speed:.2f}× [{speed_low:.2f}-{speed_high:.2f}] the undecorated "
            "view (target > 1).\nRatios: medians of the per-round ratios [their quartiles]."
        )
    if args.json:
        stacks = {stack: {"requests_per_s": f, "ratios": r} for stack, (f, r) in results.items()}
        Path(args.json).write_text(json.dumps({"environment": env, **stacks}, indent=2))


if __name__ == "__main__":
    main()
