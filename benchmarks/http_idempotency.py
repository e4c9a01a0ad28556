"""What ``@idempotent`` costs a view, through a real HTTP server, in one run.

    python benchmarks/http_idempotency.py [--requests 1000] [--rounds 7] [--workers 1] [--json out.json]

Starts gunicorn (sync-free ``gthread`` workers, keep-alive) on a loopback port with
``benchmarks.http_views``: a view that reads a JSON body, creates a row and enqueues a job in one
transaction, undecorated (``/plain/``) and under ``@idempotent`` (``/keyed/``). One client on one
keep-alive connection sends, in each round and in turn, ``--requests`` requests of: the plain view;
the keyed view with a new key each (the view runs); the keyed view with keys already answered
(replays: the view does not run). Medians of the rounds, in requests per second; the ratios are of
the same round.

Uses DATABASE_URL, or the embedded PostgreSQL (database ``workhorse_bench``).
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

ROOT = Path(__file__).resolve().parent.parent
BODY = json.dumps({"product": "mug", "quantity": 2}).encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(port: int, workers: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchmarks.http_settings", "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable, "-m", "gunicorn", "django.core.wsgi:get_wsgi_application()",
        "--bind", f"127.0.0.1:{port}", "--workers", str(workers), "--worker-class", "gthread",
        "--threads", "4", "--keep-alive", "30", "--log-level", "warning",
    ]  # fmt: skip
    return subprocess.Popen(command, cwd=ROOT, env=env)


class Client:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def post(self, path: str, key: str | None = None) -> tuple[int, bool]:
        headers = {"Content-Type": "application/json"}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workers", type=int, default=1, help="gunicorn worker processes")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.http_settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from common import environment  # noqa: E402 (after Django is set up)

    port = free_port()
    server = start_server(port, args.workers)
    try:
        wait_until_up(port, server)
        client = Client(port)
        n = args.requests
        figures: dict[str, list[float]] = {"plain": [], "new_key": [], "replay": []}
        measure(client, 200, "/plain/", None, expect_replay=False)  # warm up both views
        warm = [uuid.uuid4().hex for _ in range(200)]
        measure(client, 200, "/keyed/", warm, expect_replay=False)
        for _ in range(args.rounds):
            keys = [uuid.uuid4().hex for _ in range(n)]
            figures["plain"].append(measure(client, n, "/plain/", None, expect_replay=False))
            figures["new_key"].append(measure(client, n, "/keyed/", keys, expect_replay=False))
            figures["replay"].append(measure(client, n, "/keyed/", keys, expect_replay=True))
    finally:
        server.terminate()
        server.wait(30)
    ratios = {
        "new_key_cost_over_plain": [p / k - 1 for p, k in zip(figures["plain"], figures["new_key"], strict=True)],
        "replay_over_plain": [r / p for r, p in zip(figures["replay"], figures["plain"], strict=True)],
    }
    env = environment()
    print("\n" + json.dumps(env))
    print(f"\n### @idempotent through gunicorn ({args.workers} worker(s), one keep-alive client; requests/s)\n")
    print("| view | median | [min-max] |\n|---|---|---|")
    labels = {"plain": "undecorated", "new_key": "@idempotent, new key (view runs)", "replay": "@idempotent, replay"}
    for name, values in figures.items():
        print(f"| {labels[name]} | **{statistics.median(values):,.0f}** | [{min(values):,.0f}-{max(values):,.0f}] |")
    cost, speed = (statistics.median(v) for v in ratios.values())
    print(f"\nA new key costs {cost:+.1%} over the undecorated view (target ≤ +15%); a replay runs at {speed:.2f}×")
    print("the undecorated view (target > 1). Ratios: medians of the per-round ratios.")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"environment": env, "requests_per_s": figures, "ratios": ratios}, indent=2)
        )


if __name__ == "__main__":
    main()
