"""What one enqueue costs, layer by layer, beside the round-trip floor of the drivers, in one run.

    python benchmarks/replay_floor.py [--n 2000] [--rounds 7] [--asyncpg-python PATH] [--json out.json]

A replay (a repeat of a live key) writes nothing and commits nothing: one round trip bounds it; an
unkeyed enqueue in autocommit is one INSERT and its commit. Each round measures, in turn, ``n`` calls
of: ``SELECT 1`` and the binding lookup on a raw psycopg connection (prepared); for a replay and for
an unkeyed enqueue, the statement ``enqueue()`` sends, run on that connection with parameters built
once (the floor), the same through ``sql.connection.execute`` (our path to the driver), ``prepare``
alone (validation, canonical JSON, digests: no database), and ``enqueue()`` itself. With ``--asyncpg-python`` (a Python that has asyncpg, such as the
peer benchmark's pgqueuer venv), ``SELECT 1`` and the same lookup through asyncpg run in a
subprocess in the same round. Medians of the rounds, in microseconds per call.

Uses DATABASE_URL, or the embedded PostgreSQL (database ``workhorse_bench``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

from common import PAYLOAD, dump, environment, setup_django

ASYNCPG_PROBE = """
import asyncio, json, sys, time, asyncpg
async def main(params, n, scope, key_hash):
    conn = await asyncpg.connect(**json.loads(params))
    lookup = "SELECT job_id FROM workhorse_binding WHERE scope = $1 AND key_hash = $2"
    for label, query, args in (("select1", "SELECT 1", ()), ("lookup", lookup, (scope, key_hash))):
        for _ in range(200):
            await conn.fetchrow(query, *args)
        start = time.perf_counter()
        for _ in range(n):
            await conn.fetchrow(query, *args)
        print(label, (time.perf_counter() - start) / n * 1e6)
    await conn.close()
asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], bytes.fromhex(sys.argv[4])))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="calls per measurement")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--asyncpg-python", default=None, help="a Python with asyncpg, for the asyncpg floor")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    setup_django()

    import psycopg
    from django.db import connection

    from django_workhorse import Idempotency, enqueue_with_result, register
    from django_workhorse.conf import app_settings
    from django_workhorse.enqueueing.validation import prepare, resolve_options
    from django_workhorse.sql import enqueue as enqueue_sql
    from django_workhorse.sql.connection import execute
    from django_workhorse.sql.enqueue_rows import function_params, one_request_params

    register("noop", lambda payload: None)
    key = Idempotency(uuid.uuid4().hex)
    enqueue_with_result("noop", PAYLOAD, idempotency=key)
    request = prepare("noop", PAYLOAD, resolve_options(None, {"idempotency": key}))
    assert request.binding is not None
    channel = app_settings.NOTIFY_CHANNEL
    params = function_params(0, request, channel)
    unkeyed = prepare("noop", PAYLOAD, resolve_options(None, {}))
    unkeyed_params = one_request_params((0, unkeyed), channel)
    lookup = "SELECT job_id FROM workhorse_binding WHERE scope = %s AND key_hash = %s"
    lookup_args = (request.binding.scope, request.binding.key_hash)
    connection.ensure_connection()
    raw = connection.connection
    n = args.n

    def per_call(call: Callable[[], object]) -> float:
        for _ in range(200):
            call()
        start = time.perf_counter()
        for _ in range(n):
            call()
        return (time.perf_counter() - start) / n * 1e6

    def on_raw(query: str, query_args: object) -> Callable[[], object]:
        cursor = psycopg.Cursor(raw)
        return lambda: cursor.execute(query, query_args, prepare=True).fetchall()  # type: ignore[arg-type]

    variants: dict[str, Callable[[], float]] = {
        "psycopg: SELECT 1 (round-trip floor)": lambda: per_call(on_raw("SELECT 1", None)),
        "psycopg: the binding lookup alone": lambda: per_call(on_raw(lookup, lookup_args)),
        "psycopg: the enqueue function (a replay)": lambda: per_call(on_raw(enqueue_sql.ENQUEUE_ONE, params)),
        "sql.connection.execute: the enqueue function": lambda: per_call(
            lambda: execute(connection.alias, enqueue_sql.ENQUEUE_ONE, params)
        ),
        "enqueue() replay, whole call": lambda: per_call(
            lambda: enqueue_with_result("noop", PAYLOAD, idempotency=Idempotency(key.key))
        ),
        "prepare() of the replay alone (no database)": lambda: per_call(
            lambda: prepare("noop", PAYLOAD, resolve_options(None, {"idempotency": Idempotency(key.key)}))
        ),
        "psycopg: the unkeyed INSERT (floor of W1)": lambda: per_call(
            on_raw(enqueue_sql.ENQUEUE_ONE_UNKEYED, unkeyed_params)
        ),
        "sql.connection.execute: the unkeyed INSERT": lambda: per_call(
            lambda: execute(connection.alias, enqueue_sql.ENQUEUE_ONE_UNKEYED, unkeyed_params)
        ),
        "enqueue() unkeyed, whole call": lambda: per_call(lambda: enqueue_with_result("noop", PAYLOAD)),
        "prepare() unkeyed alone (no database)": lambda: per_call(
            lambda: prepare("noop", PAYLOAD, resolve_options(None, {}))
        ),
    }
    figures: dict[str, list[float]] = {label: [] for label in variants}
    if args.asyncpg_python:
        figures["asyncpg: SELECT 1"] = []
        figures["asyncpg: the binding lookup alone"] = []
    settings = connection.get_connection_params()
    names = {"host": "host", "port": "port", "dbname": "database", "user": "user", "password": "password"}
    asyncpg_params = json.dumps({names[k]: v for k, v in settings.items() if k in names and v})
    for _ in range(args.rounds):
        for label, measure in variants.items():
            figures[label].append(measure())
        if args.asyncpg_python:
            probe = [args.asyncpg_python, "-c", ASYNCPG_PROBE, asyncpg_params, str(n), lookup_args[0]]
            out = subprocess.run([*probe, lookup_args[1].hex()], capture_output=True, text=True, check=True).stdout
            values = dict(line.split() for line in out.splitlines())
            figures["asyncpg: SELECT 1"].append(float(values["select1"]))
            figures["asyncpg: the binding lookup alone"].append(float(values["lookup"]))

    print("\n" + json.dumps(environment()))
    print("\n### One enqueue, layer by layer (µs per call, median of rounds)\n")
    print("| layer | median | [min-max] |\n|---|---|---|")
    for label, values in figures.items():
        print(f"| {label} | **{statistics.median(values):,.0f}** | [{min(values):,.0f}-{max(values):,.0f}] |")
    dump(args.json, {"environment": environment(), "us_per_call": figures})
    sys.exit(0)


if __name__ == "__main__":
    main()
