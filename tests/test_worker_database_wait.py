"""Workers whose database is unreachable wait for it, and say how they are (real processes, real PostgreSQL).

The database goes down behind a TCP proxy (``tests/database_proxy.py``) in front of the test
database: the shared server itself never stops. The workers are ``tests/worker_main.py`` (with the
test handlers) or ``manage.py`` (for the exit statuses and messages a supervisor sees).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_workhorse import enqueue
from django_workhorse.models import Job, JobEvent, JobStatus, WorkerRecord
from django_workhorse.worker.database_wait import BACKOFF_CAP, Backoff
from tests.database_proxy import DatabaseProxy
from tests.processes import ROOT, WorkerProcess, subprocess_database_url, worker_spawner
from tests.worker_tasks import wait_for

WORKER_MAIN = ROOT / "tests" / "worker_main.py"
MANAGE = ROOT / "manage.py"
# The scenario: the database is down for 20 s before and during the worker's start.
DOWN_FOR = 20.0
UNREACHABLE = re.compile(r"Database unreachable alias=default attempt=(\d+) ")


@pytest.fixture
def proxy() -> Iterator[DatabaseProxy]:
    proxy = DatabaseProxy(connection.settings_dict)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def spawn_through(proxy: DatabaseProxy, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``tests/worker_main.py`` reaching the database through ``proxy`` (a backoff capped at 1 s)."""
    env = {"DATABASE_URL": proxy.url(), "WORKHORSE_TEST_DB_BACKOFF_CAP": "1"}
    command = [sys.executable, str(WORKER_MAIN), "--poll-interval", "0.05", "--listen-database", "none"]
    with worker_spawner(tmp_path, command, env=env) as start:
        yield start


