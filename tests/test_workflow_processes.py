"""Workflows run by real worker processes (``tests/worker_main.py``: 3 workers × 4 threads) while
workers are SIGKILLed (decision 0022, increment 4).

Every run of a step is recorded by its handler (``tests.workflow_tasks``) with the worker's pid and
whether all the step's parents had succeeded when it started. A *gate* step, one parent of the
sink, holds until the test opens it, and the test opens it only after its kills: so every kill
falls while the sink is still waiting, and the sink must run exactly once. A killed worker's jobs
go back by lease expiry to the surviving workers.
"""

from __future__ import annotations

import signal
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_workhorse import EnqueueOptions, EnqueueRequest
from django_workhorse.models import Job, JobEvent, JobStatus
from django_workhorse.workflows import Workflow
from tests.processes import WorkerProcess, worker_spawner
from tests.worker_tasks import wait_for
from tests.workflow_tasks import CREATE_TABLES, DROP_TABLES, GATE_TABLE, RUNS_TABLE, STEP

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
WORKER_MAIN = ROOT / "tests" / "worker_main.py"
WORKERS = 3
# 4 threads each; a short lease so a killed worker's steps come back soon; fast polls, no LISTEN.
OPTIONS = ("--concurrency", "4", "--lease", "3", "--poll-interval", "0.05", "--listen-database", "none")
DEADLINE = 180.0  # seconds for a whole workflow on a loaded machine


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    with worker_spawner(tmp_path, [sys.executable, str(WORKER_MAIN), *OPTIONS]) as start:
        yield start


@pytest.fixture
def runs_table() -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute(DROP_TABLES)
        cursor.execute(CREATE_TABLES)
    yield
    with connection.cursor() as cursor:
        cursor.execute(DROP_TABLES)


def step(seconds: float = 0.0, *, gate: bool = False) -> EnqueueRequest:
    return EnqueueRequest(STEP, {"seconds": seconds, "gate": gate}, EnqueueOptions(max_attempts=10))


def runs() -> list[tuple[str, int, int, bool]]:
    """(step, attempt, pid, parents all succeeded) of every run, in the order they started."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT step_name, attempt, pid, parents_ok FROM {RUNS_TABLE} ORDER BY id")
        return list(cursor.fetchall())


def running_pids(name: str | None = None) -> set[int]:
    """Pids of workers recorded running the current attempt of a step (``name``, or any) still running."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT run.pid FROM {RUNS_TABLE} AS run JOIN workhorse_job AS job ON job.id = run.job_id "
            "WHERE job.status = 'running' AND run.attempt = job.attempt AND (%s::text IS NULL OR run.step_name = %s)",
            [name, name],
        )
        return {pid for (pid,) in cursor.fetchall()}


def open_gate() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {GATE_TABLE} (opened) VALUES (true)")


def kill(workers: list[WorkerProcess], spawn: Callable[..., WorkerProcess], pid: int, sink: int) -> int:
    """SIGKILL the worker ``pid`` while the sink still waits, and start a replacement; return ``pid``."""
    assert Job.objects.get(pk=sink).status == JobStatus.WAITING  # the gate holds it: no kill after it is queued
    victim = next(worker for worker in workers if worker.pid == pid)
    victim.popen.kill()
    assert victim.wait() == -signal.SIGKILL
    workers.append(spawn())
    return pid


def pid_running(workers: list[WorkerProcess], name: str | None = None) -> int:
    """The pid of a live worker running step ``name`` (any step if None) now."""
    live = {worker.pid for worker in workers if worker.popen.poll() is None}

    def found() -> int | None:
        pids = running_pids(name) & live
        return min(pids) if pids else None

    pid: int = wait_for(found, DEADLINE, what=f"a worker running {name or 'a step'}")
    return pid


def check_runs(jobs: dict[str, int], killed: set[int], sink: str) -> Counter[str]:
    """Each step ran after its parents; a step ran again only after its worker was killed; all succeeded."""
    recorded = runs()
    assert all(parents_ok for *_, parents_ok in recorded), [run for run in recorded if not run[3]]
    by_step: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for name, attempt, pid, _ in recorded:
        by_step[name].append((attempt, pid))
    assert by_step.keys() == jobs.keys()
    for name, attempts in by_step.items():
        # Every run but the last was cut short by a kill, and each later run is a later attempt.
        assert all(pid in killed for _, pid in attempts[:-1]), (name, attempts, killed)
        assert [attempt for attempt, _ in attempts] == sorted({attempt for attempt, _ in attempts}), (name, attempts)
    assert len(by_step[sink]) == 1
    final = dict(Job.objects.filter(pk__in=jobs.values()).values_list("step_name", "status"))
    assert set(final.values()) == {JobStatus.SUCCEEDED}
    assert JobEvent.objects.filter(job_id=jobs[sink], kind="ready").count() == 1
    return Counter(name for name, *_ in recorded)


def stop_all(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        if worker.popen.poll() is None:
            worker.terminate()
    for worker in workers:
        if worker.popen.returncode is None:
            assert worker.wait() == 0, worker.output()


def test_a_diamond_completes_once_in_order_while_the_worker_of_a_step_is_killed(spawn, runs_table):
    wf = Workflow("diamond under kills")
    wf.add("a", step())
    wf.add("left", step(gate=True), after=["a"])  # holds until the kill is done
    wf.add("right", step(0.05), after=["a"])
    wf.add("d", step(), after=["left", "right"])
    jobs = wf.enqueue().jobs
    workers = [spawn() for _ in range(WORKERS)]

    left_pid = kill(workers, spawn, pid_running(workers, "left"), jobs["d"])
    open_gate()

    wait_for(lambda: Job.objects.get(pk=jobs["d"]).status == JobStatus.SUCCEEDED, DEADLINE, what="the sink")
    stop_all(workers)
    counts = check_runs(jobs, {left_pid}, "d")
    assert counts["left"] == 2  # the killed run and the one after its lease expired
    assert Job.objects.get(pk=jobs["left"]).attempt == 2


def test_a_200_step_fan_out_and_fan_in_completes_once_in_order_while_workers_are_killed(spawn, runs_table):
    wf = Workflow("fan out, fan in")
    wf.add("source", step())
    wf.add("gate", step(gate=True), after=["source"])  # first of its layer: claimed early, held to the end
    middle = [f"m{n:03}" for n in range(197)]
    for name in middle:
        wf.add(name, step(0.05), after=["source"])
    wf.add("sink", step(), after=["gate", *middle])
    assert len(wf.plan().steps) == 200
    jobs = wf.enqueue().jobs
    workers = [spawn() for _ in range(WORKERS)]

    # The gate's worker first (its step surely runs again), then any worker running a step.
    wait_for(lambda: len(runs()) >= 20, DEADLINE, what="20 step runs")
    killed = {kill(workers, spawn, pid_running(workers, "gate"), jobs["sink"])}
    wait_for(lambda: len(runs()) >= 80, DEADLINE, what="80 step runs")
    killed.add(kill(workers, spawn, pid_running(workers), jobs["sink"]))
    open_gate()

    wait_for(lambda: Job.objects.get(pk=jobs["sink"]).status == JobStatus.SUCCEEDED, DEADLINE, what="the sink")
    stop_all(workers)
    counts = check_runs(jobs, killed, "sink")
    assert counts["gate"] >= 2  # the killed run, and the one after its lease expired
    assert Job.objects.get(pk=jobs["sink"]).pending_parents == 0
