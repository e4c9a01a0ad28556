#!/usr/bin/env python
"""peerbench driver: the same workloads for every queue adapter.

Usage (run with the venv of the peer under test):
    python bench.py setup  --adapter procrastinate --dsn URI
    python bench.py run    --adapter procrastinate --dsn URI --rep 1 --out results.jsonl \
                           [--workloads W1,W2,W3,W4,W5] [--n 5000] [--samples 200] [--w3 c1,cN]
    python bench.py versions --adapter procrastinate --dsn URI
    python bench.py worker --adapter procrastinate --dsn URI --concurrency 8   (internal)

Workloads (N = --n, default 5000):
  W1  enqueue N jobs, one committed transaction each, one process      -> jobs/s
  W2  enqueue N jobs in batches of 500 (bulk API, or loop in one txn)  -> jobs/s
  W3  process N pre-enqueued no-op jobs with the peer's own worker, for each
      config in adapter.w3_configs (c1 = concurrency 1; cN = its natural higher
      concurrency); wall clock from worker GO to "no unfinished job" in the DB
      (polled every 25 ms)                                             -> jobs/s
  W4  idle worker; enqueue one "probe" job at a time after a random gap, 200
      samples (+5 warm-up): latency from enqueue commit returned to handler
      start                                                            -> p50/p95 ms
  W5  (a) enqueue the same dedup key N times -> jobs created (must be 1), replays/s
      (b) 8 producers race over the same 100 keys, each in its own shuffled
          order -> jobs created (must be 100), attempts/s
Each workload starts from an empty queue, after CHECKPOINT (and VACUUM ANALYZE
before W3/W4), so that a checkpoint or stale stats don't land inside a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import tempfile
import random
import select
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from adapter_base import PAYLOAD_JSON_BYTES, NotSupported, make_payload  # noqa: E402

BATCH = 500
RACE_PRODUCERS = 8
RACE_KEYS = 100
W3_POLL_S = 0.025
W3_TIMEOUT_S = 600
W4_WARMUP = 5


def load_adapter(name: str, dsn: str):
    mod = importlib.import_module(f"peer_{name}")
    return mod.ADAPTER(dsn)


# ---------------------------------------------------------------- helpers
def sql_scalar(dsn: str, sql: str):
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(sql).fetchone()[0]


def db_quiesce(dsn: str, vacuum: bool = False) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        if vacuum:
            c.execute("VACUUM ANALYZE")
        c.execute("CHECKPOINT")


class Bridge:
    """Calls client methods whether the adapter is sync or async."""

    def __init__(self, adapter):
        self.a = adapter
        self.loop = asyncio.new_event_loop() if adapter.is_async else None

    def call(self, fn, *args, **kw):
        r = fn(*args, **kw)
        if self.a.is_async:
            r = self.loop.run_until_complete(r)
        return r

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def close(self):
        if self.loop:
            self.loop.close()


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * p
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


# ---------------------------------------------------------------- workers
class WorkerSet:
    """P subprocesses `bench.py worker ...`, each READY then waiting for GO."""

    def __init__(self, adapter_name, dsn, procs, concurrency, logdir, tag, env_extra=None):
        self.procs = []
        self.logs = []
        env = dict(os.environ)
        env.update(env_extra or {})
        logdir.mkdir(parents=True, exist_ok=True)
        for k in range(procs):
            log = open(logdir / f"worker-{adapter_name}-{tag}-{k}.log", "w+b")
            p = subprocess.Popen(
                [sys.executable, str(HERE / "bench.py"), "worker", "--adapter", adapter_name,
                 "--dsn", dsn, "--concurrency", str(concurrency)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
            )
            self.procs.append(p)
            self.logs.append(log)

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        for p in self.procs:
            buf = b""
            while b"PEERBENCH-READY" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or p.poll() is not None:
                    raise RuntimeError(f"worker {p.pid} not ready: {self.tail()}")
                r, _, _ = select.select([p.stdout], [], [], min(left, 1.0))
                if r:
                    chunk = os.read(p.stdout.fileno(), 4096)
                    if not chunk:
                        raise RuntimeError(f"worker {p.pid} closed stdout: {self.tail()}")
                    buf += chunk

    def go(self):
        for p in self.procs:
            p.stdin.write(b"GO\n")
            p.stdin.flush()

    def alive(self):
        return all(p.poll() is None for p in self.procs)

    def tail(self, n=1500):
        out = []
        for log in self.logs:
            log.flush()
            log.seek(0)
            out.append(log.read().decode(errors="replace")[-n:])
        return "\n---\n".join(out)

    def stop(self, timeout=20):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()  # our own child, by pid
                p.wait()
        for log in self.logs:
            log.close()


# ---------------------------------------------------------------- workloads
def w1(adapter, br, client, n):
    payloads = [make_payload(i) for i in range(n)]
    if adapter.is_async:
        async def go():
            t0 = time.perf_counter()
            for p in payloads:
                await client.enqueue_one(p)
            return time.perf_counter() - t0
        dt = br.run(go())
    else:
        t0 = time.perf_counter()
        for p in payloads:
            client.enqueue_one(p)
        dt = time.perf_counter() - t0
    total = sql_scalar(adapter.dsn, adapter.total_jobs_sql)
    return {"jobs_per_s": n / dt, "wall_s": dt, "jobs_in_db": total, "ok": total == n}


def w2(adapter, br, client, n):
    if adapter.batch_mode is None:
        return {"unsupported": True}
    payloads = [make_payload(i) for i in range(n)]
    batches = [payloads[k:k + BATCH] for k in range(0, n, BATCH)]
    if adapter.is_async:
        async def go():
            t0 = time.perf_counter()
            for b in batches:
                await client.enqueue_batch(b)
            return time.perf_counter() - t0
        dt = br.run(go())
    else:
        t0 = time.perf_counter()
        for b in batches:
            client.enqueue_batch(b)
        dt = time.perf_counter() - t0
    total = sql_scalar(adapter.dsn, adapter.total_jobs_sql)
    return {"jobs_per_s": n / dt, "wall_s": dt, "jobs_in_db": total, "ok": total == n,
            "batch_mode": adapter.batch_mode}


def prefill(adapter, br, client, n):
    payloads = [make_payload(i) for i in range(n)]
    if adapter.batch_mode is None:
        for p in payloads:
            br.call(client.enqueue_one, p)
    else:
        for k in range(0, n, BATCH):
            br.call(client.enqueue_batch, payloads[k:k + BATCH])
    got = sql_scalar(adapter.dsn, adapter.unfinished_sql)
    if got != n:
        raise RuntimeError(f"prefill: {got} unfinished jobs, wanted {n}")


def w3(adapter, br, client, n, label, cfg, logdir):
    import psycopg

    adapter.reset()
    prefill(adapter, br, client, n)
    db_quiesce(adapter.dsn, vacuum=True)
    ws = WorkerSet(adapter.name, adapter.dsn, cfg["procs"], cfg["concurrency"], logdir, f"w3{label}")
    try:
        ws.wait_ready()
        with psycopg.connect(adapter.dsn, autocommit=True) as conn:
            t0 = time.monotonic()
            ws.go()
            t_first = rem_first = None
            while True:
                rem = conn.execute(adapter.unfinished_sql).fetchone()[0]
                now = time.monotonic()
                if t_first is None and rem < n:
                    t_first, rem_first = now, rem
                if rem == 0:
                    t_end = now
                    break
                if now - t0 > W3_TIMEOUT_S:
                    raise RuntimeError(f"W3 timeout, {rem} left: {ws.tail()}")
                if not ws.alive():
                    raise RuntimeError(f"W3 worker died, {rem} left: {ws.tail()}")
                time.sleep(W3_POLL_S)
    finally:
        ws.stop()
    wall = t_end - t0
    res = {"jobs_per_s": n / wall, "wall_s": wall, "first_done_s": t_first - t0,
           "procs": cfg["procs"], "concurrency": cfg["concurrency"], "desc": cfg.get("desc", "")}
    if t_end > t_first and rem_first:
        # throughput after the first completion was seen (excludes worker start-up)
        res["steady_jobs_per_s"] = rem_first / (t_end - t_first)
    if adapter.succeeded_sql:
        ok = sql_scalar(adapter.dsn, adapter.succeeded_sql)
        res["succeeded_in_db"] = ok
        res["ok"] = ok == n
    else:
        res["ok"] = True
    return res


def w4(adapter, br, client, samples, logdir, seed):
    adapter.reset()
    db_quiesce(adapter.dsn, vacuum=True)
    rng = random.Random(seed)
    path = os.path.join(tempfile.gettempdir(), f"peerbench-probe-{os.getpid()}.sock")
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    cfg = adapter.w4_config
    ws = WorkerSet(adapter.name, adapter.dsn, cfg["procs"], cfg["concurrency"], logdir, "w4",
                   env_extra={"PEERBENCH_PROBE_SOCK": path})
    gap_hi = max(0.1, (adapter.poll_interval_s or 0) + 0.02)
    lat, lat_call, missing = [], [], 0
    try:
        ws.wait_ready()
        ws.go()
        for k in range(W4_WARMUP + samples):
            if k:
                time.sleep(rng.uniform(0.02, gap_hi))
            i = 1_000_000 + k
            t0 = time.monotonic()
            br.call(client.enqueue_one, make_payload(i), task="probe")
            t1 = time.monotonic()
            deadline = t1 + (60 if k == 0 else 15)
            th = None
            while th is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sock.settimeout(left)
                try:
                    msg = sock.recv(256).decode().split()
                except socket.timeout:
                    break
                if int(msg[0]) == i:
                    th = float(msg[1])
            if th is None:
                missing += 1
                if not ws.alive():
                    raise RuntimeError(f"W4 worker died: {ws.tail()}")
                continue
            if k >= W4_WARMUP:
                lat.append((th - t1) * 1000)
                lat_call.append((th - t0) * 1000)
    finally:
        ws.stop()
        sock.close()
        os.unlink(path)
    return {"p50_ms": pct(lat, .5), "p95_ms": pct(lat, .95), "p99_ms": pct(lat, .99),
            "max_ms": max(lat) if lat else None, "mean_ms": statistics.fmean(lat) if lat else None,
            "p50_from_call_ms": pct(lat_call, .5), "samples": len(lat), "missing": missing,
            "gap_s": [0.02, gap_hi], "ok": missing == 0 and len(lat) == samples}


def w5(adapter, br, client, n, seed):
    if adapter.dedup_mode is None:
        return {"unsupported": True}
    out = {"dedup_mode": adapter.dedup_mode}
    # (a) replays of one key
    adapter.reset()
    db_quiesce(adapter.dsn)
    payloads = [make_payload(i) for i in range(n)]
    if adapter.is_async:
        async def go():
            rs = []
            t0 = time.perf_counter()
            for p in payloads:
                rs.append(await client.enqueue_unique("w5-key", p))
            return rs, time.perf_counter() - t0
        rs, dt = br.run(go())
    else:
        rs = []
        t0 = time.perf_counter()
        for p in payloads:
            rs.append(client.enqueue_unique("w5-key", p))
        dt = time.perf_counter() - t0
    # enqueue_unique returns True (created) / False (deduped) / None (peer can't tell)
    created = None if any(r is None for r in rs) else sum(bool(r) for r in rs)
    total = sql_scalar(adapter.dsn, adapter.total_jobs_sql)
    out.update({"replays_per_s": n / dt, "replay_created": created, "replay_jobs_in_db": total,
                "replay_ok": total == 1 and created in (1, None)})
    # (b) 8 producers racing over 100 keys
    adapter.reset()
    db_quiesce(adapter.dsn)
    keys = [f"race-{k}" for k in range(RACE_KEYS)]
    orders = []
    for j in range(RACE_PRODUCERS):
        o = keys[:]
        random.Random(seed * 100 + j).shuffle(o)
        orders.append(o)
    errors = []
    created_tot = [0]
    if adapter.is_async:
        async def race():
            clients = [await adapter.open_client() for _ in range(RACE_PRODUCERS)]
            start = asyncio.Event()

            async def producer(j):
                await start.wait()
                c = 0
                for key in orders[j]:
                    try:
                        r = await clients[j].enqueue_unique(key, make_payload(j))
                        c = None if (r is None or c is None) else c + bool(r)
                    except Exception as e:  # noqa: BLE001
                        errors.append(repr(e)[:200])
                return c
            tasks = [asyncio.ensure_future(producer(j)) for j in range(RACE_PRODUCERS)]
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            start.set()
            res = await asyncio.gather(*tasks)
            dt = time.perf_counter() - t0
            for c in clients:
                await c.close()
            return (None if any(r is None for r in res) else sum(res)), dt
        created_tot[0], dt = br.run(race())
    else:
        barrier = threading.Barrier(RACE_PRODUCERS + 1)
        lock = threading.Lock()

        def producer(j):
            c = adapter.open_client()
            made = 0
            try:
                barrier.wait()
                for key in orders[j]:
                    try:
                        r = c.enqueue_unique(key, make_payload(j))
                        made = None if (r is None or made is None) else made + bool(r)
                    except Exception as e:  # noqa: BLE001
                        errors.append(repr(e)[:200])
            finally:
                c.close()
                with lock:
                    created_tot[0] = None if (made is None or created_tot[0] is None) \
                        else created_tot[0] + made
        ths = [threading.Thread(target=producer, args=(j,)) for j in range(RACE_PRODUCERS)]
        for t in ths:
            t.start()
        time.sleep(0.2)  # let every producer open its connection
        t0 = time.perf_counter()
        barrier.wait()
        for t in ths:
            t.join()
        dt = time.perf_counter() - t0
    total = sql_scalar(adapter.dsn, adapter.total_jobs_sql)
    attempts = RACE_PRODUCERS * RACE_KEYS
    out.update({"race_attempts_per_s": attempts / dt, "race_created": created_tot[0],
                "race_jobs_in_db": total, "race_errors": len(errors),
                "race_error_sample": errors[:3],
                "race_ok": total == RACE_KEYS and created_tot[0] in (RACE_KEYS, None) and not errors})
    out["ok"] = out["replay_ok"] and out["race_ok"]
    return out


# ---------------------------------------------------------------- commands
def cmd_run(a):
    adapter = load_adapter(a.adapter, a.dsn)
    wl = [w.strip().upper() for w in a.workloads.split(",") if w.strip()]
    logdir = Path(a.logdir)
    br = Bridge(adapter)
    client = br.call(adapter.open_client)
    label = a.label or adapter.name

    def emit(workload, variant, res):
        rec = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S"), "peer": label, "adapter": adapter.name,
               "rep": a.rep, "n": a.n, "workload": workload, "variant": variant,
               "loadavg_1m": os.getloadavg()[0], **res}
        line = json.dumps(rec)
        print(line, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(line + "\n")

    def guarded(workload, variant, fn):
        try:
            emit(workload, variant, fn())
        except Exception as e:  # noqa: BLE001  (one failing workload must not stop the run)
            import traceback
            traceback.print_exc()
            emit(workload, variant, {"error": repr(e)[:2000], "ok": False})

    try:
        if "W1" in wl:
            def f():
                adapter.reset(); db_quiesce(adapter.dsn)
                return w1(adapter, br, client, a.n)
            guarded("W1", "", f)
        if "W2" in wl:
            def f():
                adapter.reset(); db_quiesce(adapter.dsn)
                return w2(adapter, br, client, a.n)
            guarded("W2", adapter.batch_mode or "", f)
        if "W3" in wl:
            for cl, cfg in adapter.w3_configs.items():
                if a.w3 and cl not in a.w3.split(","):
                    continue
                guarded("W3", cl, lambda cl=cl, cfg=cfg: w3(adapter, br, client, a.n, cl, cfg, logdir))
        if "W4" in wl:
            guarded("W4", "", lambda: w4(adapter, br, client, a.samples, logdir, seed=a.rep))
        if "W5" in wl:
            guarded("W5", "", lambda: w5(adapter, br, client, a.n, seed=a.rep))
    finally:
        br.call(client.close)
        adapter.reset()
        br.close()


def cmd_worker(a):
    adapter = load_adapter(a.adapter, a.dsn)
    adapter.prepare_worker(a.concurrency)
    sys.stdout.write("PEERBENCH-READY\n")
    sys.stdout.flush()
    os.dup2(2, 1)  # anything the peer prints later goes to the log, not the pipe
    line = sys.stdin.readline()
    if line.strip() != "GO":
        return
    adapter.run_worker(a.concurrency)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["setup", "run", "worker", "versions"])
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--label", default="", help="peer label in results (default: adapter name)")
    ap.add_argument("--n", type=int, default=int(os.environ.get("PEERBENCH_N", 5000)))
    ap.add_argument("--samples", type=int, default=int(os.environ.get("PEERBENCH_SAMPLES", 200)))
    ap.add_argument("--workloads", default="W1,W2,W3,W4,W5")
    ap.add_argument("--w3", default="", help="comma list of W3 config labels (default: all)")
    ap.add_argument("--rep", type=int, default=1)
    ap.add_argument("--out", default="")
    ap.add_argument("--logdir", default=os.path.join(tempfile.gettempdir(), "peerbench", "logs"))
    ap.add_argument("--concurrency", type=int, default=1)
    a = ap.parse_args(argv)
    if a.cmd == "setup":
        load_adapter(a.adapter, a.dsn).setup()
    elif a.cmd == "versions":
        ad = load_adapter(a.adapter, a.dsn)
        print(json.dumps({"adapter": ad.name, "python": sys.version.split()[0],
                          "payload_bytes": PAYLOAD_JSON_BYTES, "notes": ad.notes,
                          "batch_mode": ad.batch_mode, "dedup_mode": ad.dedup_mode,
                          "w3_configs": ad.w3_configs, "w4_config": ad.w4_config,
                          "poll_interval_s": ad.poll_interval_s, **ad.versions()}))
    elif a.cmd == "worker":
        cmd_worker(a)
    else:
        cmd_run(a)


if __name__ == "__main__":
    main()
