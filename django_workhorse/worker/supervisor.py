"""Supervisor: run a worker as child processes (``workhorse_worker --processes N``).

Each child is a fresh interpreter running the supervisor's own command line (as Django's
autoreloader starts ``runserver``), so it sets Django up from scratch and opens its own database
connections: nothing is inherited across a fork. A child tells its supervisor, over a pipe, when
each handler starts and ends; the supervisor enforces hard time limits from that, replaces a child
that dies (with capped backoff) or that is recycled, and gives back in the database, at once, what a
child that is gone still held (``sql.outcomes.release_abandoned``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections

from django_workhorse import sql
from django_workhorse.exceptions import AttemptTimeoutError, HandlerNotRegisteredError, InvalidArgumentError
from django_workhorse.models import Job, JobStatus, WorkerRecord
from django_workhorse.tasks.registry import Handler, get_handler
from django_workhorse.worker import signal_relay
from django_workhorse.worker.child import CHILD_ENVIRONMENT
from django_workhorse.worker.database_wait import DatabaseWait
from django_workhorse.worker.execution import failure
from django_workhorse.worker.health import Health
from django_workhorse.worker.recording import write_outcomes

logger = logging.getLogger(__name__)

MAX_PROCESSES = 64
# A child that dies is started again after 0.5 s, then 1, 2, ... at most 30 s while it keeps dying.
BACKOFF_FIRST, BACKOFF_CAP = 0.5, 30.0
# A child that ran this long before dying resets its slot's backoff.
BACKOFF_RESET_AFTER = 60.0
# The smallest and largest --max-memory-per-child: below a Django process's own size it would
# recycle every child at once.
MIN_MEMORY, MAX_MEMORY = 16 * 2**20, 2**40
_SIZE = re.compile(r"(\d{1,13})([KMGT]?)", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# How often the supervisor wakes to look at its children (signals, exits, limits).
TICK = 0.1
MEMORY_CHECK_INTERVAL = 1.0
# How many ended attempts of a child are remembered as started (their outcome may be unwritten).
RECENT_ENDED = 1000


def parse_memory_size(text: str, field_name: str = "max_memory_per_child") -> int:
    """Return the bytes ``text`` says ("512M", "2G", "1048576"; K, M, G, T are binary units).

    Raise ``InvalidArgumentError`` naming ``field_name`` and the bounds for anything else.
    """
    bound = "a size like 512M or 2G (K, M, G, T: binary units) from 16M to 1T"
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise InvalidArgumentError(field=field_name, bound=bound, value=text)
    size = int(match[1]) * _UNITS[match[2].upper()]
    if not MIN_MEMORY <= size <= MAX_MEMORY:
        raise InvalidArgumentError(field=field_name, bound=bound, value=text)
    return size


def resident_memory(pid: int) -> int | None:
    """Return the resident set size of process ``pid`` in bytes, or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def can_read_memory() -> bool:
    """Whether this platform lets the supervisor read its children's resident memory (``/proc``)."""
    return resident_memory(os.getpid()) is not None


# -- the supervisor's side ---------------------------------------------------------------------


@dataclass
class _Child:
    slot: int
    name: str
    popen: subprocess.Popen[bytes]
    reports: int
    began: float = field(default_factory=time.monotonic)
    state: str = "running"  # running, replacing (SIGHUP: a new one starts), draining, recycling, killed
    buffer: bytes = b""
    running: dict[int, tuple[str, float | None]] = field(default_factory=dict)  # id -> (token, hard deadline)
    ended: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT_ENDED))
    timed_out: tuple[int, str] | None = None
    recycles: bool = False  # said it exits to be replaced
    registered: bool = False


@dataclass
class SupervisorStats:
    """What a supervisor did, returned by :meth:`Supervisor.run`."""

    started: int = 0
    died: int = 0
    recycled: int = 0
    killed_past_time_limit: int = 0
    released: int = 0