def probe(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError:  # nothing serves the port (yet)
        return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def attempts(output: str) -> list[int]:
    return [int(n) for n in UNREACHABLE.findall(output)]


def manage(*argv: str, database_url: str) -> subprocess.Popen[str]:
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.Popen(
        [sys.executable, str(MANAGE), *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_backoff_doubles_from_half_a_second_to_its_cap_with_full_jitter():
    backoff = Backoff()
    assert [backoff.ceiling(step) for step in range(8)] == [0.5, 1, 2, 4, 8, 16, BACKOFF_CAP, BACKOFF_CAP]
    assert backoff.ceiling(10**6) == BACKOFF_CAP
    assert all(0 <= backoff.delay(step) <= backoff.ceiling(step) for step in range(12) for _ in range(50))


@pytest.mark.django_db(transaction=True)
def test_a_worker_started_while_the_database_is_down_waits_then_runs_every_job(proxy, spawn_through, tmp_path):
    job_ids = [enqueue("tests.record", {"n": n}, queue="dbwait") for n in range(20)]
    health_file = tmp_path / "alive"
    port = free_port()
    began = time.monotonic()
    worker = spawn_through(
        "--queues", "dbwait", "--burst", "--lease", "3",
        "--health-file", str(health_file), "--health-port", str(port),
    )  # fmt: skip

    wait_for(lambda: len(attempts(worker.output())) >= 2, 30, what="two failed attempts logged")
    assert worker.popen.poll() is None, worker.output()
    wait_for(lambda: probe(port, "/live") == 200, 30, what="/live answering 200 while waiting")
    assert probe(port, "/ready") == 503
    first_touch = wait_for(lambda: health_file.exists() and health_file.stat().st_mtime_ns, 30, what="the health file")
    wait_for(lambda: health_file.stat().st_mtime_ns > first_touch, 30, what="the health file touched again")
    # The scenario itself, not a synchronisation: the database stays down this long.
    threading.Event().wait(max(DOWN_FOR - (time.monotonic() - began), 0))
    assert worker.popen.poll() is None, worker.output()
    proxy.up()

    assert worker.wait(60) == 0, worker.output()
    output = worker.output()
    steps = attempts(output)
    assert steps == list(range(1, len(steps) + 1))  # one line per backoff step, each step once
    assert len(steps) >= 5
    assert "Traceback" not in output
    assert "Database answers again alias=default" in output
    jobs = Job.objects.filter(pk__in=job_ids)
    assert sorted(jobs.values_list("status", "attempt").distinct()) == [(JobStatus.SUCCEEDED, 1)]
    assert JobEvent.objects.filter(job_id__in=job_ids, kind="claimed").count() == len(job_ids)


@pytest.mark.django_db(transaction=True)
def test_a_running_worker_waits_out_an_outage_and_its_health_says_so(proxy, spawn_through):
    proxy.up()
    port = free_port()
    worker = spawn_through("--queues", "dbwait-run", "--lease", "3", "--health-port", str(port))
    wait_for(lambda: probe(port, "/ready") == 200, 60, what="/ready answering 200")
    assert probe(port, "/live") == 200
    assert probe(port, "/metrics") == 404
    before = enqueue("tests.record", "before", queue="dbwait-run")
    wait_for(lambda: Job.objects.get(pk=before).status == JobStatus.SUCCEEDED, 60, what="the job before the outage")

    proxy.down()
    wait_for(lambda: attempts(worker.output()), 30, what="the worker to notice the outage")
    wait_for(lambda: probe(port, "/ready") == 503, 30, what="/ready answering 503")
    during = enqueue("tests.record", "during", queue="dbwait-run")
    wait_for(lambda: len(attempts(worker.output())) >= 3, 30, what="three failed attempts logged")
    assert probe(port, "/live") == 200
    assert worker.popen.poll() is None, worker.output()

    proxy.up()
    wait_for(lambda: Job.objects.get(pk=during).status == JobStatus.SUCCEEDED, 60, what="the job of the outage")
    wait_for(lambda: probe(port, "/ready") == 200, 30, what="/ready answering 200 again")
    # A long outage lets maintenance forget the worker as stale: its next heartbeat records it again.
    WorkerRecord.objects.all().delete()
    wait_for(lambda: WorkerRecord.objects.filter(pid=worker.pid).exists(), 30, what="the worker recorded again")
    worker.popen.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    assert Job.objects.get(pk=during).attempt == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("command", ["workhorse_worker", "workhorse_scheduler"])
def test_max_db_wait_gives_up_with_one_line_and_status_1(proxy, command):
    done = manage(command, "--max-db-wait", "2", database_url=proxy.url())
    output, _ = done.communicate(timeout=120)

    assert done.returncode == 1, output
    lines = output.strip().splitlines()
    assert re.fullmatch(
        r"CommandError: database 'default' did not answer for 2\.\d s \(max_db_wait 2 s\); giving up: .+", lines[-1]
    ), output
    assert sum("did not answer" in line for line in lines) == 1
    assert "Traceback" not in output
    steps = attempts(output)
    assert steps == list(range(1, len(steps) + 1)) and steps, output


@pytest.mark.django_db(transaction=True)
def test_bad_health_and_wait_options_exit_2_before_anything_starts(tmp_path):
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    missing = tmp_path / "missing" / "alive"
    cases = {
        ("--health-port", "0"): "argument --health-port: must be an integer in 1..65535",
        ("--health-port", "65536"): "argument --health-port: must be an integer in 1..65535",
        ("--health-port", "web"): "argument --health-port: must be an integer in 1..65535",
        ("--health-port", str(port)): f"CommandError: --health-port: cannot serve on 127.0.0.1:{port}: ",
        ("--health-file", str(missing)): f"argument --health-file: its folder '{missing.parent}' does not exist",
        ("--health-file", str(tmp_path)): "argument --health-file: must be a file path, not a folder",
        ("--max-db-wait", "-1"): "argument --max-db-wait: must be a number of seconds in 0..604800",
        ("--max-db-wait", "soon"): "argument --max-db-wait: must be a number of seconds in 0..604800",
        ("--max-db-wait", "nan"): "argument --max-db-wait: must be a number of seconds in 0..604800",
    }
    url = subprocess_database_url()
    with taken:
        runs = {argv: manage("workhorse_worker", "--burst", *argv, database_url=url) for argv in cases}
        outputs = {argv: (run.communicate(timeout=120)[0], run.returncode) for argv, run in runs.items()}

    for argv, message in cases.items():
        output, status = outputs[argv]
        assert status == 2, (argv, output)
        assert message in output.strip().splitlines()[-1], (argv, output)
        assert "Worker starting" not in output and "Traceback" not in output, (argv, output)
    assert not missing.parent.exists()
    assert not WorkerRecord.objects.exists()
