"""``workhorse_worker --processes N``: a supervisor and its children as real processes, against the
test database (``tests/worker_main.py``, the handlers of ``tests.fleet_tasks`` and ``tests.worker_tasks``).

The tests find the children in the worker registry (``kind='child'``), signal the processes, and read
what happened from the jobs and their events.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command

from django_workhorse import EnqueueRequest, RetryPolicy, enqueue, enqueue_many
from django_workhorse.models import Checkpoint, Job, JobEvent, JobStatus, WorkerRecord
from tests.processes import WorkerProcess, subprocess_database_url, worker_spawner
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
WORKER_MAIN = ROOT / "tests" / "worker_main.py"
AT_ONCE = timedelta(milliseconds=1)
COMMON = ("--poll-interval", "0.05", "--listen-database", "none", "--no-scheduler")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``tests/worker_main.py`` with the given options; kill what is left at the end."""
    with worker_spawner(tmp_path, [sys.executable, str(WORKER_MAIN), *COMMON]) as start:
        yield start


def enqueue_work(count: int, ms: int = 0) -> list[int]:
    requests = [EnqueueRequest("tests.fleet.work", {"n": n, "ms": ms}) for n in range(count)]
    return [result.job_id for start in range(0, count, 1000) for result in enqueue_many(requests[start : start + 1000])]


def children() -> dict[str, int]:
    """The registered children: name -> pid."""
    return dict(WorkerRecord.objects.filter(kind="child").values_list("name", "pid"))


def statuses() -> Counter[str]:
    return Counter(Job.objects.values_list("status", flat=True))


def event_counts(kind: str) -> Counter[int]:
    return Counter(JobEvent.objects.filter(kind=kind).values_list("job_id", flat=True))


def claimers() -> set[str]:
    return set(JobEvent.objects.filter(kind="claimed").values_list("details__worker", flat=True))


