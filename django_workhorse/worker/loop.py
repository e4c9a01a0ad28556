"""Worker: claim ready jobs, run them on threads, keep their leases alive, stop gracefully."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from django.db import DatabaseError, close_old_connections, connections

from django_workhorse import sql
from django_workhorse.admission import fair, rate_limits
from django_workhorse.admission import recording as breakers
from django_workhorse.conf import DEFAULT_DRAIN_TIMEOUT, DEFAULT_LEASE, app_settings
from django_workhorse.exceptions import WorkerThreadError
from django_workhorse.observability import instruments
from django_workhorse.observability.log_fields import job_fields, job_ids
from django_workhorse.operations.maintenance import run_maintenance
from django_workhorse.tasks import registry
from django_workhorse.types import EnqueueOutcome
from django_workhorse.worker import current, signal_relay
from django_workhorse.worker.context import HandlerContext
from django_workhorse.worker.database_wait import DatabaseWait
from django_workhorse.worker.execution import Outcome, execute, failure
from django_workhorse.worker.health import Health
from django_workhorse.worker.held import HeldJob
from django_workhorse.worker.own_connections import close_broken_connections
from django_workhorse.worker.recording import close_connection, write_outcomes

logger = logging.getLogger(__name__)

# How long a job no live worker can run is held out of the due range (a heartbeat holds it; a worker
# that can run it gives it back when it registers): decision 0021, "Capability".
HOLD_WITHOUT_HANDLER = timedelta(seconds=30)


@dataclass
class WorkerStats:
    """What a worker did, returned by :meth:`Worker.run`."""

    claimed: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    failed_threads: list[str] = field(default_factory=list)


class AttemptObserver(Protocol):
    """Told when each attempt's handler starts and when the attempt ends (a supervisor's child
    reports them, for hard time limits and to know which jobs had started)."""

    def started(self, job: sql.claims.ClaimedJob) -> None:
        """The handler of ``job`` is about to run."""

    def ended(self, job: sql.claims.ClaimedJob) -> None:
        """The attempt of ``job`` ended (its outcome is about to be recorded)."""


class Worker:
    """Run jobs of ``queues`` on ``concurrency`` threads until stopped (or, in burst mode, idle).

    Wakes on LISTEN/NOTIFY (on the ``listen_using`` alias; ``None`` polls only, as behind
    PgBouncer in transaction mode) and polls every ``poll_interval`` seconds as a fallback. With
    ``scheduler`` (the default) it also evaluates the periodic schedules, at most once per
    ``WORKHORSE_SCHEDULE_INTERVAL``, on a thread of its own. While its database is unreachable it
    waits with backoff (``max_db_wait`` seconds at most, if given); ``health`` hears every heartbeat.
    ``kind`` and ``supervisor`` say what its registry row shows (a child of a supervisor process
    names it); ``observer`` hears of each attempt's start and end.
    """

    def __init__(
        self,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 1,
        batch: int | None = None,
        lease: timedelta = DEFAULT_LEASE,
        poll_interval: float = 1.0,
        burst: bool = False,
        max_jobs: int | None = None,
        drain_timeout: timedelta = DEFAULT_DRAIN_TIMEOUT,
        using: str = "default",
        listen_using: str | None = "default",
        name: str | None = None,
        scheduler: bool = True,
        max_db_wait: float | None = None,
        health: Health | None = None,
        kind: str = "worker",
        supervisor: str = "",
        observer: AttemptObserver | None = None,
        job_types: Sequence[str] | None = None,
    ) -> None:
        self.queues = list(queues)
        # What this worker claims: the job types it has handlers for (registry.capabilities(), read
        # when it starts, unless given), registered on its row (decision 0021, "Capability").
        self._job_types = None if job_types is None else list(job_types)
        # Fair queues (WORKHORSE_QUEUES) are claimed in fair share, each from its cursor on.
        self._queues_in_order, fair_queues = fair.split_queues(self.queues)
        self._fair = fair.FairCursors(fair_queues)
        self.concurrency = concurrency
        self.batch = batch or concurrency
        # At most one claimed batch waits while every executor is busy.
        self.capacity = concurrency + (0 if fair_queues else self.batch)
        self.lease = lease
        self.poll_interval = poll_interval
        # When the earliest job a rate limit held is due (time.monotonic()), if one is.
        self._rate_slot_due: float | None = None
        self.burst = burst
        self.max_jobs = max_jobs
        self.drain_timeout = drain_timeout
        self.using = using
        self.listen_using = listen_using
        self.scheduler = scheduler
        self.kind = kind
        self.supervisor = supervisor
        self.observer = observer
        self._stop_state = "draining"
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stats = WorkerStats()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._listening = threading.Event()
        self._heartbeats_done = threading.Event()
        self._lock = threading.Lock()
        self._held: dict[int, HeldJob] = {}
        self._work: queue.Queue[HeldJob | None] = queue.Queue()
        self._outcomes: queue.Queue[Outcome | None] = queue.Queue()
        self.health = health
        self._database = DatabaseWait(
            using, max_wait=max_db_wait, stopping=self._stopping, beat=self._beat, beat_every=lease.total_seconds() / 3
        )

    # -- public --------------------------------------------------------------------------------

    @property
    def job_types(self) -> list[str]:
        """The job types this worker claims (``module.*``: any job type in that module), as registered."""
        if self._job_types is None:
            self._job_types = registry.capabilities()
        return self._job_types

    def run(self) -> WorkerStats:
        """Work until stopped (SIGTERM/SIGINT or :meth:`stop`), or until idle in burst mode.

        Raise ``WorkerThreadError`` (after stopping and releasing the jobs still held) if one of
        the worker's threads died of an unexpected error, and ``DatabaseUnavailableError`` if the
        database did not answer for longer than ``max_db_wait``.
        """
        logger.info("Worker starting name=%s queues=%s concurrency=%s", self.name, self.queues, self.concurrency)
        with signal_relay.relayed({signal.SIGTERM: self.stop, signal.SIGINT: self.stop}):
            if self._database.call(self._register) is None:  # stopped while waiting for the database
                return self.stats
            self._run_registered()
        logger.info("Worker stopped name=%s claimed=%s finished=%s", self.name, self.stats.claimed, self.stats.finished)
        if self.stats.failed_threads:
            raise WorkerThreadError(self.stats.failed_threads)
        return self.stats

    def _register(self) -> bool:
        sql.housekeeping.register_worker(
            self.using,
            name=self.name,
            queues=self.queues,
            concurrency=self.concurrency,
            kind=self.kind,
            supervisor=self.supervisor,
            job_types=self.job_types,
        )
        # Jobs held for want of a handler that this worker has come back now, not at their hold's end.
        sql.capability.return_runnable(self.using, queues=self.queues, job_types=self.job_types)
        return True

    def _run_registered(self) -> None:
        executors = [self._thread(self._execute_forever, f"executor-{i}") for i in range(self.concurrency)]
        recorder = self._thread(self._record_forever, "recorder")
        helpers = [self._thread(self._heartbeat_forever, "heartbeat")]
        if self.listen_using is not None:
            helpers.append(self._thread(self._listen_forever, "listener"))
        if self.scheduler:
            helpers.append(self._thread(self._schedule_forever, "scheduler"))
        try:
            self._claim_until_done()
        finally:
            self._drain(executors, recorder, helpers)
            self._deregister()

    def stop(self) -> None:
        """Stop claiming; running handlers get ``drain_timeout`` to finish."""
        self._stopping.set()
        self._wake.set()

    def recycle(self) -> None:
        """Stop as :meth:`stop` does, saying "recycling" (a supervisor replaces this process)."""
        self._stop_state = "recycling"
        self.stop()

    def wait_until_listening(self, timeout: float) -> bool:
        """Block until the LISTEN connection is up (for tests and tools); return whether it is."""
        return self._listening.wait(timeout)

    # -- claim loop ----------------------------------------------------------------------------

    def _claim_until_done(self) -> None:
        next_reclaim = 0.0
        next_maintenance = time.monotonic() + app_settings.MAINTENANCE_INTERVAL.total_seconds()
        while not self._stopping.is_set():
            close_broken_connections()
            idle_before = self._idle()
            try:
                next_reclaim = self._reclaim_if_due(next_reclaim)
                next_maintenance = self._maintain_if_due(next_maintenance)
                claimed = self._claim()
            except DatabaseError as exc:
                connections[self.using].close()
                if not self._database.answers():  # down: back off (give up after max_db_wait), claim again
                    self._database.until_up(exc)
                    continue
                logger.exception("Claim failed; retrying after the poll interval")
                claimed = 0
            if self._should_exit(claimed, idle_before):
                return
            if claimed == 0 or not self._wants_more():
                self._wake.wait(self._idle_wait())
                self._wake.clear()

    def _idle_wait(self) -> float:
        """The poll interval, or less when a job a rate limit held is due sooner (its slot)."""
        due, self._rate_slot_due = self._rate_slot_due, None
        if due is None:
            return self.poll_interval
        return min(self.poll_interval, max(0.0, due - time.monotonic()))

    def _claim(self) -> int:
        if not self._wants_more():
            return 0
        with self._lock:
            limit = min(self.batch, self.capacity - len(self._held), self._budget())
        if limit <= 0:
            return 0
        started = instruments.clock()
        reads = self._fair.reads()
        jobs = sql.claims.claim(
            self.using, queues=self._queues_in_order, limit=limit, lease=self.lease, worker=self.name,
            fair_queues=reads, rate_limits=rate_limits.claim_parameter(), rate_ahead_us=rate_limits.ADMIT_AHEAD_US,
            job_types=self.job_types,
        )  # fmt: skip
        self._fair.advance(reads, jobs)
        instruments.claimed(time.perf_counter() - started)
        breakers.claimed(jobs)
        rate_limits.claimed(jobs)
        if jobs.next_slot is not None:
            due = time.monotonic() + jobs.next_slot
            self._rate_slot_due = due if self._rate_slot_due is None else min(due, self._rate_slot_due)
        for job in jobs:
            context = HandlerContext(job, alias=self.using, on_heartbeat=functools.partial(self._heartbeat_one, job.id))
            held = HeldJob(job, context)
            with self._lock:
                self._held[job.id] = held
            self._work.put(held)
        self.stats.claimed += len(jobs)
        # Held candidates may hide ready jobs behind them: count them, so the loop claims again now.
        return len(jobs) + jobs.held

    def _wants_more(self) -> bool:
        # Claim again once an executor could go idle; a batch larger than the concurrency is
        # held (leased, heartbeated) until an executor takes it.
        with self._lock:
            return len(self._held) < self.concurrency

    def _budget(self) -> int:
        return self.capacity if self.max_jobs is None else self.max_jobs - self.stats.claimed

    def _idle(self) -> bool:
        with self._lock:
            return not self._held

    def _should_exit(self, claimed: int, idle_before: bool) -> bool:
        idle = self._idle()
        if self.max_jobs is not None and self.stats.claimed >= self.max_jobs:
            return idle
        # Burst mode stops only after a claim that began with every outcome written found nothing: a
        # claim racing a recording could miss what that recording released (a workflow's next step)
        # or what its handler enqueued.
        return self.burst and claimed == 0 and idle_before and idle

    def _maintain_if_due(self, due: float) -> float:
        now = time.monotonic()
        if now < due:
            return due
        report = run_maintenance(using=self.using)
        if report.ran:
            logger.info("Maintenance ran %s", report)
        return now + app_settings.MAINTENANCE_INTERVAL.total_seconds()

    def _reclaim_if_due(self, due: float) -> float:
        now = time.monotonic()
        if now < due:
            return due
        if reclaimed := sql.outcomes.reclaim_expired(self.using):
            instruments.reclaimed(reclaimed)
            logger.warning("Reclaimed jobs with expired leases count=%s", reclaimed)
        return now + max(self.lease.total_seconds() / 3, 0.5)

    # -- executors -----------------------------------------------------------------------------

    def _execute_forever(self) -> None:
        current.serve(self.using, self.queues, self.concurrency)
        while (held := self._work.get()) is not None:
            began = time.perf_counter()
            instruments.attempt_started(held.job)
            try:
                close_old_connections()
                held.wait_for_start()
                outcome = execute(held.job, held.context, started=functools.partial(self._started, held))
            except Exception as exc:  # the worker's own failure around the handler: the job's failure
                logger.exception("Running job failed id=%s", held.job.id, extra=job_fields(held.job))
                outcome = failure(held.job, exc)
            held.ended = True
            if self.observer is not None:
                self.observer.ended(held.job)
            self._outcomes.put(dataclasses.replace(outcome, duration=time.perf_counter() - began))
        connections.close_all()

    def _started(self, held: HeldJob) -> None:
        held.mark_started()
        if self.observer is not None:
            self.observer.started(held.job)

    def _record_forever(self) -> None:
        # One writer for every executor's outcomes: under load they accumulate while the previous
        # write runs and go out together, one statement and one commit for many jobs.
        done = False
        while not done:
            batch = [self._outcomes.get()]
            while True:
                try:
                    batch.append(self._outcomes.get_nowait())
                except queue.Empty:
                    break
            done = None in batch
            outcomes = [outcome for outcome in batch if outcome is not None]
            if outcomes:
                self._record(outcomes)
        connections.close_all()

    def _record(self, outcomes: list[Outcome]) -> None:
        statuses = ["unrecorded"] * len(outcomes)
        try:
            close_broken_connections()
            statuses = write_outcomes(self.using, outcomes)
        except Exception:  # never leave the jobs held: unrecorded, their leases lapse
            logger.exception("Recording outcomes failed count=%s; their leases will lapse", len(outcomes))
        self._record_breakers(outcomes, statuses)
        with self._lock:
            for outcome, status in zip(outcomes, statuses, strict=True):
                self._held.pop(outcome.job.id, None)
                self.stats.finished[status] = self.stats.finished.get(status, 0) + 1
        for outcome, status in zip(outcomes, statuses, strict=True):
            instruments.attempt_finished(outcome.job, status, outcome.duration, outcome.kind)
        self._wake.set()

    def _record_breakers(self, outcomes: list[Outcome], statuses: list[str]) -> None:
        # After the outcomes committed, in a statement of its own: a breaker's write never holds
        # an outcome back. An attempt whose handler opened its breaker itself is not a verdict.
        with self._lock:
            opened = {o.job.id for o in outcomes if (h := self._held.get(o.job.id)) and h.context.opened_breaker}
        attempts = [
            (outcome.job, status, outcome.kind, outcome.error)
            for outcome, status in zip(outcomes, statuses, strict=True)
            if outcome.job.id not in opened
        ]
        try:
            breakers.record_attempts(self.using, attempts)
        except Exception:  # the breakers miss these verdicts; the jobs are recorded already
            logger.exception("Recording circuit breaker verdicts failed count=%s", len(outcomes))
            self._close_connection()

    def _close_connection(self) -> None:
        close_connection(self.using)

    # -- heartbeats ----------------------------------------------------------------------------

    def _heartbeat_forever(self) -> None:
        # Runs through the drain too: handlers still finishing keep their leases.
        while not self._heartbeats_done.wait(self.lease.total_seconds() / 3):
            self._beat()
            try:
                self._heartbeat()
            except Exception:
                self._log_failure("Worker heartbeat failed")
                self._close_connection()
        connections.close_all()

    def _heartbeat(self) -> None:
        with self._lock:
            held = list(self._held.values())
        for running in held:
            if running.overtime(0) > 0:
                running.context.cancel(timed_out=True)
        # Only jobs whose handler runs (or is about to) are extended: an ended one has the rest of
        # its lease for its outcome to be written. A handler that ignores its timeout keeps running
        # on its thread, but after one more lease its job is no longer extended either: it expires
        # and another worker takes it.
        held = [h for h in held if not h.ended and h.overtime(self.lease.total_seconds()) <= 0]
        if held:
            self._extend(held)
        try:
            if not sql.housekeeping.touch_worker(self.using, self.name):
                self._register()  # maintenance forgot it as stale (a long outage): record it again
            sql.capability.hold_without_handler(
                self.using, queues=self.queues, hold=HOLD_WITHOUT_HANDLER, stale_after=app_settings.WORKER_STALE_AFTER
            )
        except DatabaseError:
            self._log_failure("Worker heartbeat failed")
            self._close_connection()

    def _beat(self) -> None:
        if self.health is not None:
            self.health.beat()

    def _log_failure(self, message: str) -> None:
        # While the claim loop waits for the database it logs the outage, once per backoff step.
        if self._database.waiting.is_set():
            logger.debug(message, exc_info=True)
        else:
            logger.exception(message)

    def _heartbeat_one(self, job_id: int) -> None:
        with self._lock:
            held = self._held.get(job_id)
        if held is not None:
            self._extend([held])

    def _extend(self, held: list[HeldJob]) -> None:
        try:
            alive = sql.claims.extend_leases(self.using, [h.job for h in held], self.lease)
        except DatabaseError:
            self._log_failure("Extending leases failed")
            self._close_connection()
            return
        for job in held:
            if job.job.id not in alive:
                if job.ended:  # its outcome was written meanwhile: finished, not lost
                    continue
                logger.warning("Lease lost id=%s; asking its handler to stop", job.job.id, extra=job_fields(job.job))
                job.context.cancel()
            elif alive[job.job.id]:
                job.context.cancel(requested=True)

    # -- LISTEN --------------------------------------------------------------------------------

    def _listen_forever(self) -> None:
        assert self.listen_using is not None
        while not self._stopping.is_set():
            try:
                with sql.connection.listen(self.listen_using, app_settings.NOTIFY_CHANNEL) as conn:
                    self._listening.set()
                    while not self._stopping.is_set():
                        for notice in conn.notifies(timeout=0.5):
                            if notice.payload in self.queues:
                                self._wake.set()
            except Exception:  # polling covers the gap
                self._listening.clear()
                self._log_failure("LISTEN connection failed; reconnecting")
                self._stopping.wait(1.0)

    # -- schedules -----------------------------------------------------------------------------

    def _schedule_forever(self) -> None:
        # Every worker evaluates; the tick keys make one job per tick. An evaluation that fails is
        # logged and the next one (an interval later) covers its window. Imported here: the
        # scheduler enqueues, and enqueue (eager mode) imports the worker.
        from django_workhorse.schedules import evaluation as scheduler

        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                close_broken_connections()
                enqueued = scheduler.enqueue_due_schedules(using=self.using)
            except Exception:
                self._log_failure("Evaluating the schedules failed; trying again after the interval")
                self._close_connection()
            else:
                if accepted := [r.job_id for r in enqueued if r.outcome is EnqueueOutcome.ACCEPTED]:
                    logger.info("Schedules enqueued %d job(s)%s", len(accepted), job_ids(accepted))
            interval = app_settings.SCHEDULE_INTERVAL.total_seconds()
            self._stopping.wait(max(interval - (time.monotonic() - started), 0))
        connections.close_all()

    # -- shutdown ------------------------------------------------------------------------------

    def _drain(
        self, executors: list[threading.Thread], recorder: threading.Thread, helpers: list[threading.Thread]
    ) -> None:
        self._stopping.set()
        self._say_state()
        self._release_unstarted()
        for _ in range(self.concurrency):
            self._work.put(None)
        deadline = time.monotonic() + self.drain_timeout.total_seconds()
        for thread in executors:
            thread.join(max(deadline - time.monotonic(), 0))
        self._outcomes.put(None)
        recorder.join(30)
        with self._lock:
            still = list(self._held.values())
        if still:
            logger.warning("Releasing jobs still held after the drain timeout count=%s", len(still))
            for held in still:
                held.context.cancel()
            self._release([(h.job, h.started) for h in still])
        self._heartbeats_done.set()
        for thread in helpers:
            thread.join(5)

    def _say_state(self) -> None:
        recycling = self.kind == "child" and self.max_jobs is not None and self.stats.claimed >= self.max_jobs
        try:
            sql.housekeeping.set_worker_state(self.using, self.name, "recycling" if recycling else self._stop_state)
        except DatabaseError:
            logger.exception("Saying the worker's state failed")
            self._close_connection()

    def _deregister(self) -> None:
        try:
            sql.housekeeping.deregister_worker(self.using, self.name)
        except DatabaseError:
            logger.exception("Deregistering the worker failed; maintenance will remove it")
        connections[self.using].close()

    def _release_unstarted(self) -> None:
        unstarted = []
        while True:
            try:
                held = self._work.get_nowait()
            except queue.Empty:
                break
            if held is not None:
                unstarted.append(held)
        if unstarted:
            self._release([(h.job, False) for h in unstarted])
            with self._lock:
                for held in unstarted:
                    self._held.pop(held.job.id, None)

    def _release(self, held: list[tuple[sql.claims.ClaimedJob, bool]]) -> None:
        try:
            sql.outcomes.release(self.using, held)
        except Exception:  # their leases lapse instead, and another worker reclaims them
            logger.exception("Releasing jobs failed count=%s; their leases will lapse", len(held))
            self._close_connection()

    def _thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=self._supervised, args=(target, name), name=f"workhorse-{name}", daemon=True)
        thread.start()
        return thread

    def _supervised(self, target: Callable[[], None], name: str) -> None:
        # A thread that dies would leave its jobs held (the executor's, the recorder's outcomes)
        # or their leases unextended (the heartbeat's): stop the worker, which releases what it
        # still holds, and make run() report the failure.
        try:
            target()
        except BaseException:
            logger.critical("Worker thread died thread=%s; stopping the worker", name, exc_info=True)
            with self._lock:
                self.stats.failed_threads.append(name)
            self.stop()
        finally:
            connections.close_all()