class Supervisor:
    """Run ``processes`` children of ``command`` (the worker's own command line) until stopped.

    SIGTERM/SIGINT drains every child (each finishes its jobs within its drain timeout); a second
    one kills them and releases their jobs in the database at once. SIGHUP replaces the children
    one by one, each new one started before the old one drains. A child past ``max_memory`` (RSS,
    bytes) is recycled: told to finish its jobs and exit, and replaced at once. A handler past its
    job's ``timeout`` plus ``timeout_grace`` has its child killed and replaced, and that attempt
    fails with ``AttemptTimeoutError``. In ``burst`` mode it returns once every child found no
    ready job and exited.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        processes: int,
        queues: Sequence[str] = ("default",),
        concurrency: int = 1,
        using: str = "default",
        burst: bool = False,
        max_memory: int | None = None,
        timeout_grace: timedelta = timedelta(seconds=10),
        heartbeat: timedelta = timedelta(seconds=10),
        name: str | None = None,
        max_db_wait: float | None = None,
        health: Health | None = None,
    ) -> None:
        if not 1 <= processes <= MAX_PROCESSES:
            raise InvalidArgumentError(field="processes", bound=f"an integer in 1..{MAX_PROCESSES}", value=processes)
        self.command = list(command)
        self.processes = processes
        self.queues = list(queues)
        self.concurrency = concurrency
        self.using = using
        self.burst = burst
        self.max_memory = max_memory
        self.timeout_grace = timeout_grace.total_seconds()
        self.heartbeat = heartbeat.total_seconds()
        self.health = health
        self._stopping = threading.Event()
        self._database = DatabaseWait(
            using, max_wait=max_db_wait, stopping=self._stopping, beat=self._beat, beat_every=self.heartbeat
        )
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stats = SupervisorStats()
        self._children: list[_Child] = []
        self._serial = 0
        self._failures = [0] * processes
        self._next_start = [0.0] * processes
        self._done = [False] * processes  # burst: the slot's child found nothing to do
        self._terms = 0
        self._handled_terms = 0
        self._reload_requested = False
        self._to_replace: list[_Child] = []
        self._replacing: _Child | None = None
        self._reloading = False
        self._lifeline_read, self._lifeline_write = os.pipe()

    # -- public --------------------------------------------------------------------------------

    def run(self) -> SupervisorStats:
        """Supervise until stopped (or, in burst mode, until every child is done)."""
        logger.info("Supervisor starting name=%s processes=%s", self.name, self.processes)
        next_heartbeat = time.monotonic() + self.heartbeat
        next_memory_check = 0.0
        with signal_relay.relayed(
            {signal.SIGTERM: self.request_stop, signal.SIGINT: self.request_stop, signal.SIGHUP: self.request_reload}
        ):
            try:
                if self._database.call(self._register) is None:  # stopped while waiting for the database
                    return self.stats
                while not self._finished():
                    self._read_reports(TICK)
                    self._obey_signals()
                    self._reap()
                    self._enforce_time_limits()
                    if self.max_memory is not None and time.monotonic() >= next_memory_check:
                        self._enforce_memory_limit()
                        next_memory_check = time.monotonic() + MEMORY_CHECK_INTERVAL
                    self._replace_next()
                    self._start_missing()
                    if time.monotonic() >= next_heartbeat:
                        self._db("heartbeat", sql.housekeeping.touch_worker, self.using, self.name)
                        self._beat()
                        next_heartbeat = time.monotonic() + self.heartbeat
            finally:
                self._kill_all()
                self._db("deregistering", sql.housekeeping.deregister_worker, self.using, self.name)
                os.close(self._lifeline_write)
                os.close(self._lifeline_read)
                connections[self.using].close()
        logger.info("Supervisor stopped name=%s %s", self.name, self.stats)
        return self.stats

    def _register(self) -> bool:
        # It claims nothing itself (job_types empty): its children register what they claim.
        sql.housekeeping.register_worker(
            self.using,
            name=self.name,
            queues=self.queues,
            concurrency=self.processes * self.concurrency,
            kind="supervisor",
            job_types=[],
        )  # fmt: skip
        return True

    def _beat(self) -> None:
        if self.health is not None:
            self.health.beat()

    def request_stop(self) -> None:
        """What SIGTERM does: the first call drains every child, the second kills them."""
        self._terms += 1
        self._stopping.set()  # ends a wait for the database, if one is under way

    def request_reload(self) -> None:
        """What SIGHUP does: replace every child, one by one."""
        self._reload_requested = True

    # -- children ------------------------------------------------------------------------------

    def _start(self, slot: int) -> None:
        self._serial += 1
        name = f"{self.name}/{slot}.{self._serial}"
        reports, writer = os.pipe()
        os.set_blocking(reports, False)
        identity = {"name": name, "supervisor": self.name, "reports": writer, "lifeline": self._lifeline_read}
        environment = {**os.environ, CHILD_ENVIRONMENT: json.dumps(identity)}
        try:
            popen = subprocess.Popen(self.command, env=environment, pass_fds=(writer, self._lifeline_read))
        except OSError:
            logger.exception("Starting a child failed slot=%s", slot)
            os.close(reports)
            self._backoff(slot)
            return
        finally:
            os.close(writer)
        self._children.append(_Child(slot, name, popen, reports))
        self.stats.started += 1
        logger.info("Child started name=%s pid=%s", name, popen.pid)

    def _start_missing(self) -> None:
        if self._handled_terms:
            return
        now = time.monotonic()
        for slot in range(self.processes):
            serving = any(c.slot == slot and c.state == "running" for c in self._children)
            if not serving and not self._done[slot] and now >= self._next_start[slot]:
                self._start(slot)

    def _read_reports(self, timeout: float) -> None:
        readers = {c.reports: c for c in self._children}
        try:
            ready, _, _ = select.select(list(readers), [], [], timeout) if readers else ([], [], [])
        except InterruptedError:  # a signal: look at it now
            return
        if not readers:
            time.sleep(timeout)  # nothing to watch (every child in backoff): wait a tick for signals
        for fd in ready:
            self._read(readers[fd])

    def _read(self, child: _Child) -> int:
        """Read what ``child`` reported; return how many bytes (0 at the end of its pipe, -1 when
        nothing is there now: a process it forked may hold the pipe open after it exited)."""
        try:
            data = os.read(child.reports, 65536)
        except BlockingIOError:
            return -1
        child.buffer += data
        *lines, child.buffer = child.buffer.split(b"\n")
        for line in lines:
            self._heard(child, json.loads(line))
        return len(data)

    def _heard(self, child: _Child, report: dict[str, Any]) -> None:
        if "started" in report:
            timeout = report["timeout"]
            deadline = None if timeout is None else time.monotonic() + timeout + self.timeout_grace
            child.running[report["started"]] = (report["token"], deadline)
        elif "ended" in report:
            child.running.pop(report["ended"], None)
            child.ended.append(report["ended"])
        elif "recycling" in report:
            child.recycles = True

    def _reap(self) -> None:
        for child in list(self._children):
            code = child.popen.poll()
            if code is not None:
                self._gone(child, code)

    def _gone(self, child: _Child, code: int) -> None:
        while self._read(child) > 0:  # what it wrote before it exited
            pass
        os.close(child.reports)
        self._children.remove(child)
        if child.timed_out is not None:
            self._fail_timed_out(*child.timed_out)
        started = [*child.running, *child.ended]
        reason = "killed past its time limit" if child.timed_out else ("exited" if code == 0 else f"exit {code}")
        released = self._db("releasing", sql.outcomes.release_abandoned, self.using, child.name, started, reason)
        if released:
            self.stats.released += released
            logger.warning("Released the jobs of a child that is gone name=%s count=%s", child.name, released)
        if code != 0:
            self._db("deregistering", sql.housekeeping.deregister_worker, self.using, child.name)
        if self._replacing is child:
            self._replacing = None
        self._after_exit(child, code)

    def _after_exit(self, child: _Child, code: int) -> None:
        slot = child.slot
        if code == 0 and child.state == "running" and not child.recycles:
            if self.burst:
                self._done[slot] = True
                logger.info("Child found no ready job and exited name=%s", child.name)
            return
        if code == 0 or child.state in ("killed", "recycling"):
            self.stats.recycled += code == 0
            self._failures[slot] = 0
            self._next_start[slot] = 0.0
            return
        self.stats.died += 1
        logger.error("Child died name=%s pid=%s exit=%s; starting another", child.name, child.popen.pid, code)
        if time.monotonic() - child.began > BACKOFF_RESET_AFTER:
            self._failures[slot] = 0
        self._backoff(slot)

    def _backoff(self, slot: int) -> None:
        delay = min(BACKOFF_FIRST * 2 ** self._failures[slot], BACKOFF_CAP)
        self._failures[slot] += 1
        self._next_start[slot] = time.monotonic() + delay

    def _finished(self) -> bool:
        if self._handled_terms:
            return not self._children
        return self.burst and all(self._done) and not self._children

    # -- limits --------------------------------------------------------------------------------

    def _enforce_time_limits(self) -> None:
        now = time.monotonic()
        for child in self._children:
            if child.state == "killed":
                continue
            for job_id, (token, deadline) in child.running.items():
                if deadline is not None and now > deadline:
                    logger.error(
                        "A handler ran past its timeout and grace; killing its child name=%s job=%s",
                        child.name, job_id,
                    )  # fmt: skip
                    child.timed_out = (job_id, token)
                    self.stats.killed_past_time_limit += 1
                    self._kill(child)
                    break

    def _fail_timed_out(self, job_id: int, token: str) -> None:
        """Record the attempt the supervisor killed as failed with AttemptTimeoutError (a retry, or
        dead on its last attempt), fenced by its lease token."""
        try:
            job = Job.objects.using(self.using).filter(pk=job_id, lease_token=token, status=JobStatus.RUNNING).first()
            if job is None:
                return
            claimed = sql.claims.ClaimedJob(
                job.id, job.job_type, job.queue, job.payload, job.attempt, job.max_attempts, job.retry_policy,
                job.deadline, job.timeout, job.lease_token, job.root_id or job.id, workflow_id=job.workflow_id,
                cipher_salt=None if job.cipher_salt is None else bytes(job.cipher_salt),
            )  # fmt: skip
            error = AttemptTimeoutError(
                f"the attempt ran past its timeout of {job.timeout} and a grace of {self.timeout_grace:g} s: "
                "its worker process was killed"
            )
            write_outcomes(self.using, [failure(claimed, error, _handler(job.job_type))])
        except Exception:  # the supervisor carries on; the job's lease lapses instead
            logger.exception("Recording a killed attempt failed job=%s; its lease will lapse", job_id)
            connections[self.using].close()

    def _enforce_memory_limit(self) -> None:
        assert self.max_memory is not None
        for child in self._children:
            # Only once it is registered: by then its worker recycles on SIGUSR1 (which would kill it before).
            rss = resident_memory(child.popen.pid) if child.state == "running" else None
            if rss is not None and rss > self.max_memory and self._registered(child):
                logger.info("Recycling a child over its memory limit name=%s rss=%s", child.name, rss)
                self._recycle(child)

    def _recycle(self, child: _Child) -> None:
        child.state = "recycling"
        self._signal(child, signal.SIGUSR1)

    # -- signals -------------------------------------------------------------------------------

    def _obey_signals(self) -> None:
        terms = self._terms
        if terms == self._handled_terms:
            if self._reload_requested and not self._handled_terms:
                self._reload_requested = False
                self._to_replace = [c for c in self._children if c.state == "running"]
                self._reloading = True
                self._db("saying its state", sql.housekeeping.set_worker_state, self.using, self.name, "replacing")
                logger.info("Replacing every child, one by one count=%s", len(self._to_replace))
            return
        self._handled_terms = terms
        if terms == 1:
            logger.info("Stopping: every child finishes its jobs")
            self._db("saying its state", sql.housekeeping.set_worker_state, self.using, self.name, "draining")
            for child in self._children:
                child.state = "draining" if child.state != "killed" else "killed"
                self._signal(child, signal.SIGTERM)
        else:
            logger.warning("Stopping now: killing every child and releasing its jobs")
            self._db("saying its state", sql.housekeeping.set_worker_state, self.using, self.name, "stopping")
            for child in self._children:
                self._kill(child)

    def _replace_next(self) -> None:
        """SIGHUP, one child at a time: mark it replaced (a new one starts in its slot), drain it
        once its successor has registered, and go on when it has exited."""
        if self._handled_terms:
            return
        if self._replacing is None:
            while self._to_replace:
                old = self._to_replace.pop(0)
                if old in self._children and old.state == "running":
                    old.state = "replacing"
                    self._replacing = old
                    return
            if self._reloading:
                self._reloading = False
                self._db("saying its state", sql.housekeeping.set_worker_state, self.using, self.name, "running")
            return
        old = self._replacing
        if old.state != "replacing":
            return
        successor = next((c for c in self._children if c.slot == old.slot and c.state == "running"), None)
        if successor is not None and self._registered(successor):
            old.state = "draining"
            self._signal(old, signal.SIGTERM)

    def _registered(self, child: _Child) -> bool:
        if not child.registered:
            try:
                child.registered = WorkerRecord.objects.using(self.using).filter(name=child.name).exists()
            except DatabaseError:
                connections[self.using].close()
        return child.registered

    def _kill(self, child: _Child) -> None:
        child.state = "killed"
        self._signal(child, signal.SIGKILL)

    def _kill_all(self) -> None:
        for child in self._children:
            self._kill(child)
        for child in list(self._children):
            self._gone(child, child.popen.wait())

    @staticmethod
    def _signal(child: _Child, signum: int) -> None:
        with suppress(ProcessLookupError):  # exited meanwhile: the next reap sees it
            child.popen.send_signal(signum)

    def _db(self, doing: str, statement: Callable[..., Any], *args: Any) -> Any:
        """Run ``statement``; on a database error log it and carry on (leases cover what it missed)."""
        try:
            return statement(*args)
        except DatabaseError:
            logger.exception("Supervisor failed %s; carrying on", doing)
            connections[self.using].close()
            return None


def _handler(job_type: str) -> Handler | None:
    try:
        return get_handler(job_type)
    except HandlerNotRegisteredError:
        return None