def call(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def all_succeeded(count: int) -> bool:
    return statuses() == Counter({JobStatus.SUCCEEDED: count})


def stop(process: WorkerProcess) -> None:
    process.terminate()
    assert process.wait() == 0, process.output()


def test_three_processes_run_every_job_once(spawn):
    ids = enqueue_work(3000, ms=1)
    supervisor = spawn("--processes", "3", "--burst", "--lease", "60")

    assert supervisor.wait(120) == 0, supervisor.output()

    assert all_succeeded(len(ids))
    assert set(event_counts("succeeded").values()) == {1}
    assert set(event_counts("claimed").values()) == {1}
    assert set(Job.objects.values_list("attempt", flat=True)) == {1}
    # Three children took part, each under its supervisor's name; all deregistered on the way out.
    names = claimers()
    assert len(names) == 3
    assert len({name.rpartition("/")[0] for name in names}) == 1
    assert not WorkerRecord.objects.exists()


def test_a_killed_child_is_replaced_and_its_jobs_run_again_at_once(spawn):
    # Four jobs that block on their first attempt fill the four threads of two children; then work.
    blockers = [enqueue("tests.proc.block_on_first_attempt", {}, max_attempts=3) for _ in range(4)]
    work = enqueue_work(100)
    supervisor = spawn("--processes", "2", "--concurrency", "2", "--lease", "120", "--drain-timeout", "1")
    wait_for(lambda: Checkpoint.objects.filter(name="started").count() == 4, 60, what="the four blockers to start")
    # The supervisor and its children are in the registry, as workhorse_status and the admin show them.
    report = json.loads(call("workhorse_status", "--json"))["workers"]
    (boss,) = (w for w in report if w["kind"] == "supervisor")
    assert (boss["pid"], boss["state"], boss["concurrency"]) == (supervisor.pid, "running", 4)
    assert (
        sorted((w["kind"], w["supervisor"], w["state"]) for w in report if w["name"] != boss["name"])
        == [("child", boss["name"], "running")] * 2
    )
    victim = Job.objects.get(pk=blockers[0]).claimed_by
    held = set(Job.objects.filter(status=JobStatus.RUNNING, claimed_by=victim).values_list("id", flat=True))
    assert len(held) == 2

    os.kill(children()[victim], signal.SIGKILL)

    # Well before the 120 s lease: the supervisor gave the dead child's jobs back, and its successor ran them.
    wait_for(
        lambda: Job.objects.filter(pk__in=[*held, *work], status=JobStatus.SUCCEEDED).count() == len(held) + len(work),
        60,
        what="the dead child's jobs and the work to succeed",
    )
    for job_id in held:
        assert [kind for kind, _ in JobEvent.objects.filter(job_id=job_id).values_list("kind", "attempt")] == [
            "claimed", "checkpoint_saved", "released", "claimed", "succeeded"
        ]  # fmt: skip
        released = JobEvent.objects.get(job_id=job_id, kind="released")
        assert (released.attempt, released.details) == (1, {"worker": victim, "reason": f"exit {-signal.SIGKILL}"})
    assert set(event_counts("succeeded").values()) == {1}
    wait_for(lambda: len(children()) == 2 and victim not in children(), 30, what="a child in the dead one's place")
    stop(supervisor)
    # The other child's blockers went back at its drain: nothing is lost.
    assert set(Job.objects.filter(pk__in=blockers).exclude(pk__in=held).values_list("status", flat=True)) == {
        JobStatus.QUEUED
    }
    assert not WorkerRecord.objects.exists()


def test_max_jobs_per_child_recycles_children_and_loses_or_doubles_nothing(spawn):
    ids = enqueue_work(500)
    supervisor = spawn("--processes", "2", "--max-jobs-per-child", "100", "--burst", "--lease", "60")

    assert supervisor.wait(120) == 0, supervisor.output()

    assert all_succeeded(len(ids))
    assert set(event_counts("claimed").values()) == {1}
    assert set(event_counts("succeeded").values()) == {1}
    per_child = Counter(JobEvent.objects.filter(kind="claimed").values_list("details__worker", flat=True))
    assert len(per_child) >= 5 and max(per_child.values()) <= 100


def test_children_over_max_memory_are_recycled_and_lose_or_double_nothing(spawn):
    # Every Django process is over 16M: each child is recycled about a second after it registers.
    ids = enqueue_work(60, ms=20)
    supervisor = spawn("--processes", "2", "--max-memory-per-child", "16M", "--lease", "60")

    def a_replacement_claimed() -> bool:
        # Jobs can all be done before the first memory check: keep some coming until a third child runs one.
        if len(claimers()) > 2:
            return True
        if not Job.objects.filter(status=JobStatus.QUEUED).exists():
            ids.extend(enqueue_work(10, ms=20))
        return False

    wait_for(a_replacement_claimed, 90, what="a replacement child to claim jobs")
    wait_for(lambda: all_succeeded(len(ids)), 90, what="every job to succeed")
    stop(supervisor)

    assert len(claimers()) > 2
    assert set(event_counts("succeeded").values()) == {1}
    assert not JobEvent.objects.filter(kind__in=["failed", "dead", "lease_expired"]).exists()
    assert "Recycling a child over its memory limit" in supervisor.output()


def test_sigterm_drains_every_child(spawn):
    first, second = (enqueue("tests.proc.finish_after_stop", {}) for _ in range(2))
    supervisor = spawn("--processes", "2", "--lease", "60")
    wait_for(lambda: Checkpoint.objects.filter(name="started").count() == 2, 60, what="both handlers to start")

    stop(supervisor)

    for job in Job.objects.filter(pk__in=[first, second]):
        assert (job.status, job.attempt, job.result) == (JobStatus.SUCCEEDED, 1, {"stop_seen": True})
    assert not WorkerRecord.objects.exists()


def test_a_second_sigterm_kills_the_children_and_releases_their_jobs_at_once(spawn):
    ids = [enqueue("tests.proc.until_cancelled", {}, max_attempts=3) for _ in range(2)]
    supervisor = spawn("--processes", "2", "--lease", "60", "--drain-timeout", "300")
    wait_for(lambda: Checkpoint.objects.filter(name="started").count() == 2, 60, what="both handlers to start")
    supervisor.popen.send_signal(signal.SIGTERM)
    wait_for(
        lambda: set(WorkerRecord.objects.filter(kind="child").values_list("state", flat=True)) == {"draining"},
        30,
        what="the children to drain",
    )
    assert WorkerRecord.objects.get(kind="supervisor").state == "draining"
    other = spawn("--lease", "60")

    supervisor.popen.send_signal(signal.SIGTERM)

    assert supervisor.wait() == 0, supervisor.output()
    # Another worker runs them long before their 60 s leases would have lapsed.
    wait_for(lambda: all_succeeded(2), 40, what="the other worker to run the released jobs")
    for job in Job.objects.filter(pk__in=ids):
        assert (job.attempt, job.result, f":{other.pid}:" in job.claimed_by) == (2, {"attempt": 2}, True)
    assert Counter(JobEvent.objects.filter(kind="released").values_list("job_id", flat=True)) == Counter(ids)
    stop(other)


def test_sighup_replaces_every_child_and_fails_no_job(spawn):
    ids = enqueue_work(400, ms=20)
    supervisor = spawn("--processes", "2", "--concurrency", "2", "--lease", "60")
    old = set(wait_for(lambda: children() if len(children()) == 2 else None, 60, what="two children"))
    wait_for(lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).exists(), 60, what="the first job to succeed")

    supervisor.popen.send_signal(signal.SIGHUP)

    wait_for(lambda: len(children()) == 2 and not old & set(children()), 60, what="both children to be replaced")
    wait_for(lambda: all_succeeded(len(ids)), 60, what="every job to succeed")
    assert not JobEvent.objects.filter(kind__in=["failed", "dead"]).exists()
    assert set(event_counts("succeeded").values()) == {1}
    stop(supervisor)


def test_a_handler_stuck_in_a_c_call_past_its_timeout_is_killed_and_retried(spawn):
    # Retried at once, so that the burst run takes it again before it exits.
    stuck = enqueue("tests.fleet.stuck_in_c", {}, timeout=timedelta(seconds=1), retry_policy=RetryPolicy.fixed(AT_ONCE))
    others = enqueue_work(40, ms=10)
    supervisor = spawn("--processes", "2", "--timeout-grace", "0.5", "--lease", "60", "--burst")

    assert supervisor.wait(90) == 0, supervisor.output()

    job = Job.objects.get(pk=stuck)
    assert (job.status, job.attempt, job.result) == (JobStatus.SUCCEEDED, 2, {"attempt": 2})
    failed = JobEvent.objects.get(job_id=stuck, kind="failed")
    assert failed.attempt == 1
    assert failed.details["exception_class"] == "django_workhorse.exceptions.AttemptTimeoutError"
    # The other jobs ran once each, untouched.
    assert all_succeeded(len(others) + 1)
    assert not JobEvent.objects.filter(job_id__in=others).exclude(kind__in=["claimed", "succeeded"]).exists()
    assert set(Job.objects.filter(pk__in=others).values_list("attempt", flat=True)) == {1}


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (["--processes", "0"], "--processes: must be an integer in 1..64"),
        (["--processes", "-1"], "--processes: must be an integer in 1..64"),
        (["--processes", "65"], "--processes: must be an integer in 1..64"),
        (["--processes", "2", "--max-memory-per-child", "lots"], "--max-memory-per-child: must be a size like 512M"),
        (["--processes", "2", "--max-memory-per-child", "1K"], "--max-memory-per-child: must be a size like 512M"),
        (["--processes", "2", "--max-memory-per-child", "512MB"], "--max-memory-per-child: must be a size like 512M"),
        (["--max-jobs-per-child", "10"], "--max-jobs-per-child, --max-memory-per-child: need --processes 2..64"),
        (["--processes", "2", "--max-jobs", "10"], "--max-jobs: not with --processes"),
    ],
)
def test_bad_process_options_exit_2_before_anything_starts(options, error):
    environment = {**os.environ, "DATABASE_URL": subprocess_database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "manage.py", "workhorse_worker", *options],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert error in lines[-1]
    assert not WorkerRecord.objects.exists()


def test_children_drain_and_exit_when_their_supervisor_is_killed(spawn):
    supervisor = spawn("--processes", "2", "--lease", "60")
    wait_for(lambda: len(children()) == 2, 60, what="two children")

    supervisor.popen.kill()

    # Each child's lifeline closed: it drained and removed its record (the supervisor's stays, as any killed worker's).
    wait_for(lambda: not children(), 30, what="the children to exit")
    assert list(WorkerRecord.objects.values_list("kind", "pid")) == [("supervisor", supervisor.pid)]


def test_the_supervisor_serves_the_health_port_and_file_and_its_children_do_not(spawn, tmp_path):
    import socket
    import urllib.request

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    health_file = tmp_path / "alive"
    supervisor = spawn(
        "--processes", "2", "--lease", "3", "--health-port", str(port), "--health-file", str(health_file)
    )

    wait_for(lambda: len(children()) == 2, timeout=60, what="two registered children")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10) as ready:
        assert ready.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=10) as live:
        assert live.status == 200
    first = health_file.stat().st_mtime_ns
    wait_for(lambda: health_file.stat().st_mtime_ns > first, timeout=30, what="the supervisor's next beat")
    # Had the children served the port too, the second to bind it would have exited with status 2.
    assert WorkerRecord.objects.filter(kind="child").count() == 2
    stop(supervisor)
