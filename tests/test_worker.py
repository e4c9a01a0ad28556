"""The worker, driven through its real loop against real PostgreSQL.

Workers run on their own threads (each thread has its own connection) in burst mode or with
``max_jobs`` so they end by themselves; a worker that does not end in time fails the test.
Nothing waits on a clock: tests poll the database with a deadline or wait on events.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_workhorse import EnqueueOptions, EnqueueRequest, RetryPolicy, enqueue, enqueue_many
from django_workhorse import sql as workhorse_sql
from django_workhorse.exceptions import LeaseLostError
from django_workhorse.models import JOB_READY_IDX, Checkpoint, Job, JobEvent, JobStatus
from django_workhorse.tasks.registry import register
from django_workhorse.worker import HandlerContext, Worker
from tests.conftest import connect_directly
from tests.factories import JobFactory
from tests.worker_tasks import CALLS, WorkerThread, make_worker, run_worker, running, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FAST = RetryPolicy.fixed(timedelta(milliseconds=1))
NEVER_SOON = RetryPolicy.fixed(timedelta(hours=1))


@pytest.fixture(autouse=True)
def _fresh_calls() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


def events(job_id: int) -> list[tuple[str, int]]:
    return list(JobEvent.objects.filter(job_id=job_id).order_by("id").values_list("kind", "attempt"))


def status_of(job_id: int) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job_id)


# -- the happy path -------------------------------------------------------------------------------------


def test_burst_worker_runs_every_job_exactly_once():
    requests = [EnqueueRequest("tests.record", {"n": n}) for n in range(50)]
    job_ids = [result.job_id for result in enqueue_many(requests)]

    stats = run_worker(concurrency=4, batch=4)

    assert stats.claimed == 50
    assert stats.finished == {"succeeded": 50}
    assert sorted(call["n"] for call in CALLS.items()) == list(range(50))
    jobs = Job.objects.filter(pk__in=job_ids)
    assert sorted(jobs.values_list("status", "attempt").distinct()) == [(JobStatus.SUCCEEDED, 1)]
    assert {job.pk: job.result for job in jobs} == {job_id: {"n": n} for n, job_id in enumerate(job_ids)}
    assert all(events(job_id) == [("claimed", 1), ("succeeded", 1)] for job_id in job_ids)


def test_three_burst_workers_share_the_queue_and_run_each_job_once():
    job_ids = [result.job_id for result in enqueue_many([EnqueueRequest("tests.record", {"n": n}) for n in range(90)])]

    workers = [WorkerThread(make_worker(burst=True, concurrency=3, batch=2)).start() for _ in range(3)]
    stats = [w.join() for w in workers]

    assert sum(s.claimed for s in stats) == 90
    assert sorted(call["n"] for call in CALLS.items()) == list(range(90))
    assert Job.objects.filter(pk__in=job_ids, status=JobStatus.SUCCEEDED, attempt=1).count() == 90
    assert JobEvent.objects.filter(kind="claimed").count() == 90


def test_result_is_stored_as_json_for_succeeded_jobs():
    payload = {"list": [1, 2.5, {"nested": None}], "text": "žluťoučký", "flag": True}
    job_id = enqueue("tests.record", payload)

    run_worker()

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.result, job.last_error) == (JobStatus.SUCCEEDED, payload, "")
    assert job.finished_at is not None and job.lease_token is None and job.lease_expires_at is None


# -- ordering and scheduling ------------------------------------------------------------------------------


def test_jobs_run_in_priority_then_run_at_then_id_order():
    base = timezone.now() - timedelta(minutes=1)
    spec = {  # name: (priority, seconds after base)
        "a": (0, 2),
        "b": (5, 4),
        "c": (5, 3),
        "d": (0, 2),  # same priority and run_at as "a", enqueued later: runs after it
        "e": (100, 5),
        "f": (0, 1),
    }
    for name, (priority, seconds) in spec.items():
        enqueue("tests.record", {"name": name}, priority=priority, run_at=base + timedelta(seconds=seconds))

    stats = run_worker(concurrency=1, batch=1)

    assert stats.claimed == 6
    assert [call["name"] for call in CALLS.items()] == ["e", "c", "b", "f", "a", "d"]


def test_priority_order_holds_across_the_queues_of_one_worker():
    base = timezone.now() - timedelta(minutes=1)
    enqueue("tests.record", {"name": "a-low"}, queue="a", priority=0, run_at=base)
    enqueue("tests.record", {"name": "b-high"}, queue="b", priority=50, run_at=base)

    run_worker(queues=["a", "b"], concurrency=1, batch=1)

    assert [call["name"] for call in CALLS.items()] == ["b-high", "a-low"]


def test_a_job_scheduled_later_is_not_run_until_it_is_due():
    job_id = enqueue("tests.record", {"n": 1}, delay=timedelta(hours=1))

    stats = run_worker()

    assert stats.claimed == 0
    assert (status_of(job_id), CALLS.items()) == (JobStatus.QUEUED, [])

    Job.objects.filter(pk=job_id).update(run_at=timezone.now() - timedelta(seconds=1))
    stats = run_worker()

    assert stats.claimed == 1
    assert (status_of(job_id), CALLS.items()) == (JobStatus.SUCCEEDED, [{"n": 1}])


def test_a_worker_only_claims_its_own_queues():
    mine = enqueue("tests.record", {"n": 1}, queue="mine")
    theirs = enqueue("tests.record", {"n": 2}, queue="theirs")

    run_worker(queues=["mine"])

    assert (status_of(mine), status_of(theirs)) == (JobStatus.SUCCEEDED, JobStatus.QUEUED)


def test_notify_wakes_an_idle_worker():
    # Polling every 30 s: only the NOTIFY sent at commit can start the job within the 10 s waited.
    worker = Worker(listen_using="default", poll_interval=30)
    claim_prefix = workhorse_sql.claims.CLAIM.split("%(")[0]
    with connect_directly() as observer, running(worker):
        assert worker.wait_until_listening(10)

        def claim_loop_is_idle() -> bool:
            # After its first (empty) claim the loop waits on the connection that ran the claim.
            row = observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle' "
                "AND left(query, %s) = %s",
                [len(claim_prefix), claim_prefix],
            ).fetchone()
            return bool(row and row[0])

        wait_for(claim_loop_is_idle, what="the worker to make its first claim and go idle")
        job_id = enqueue("tests.record", {"n": 1})

        wait_for(lambda: status_of(job_id) == JobStatus.SUCCEEDED, 10, what="the notified worker to run the job")
    assert CALLS.items() == [{"n": 1}]


# -- failures, retries, dead letters ------------------------------------------------------------------------


def test_retry_after_a_failure_keeps_the_idempotency_key_and_counts_the_attempt():
    job_id = enqueue("tests.fail_until", {"succeed_on": 2}, max_attempts=5, retry_policy=FAST)

    stats = run_worker(max_jobs=2)

    assert stats.finished == {"queued": 1, "succeeded": 1}
    key = f"workhorse-job-{job_id}"
    assert CALLS.items() == [(1, key), (2, key)]
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.result) == (JobStatus.SUCCEEDED, 2, {"attempt": 2})
    assert events(job_id) == [
        ("claimed", 1),
        ("failed", 1),
        ("retry_scheduled", 1),
        ("claimed", 2),
        ("succeeded", 2),
    ]
    failed = JobEvent.objects.get(job_id=job_id, kind="failed")
    assert failed.details["error"].startswith("RuntimeError: boom on attempt 1")


def test_a_retry_waits_for_its_backoff():
    job_id = enqueue("tests.fail_until", {"succeed_on": 2}, max_attempts=5, retry_policy=NEVER_SOON)
    before = timezone.now()

    stats = run_worker()

    assert stats.finished == {"queued": 1}
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 1)
    assert job.run_at >= before + timedelta(minutes=59)
    assert job.last_error.startswith("RuntimeError: boom on attempt 1")
    assert job.lease_token is None and job.finished_at is None


def test_a_job_is_dead_after_max_attempts_with_its_error():
    job_id = enqueue("tests.always_fail", {"n": 1}, max_attempts=3, retry_policy=FAST)

    stats = run_worker(max_jobs=3)

    assert stats.finished == {"queued": 2, "dead": 1}
    assert CALLS.items() == [{"n": 1}] * 3
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.result) == (JobStatus.DEAD, 3, None)
    assert job.last_error.startswith("ValueError: always broken")
    assert "Traceback" in job.last_error and "always_fail" in job.last_error
    assert job.finished_at is not None and job.lease_token is None
    assert events(job_id) == [
        ("claimed", 1), ("failed", 1), ("retry_scheduled", 1),
        ("claimed", 2), ("failed", 2), ("retry_scheduled", 2),
        ("claimed", 3), ("failed", 3), ("dead", 3),
    ]  # fmt: skip

    # Dead is terminal: no worker claims it again.
    assert run_worker().claimed == 0
    assert status_of(job_id) == JobStatus.DEAD


def test_a_job_without_a_handler_is_never_claimed_and_waits_with_its_attempts():
    job_id = enqueue("tests.nobody-handles-this", {"n": 1}, max_attempts=1)

    stats = run_worker()

    assert (stats.claimed, stats.finished) == (0, {})
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.last_error) == (JobStatus.QUEUED, 0, "")
    assert events(job_id) == []


def test_a_job_whose_handler_is_missing_after_all_is_given_back_without_using_an_attempt():
    # The racy edge: the worker says it runs the type, then finds no handler for it.
    job_id = enqueue("tests.nobody-handles-this", {"n": 1}, max_attempts=1)

    stats = run_worker(job_types=["tests.nobody-handles-this"])

    assert stats.finished == {"queued": 1}
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.snoozes, job.last_error) == (JobStatus.QUEUED, 0, 0, "")
    assert job.run_at > timezone.now()
    assert job.claimed_by is not None
    assert events(job_id) == [("claimed", 1), ("held", 1)]


def test_a_job_past_its_deadline_is_dead_without_calling_its_handler():
    job_id = enqueue("tests.record", {"n": 1}, max_attempts=5, deadline=timezone.now() - timedelta(seconds=1))

    stats = run_worker()

    assert stats.finished == {"dead": 1}
    assert CALLS.items() == []
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.DEAD
    assert job.last_error.startswith("DeadlineExceeded")
    assert events(job_id) == [("claimed", 1), ("failed", 1), ("dead", 1)]


def test_a_retry_that_would_start_after_the_deadline_is_not_scheduled():
    deadline = timezone.now() + timedelta(minutes=10)
    job_id = enqueue("tests.always_fail", {"n": 1}, max_attempts=5, retry_policy=NEVER_SOON, deadline=deadline)

    run_worker()

    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.DEAD, 1)
    assert job.last_error.startswith("ValueError: always broken")


def test_an_attempt_longer_than_its_timeout_fails_with_timeout_error():
    job_id = enqueue("tests.hold_db_clock", {"ms": 5}, max_attempts=1, timeout=timedelta(milliseconds=1))

    stats = run_worker()

    assert stats.finished == {"dead": 1}
    assert CALLS.items() == [{"ms": 5}]
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.result) == (JobStatus.DEAD, None)
    assert job.last_error.startswith("TimeoutError")


def test_an_attempt_within_its_timeout_succeeds():
    job_id = enqueue("tests.record", {"n": 1}, timeout=timedelta(minutes=5))

    run_worker()

    assert status_of(job_id) == JobStatus.SUCCEEDED


def test_a_handler_past_its_timeout_is_asked_to_stop():
    job_id = enqueue("tests.wait_for_cancel", {"seconds": 5}, max_attempts=1, timeout=timedelta(milliseconds=50))

    # A short lease: a worker that checks its handlers' timeouts as it heartbeats does so often.
    run_worker(lease=timedelta(seconds=1))

    assert CALLS.items() == [True]
    assert Job.objects.get(pk=job_id).last_error.startswith("TimeoutError")


# -- checkpoints and the context ------------------------------------------------------------------------------


def test_a_checkpoint_is_reused_by_the_next_attempt():
    job_id = enqueue("tests.checkpointed", {"order": 7, "amount": 1200}, max_attempts=3, retry_policy=FAST)

    stats = run_worker(max_jobs=2)

    assert stats.finished == {"queued": 1, "succeeded": 1}
    stored = {"charge_id": "ch_7", "amount": 1200}
    assert CALLS.items() == [("charge", 1), ("after", 1, stored), ("after", 2, stored)]
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.result) == (JobStatus.SUCCEEDED, 2, stored)
    assert list(Checkpoint.objects.filter(job_id=job_id).values_list("name", "value", "attempt")) == [
        ("charge", stored, 1)
    ]
    saved = JobEvent.objects.get(job_id=job_id, kind="checkpoint_saved")
    assert (saved.attempt, saved.details) == (1, {"name": "charge"})


def test_heartbeat_extends_the_lease():
    seen: list[Any] = []

    def beat(ctx: HandlerContext, payload: Any) -> None:
        def expiry() -> Any:
            return Job.objects.values_list("lease_expires_at", flat=True).get(pk=ctx.job_id)

        before = expiry()
        ctx.heartbeat()
        seen.append(wait_for(lambda: expiry() > before, 3, what="the heartbeat to extend the lease"))

    register("tests.heartbeat", beat)
    enqueue("tests.heartbeat", {}, max_attempts=1)

    run_worker(lease=timedelta(minutes=30))

    assert seen == [True]


# -- leases and fencing ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["return", "raise"])
@pytest.mark.parametrize(
    "noticed",
    [
        # lease 1 s: the worker's heartbeat (every lease / 3) finds the lease gone and cancels the
        # handler before it goes on.
        pytest.param(True, id="heartbeat_noticed"),
        # lease 30 min: no heartbeat runs during the test, so only the SQL fences (the lease token
        # in SAVE_CHECKPOINT and in the outcome write) stop the stalled handler.
        pytest.param(False, id="only_sql_fences"),
    ],
)
def test_a_stalled_handler_whose_lease_was_taken_cannot_complete_fail_or_checkpoint(outcome, noticed):
    started, release = threading.Event(), threading.Event()
    seen: dict[str, Any] = {"stage_calls": 0}

    def stage() -> str:
        seen["stage_calls"] += 1
        return "late value"

    def stalled(ctx: HandlerContext, payload: Any) -> str:
        seen["ctx"] = ctx
        started.set()
        assert release.wait(30)
        try:
            ctx.checkpoint("late", stage)
        except LeaseLostError as exc:
            seen["checkpoint_error"] = exc
        if outcome == "raise":
            raise RuntimeError("late failure")
        return "late result"

    register("tests.stalled", stalled)
    job_id = enqueue("tests.stalled", {}, max_attempts=5, retry_policy=FAST)
    lease = timedelta(seconds=1) if noticed else timedelta(minutes=30)
    worker = WorkerThread(make_worker(max_jobs=1, lease=lease)).start()
    assert started.wait(10)

    # Another worker took the job over (its lease expired and it was claimed again).
    stolen = uuid.uuid4()
    Job.objects.filter(pk=job_id).update(lease_token=stolen, lease_expires_at=timezone.now() + timedelta(hours=1))
    if noticed:
        wait_for(lambda: seen["ctx"].cancelled, 10, what="the heartbeat to notice the lost lease")
    release.set()
    stats = worker.join()

    assert stats.finished == {"lost": 1}
    assert isinstance(seen["checkpoint_error"], LeaseLostError)
    # A worker that knows its lease is gone does not start the stage; one that does not know
    # runs it (its effect is the at-least-once window) but cannot store it.
    assert seen["stage_calls"] == (0 if noticed else 1)
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.lease_token, job.attempt, job.result, job.last_error) == (
        JobStatus.RUNNING, stolen, 1, None, ""
    )  # fmt: skip
    assert not Checkpoint.objects.filter(job_id=job_id).exists()
    assert events(job_id) == [("claimed", 1)]


def test_an_expired_lease_is_reclaimed_and_the_job_runs_again():
    job = JobFactory(
        job_type="tests.record_ctx",
        payload={"n": 1},
        status=JobStatus.RUNNING,
        attempt=1,
        max_attempts=3,
        lease_token=uuid.uuid4(),
        lease_expires_at=timezone.now() - timedelta(seconds=1),
        started_at=timezone.now() - timedelta(minutes=1),
    )

    stats = run_worker()

    assert stats.finished == {"succeeded": 1}
    assert CALLS.items() == [{"job_id": job.pk, "attempt": 2, "key": f"workhorse-job-{job.pk}", "payload": {"n": 1}}]
    job.refresh_from_db()
    assert (job.status, job.attempt, job.result) == (JobStatus.SUCCEEDED, 2, {"attempt": 2})
    assert events(job.pk) == [("lease_expired", 1), ("claimed", 2), ("succeeded", 2)]


def test_an_expired_lease_on_the_last_attempt_makes_the_job_dead():
    job = JobFactory(
        job_type="tests.record",
        status=JobStatus.RUNNING,
        attempt=2,
        max_attempts=2,
        lease_token=uuid.uuid4(),
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )

    stats = run_worker()

    assert stats.claimed == 0
    assert CALLS.items() == []
    job.refresh_from_db()
    assert (job.status, job.attempt, job.lease_token) == (JobStatus.DEAD, 2, None)
    assert job.last_error == "lease expired on the last attempt"
    assert job.finished_at is not None
    assert events(job.pk) == [("lease_expired", 2), ("dead", 2)]


def test_a_live_lease_is_not_reclaimed():
    token = uuid.uuid4()
    job = JobFactory(
        job_type="tests.record",
        status=JobStatus.RUNNING,
        attempt=1,
        lease_token=token,
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )

    assert run_worker().claimed == 0

    job.refresh_from_db()
    assert (job.status, job.lease_token, job.attempt) == (JobStatus.RUNNING, token, 1)
    assert events(job.pk) == []


# -- stopping --------------------------------------------------------------------------------------------------


def _register_outliving_handler(job_type: str, started: threading.Event) -> None:
    """Attempt 1 of a job with ``block`` in its payload runs until the worker cancels it (the drain
    timeout); other attempts and jobs return at once."""

    def outlive(ctx: HandlerContext, payload: Any) -> dict[str, int]:
        CALLS.add((payload["name"], ctx.attempt))
        if ctx.attempt == 1 and payload.get("block"):
            started.set()
            wait_for(lambda: ctx.cancelled, 30, what="the drain to cancel the handler")
            ctx.raise_if_cancelled()
        return {"attempt": ctx.attempt}

    register(job_type, outlive)


def test_stop_releases_running_and_unstarted_jobs_at_once():
    started = threading.Event()
    _register_outliving_handler("tests.outlives_drain", started)
    running_id = enqueue("tests.outlives_drain", {"name": "running", "block": True}, priority=10, max_attempts=3)
    waiting_id = enqueue("tests.outlives_drain", {"name": "waiting"}, max_attempts=3)
    # One executor, batches of two: the second job is claimed and waits for the executor.
    worker = WorkerThread(
        make_worker(concurrency=1, batch=2, lease=timedelta(minutes=5), drain_timeout=timedelta(milliseconds=100))
    ).start()
    assert started.wait(10)
    assert Job.objects.filter(pk__in=[running_id, waiting_id], status=JobStatus.RUNNING).count() == 2

    worker.stop()

    assert CALLS.items() == [("running", 1)]
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=[running_id, waiting_id])}
    # Both are back in the queue at once (not after the 5 minute lease); only a started attempt counts.
    assert [(jobs[i].status, jobs[i].attempt, jobs[i].lease_token) for i in (running_id, waiting_id)] == [
        (JobStatus.QUEUED, 1, None),
        (JobStatus.QUEUED, 0, None),
    ]
    assert events(running_id)[-1] == ("released", 1)
    assert events(waiting_id) == [("claimed", 1), ("released", 0)]

    run_worker()

    assert CALLS.items()[1:] == [("running", 2), ("waiting", 1)]
    assert sorted(Job.objects.values_list("id", "status", "attempt")) == [
        (running_id, JobStatus.SUCCEEDED, 2),
        (waiting_id, JobStatus.SUCCEEDED, 1),
    ]


def test_a_job_released_during_its_last_attempt_is_dead():
    started = threading.Event()
    _register_outliving_handler("tests.outlives_drain_last", started)
    job_id = enqueue("tests.outlives_drain_last", {"name": "last", "block": True}, max_attempts=1)
    worker = WorkerThread(make_worker(drain_timeout=timedelta(milliseconds=100))).start()
    assert started.wait(10)
    worker.stop()

    assert run_worker().claimed == 0

    assert CALLS.items() == [("last", 1)]
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.lease_token) == (JobStatus.DEAD, 1, None)
    assert job.last_error == "interrupted by a worker shutdown on the last attempt"
    assert events(job_id) == [("claimed", 1), ("released", 1), ("dead", 1)]


# -- connections ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conn_max_age",
    [
        pytest.param(0, id="conn_max_age_0"),
        pytest.param(None, id="persistent"),
    ],
)
def test_worker_carries_on_after_its_connections_are_terminated(monkeypatch, conn_max_age):
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", conn_max_age)
    worker = Worker(concurrency=2, listen_using="default", poll_interval=0.05)
    with running(worker), connect_directly() as admin:
        first = enqueue("tests.record", {"n": 0})
        assert worker.wait_until_listening(10)
        wait_for(lambda: status_of(first) == JobStatus.SUCCEEDED, what="the first job")
        connection.close()  # the test's own session is not the worker's: keep it out of the way

        killed = admin.execute(
            "SELECT pid, pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchall()
        # At least the LISTEN session and the session that recorded the first outcome were there
        # to be killed (a session that closed meanwhile is reported as not terminated).
        assert sum(ok for _, ok in killed) >= 2, killed

        job_ids = [enqueue("tests.record", {"n": n}) for n in range(1, 5)]
        wait_for(
            lambda: Job.objects.filter(pk__in=job_ids, status=JobStatus.SUCCEEDED).count() == 4,
            10,
            what="the jobs enqueued after the connections were killed",
        )
    assert sorted(call["n"] for call in CALLS.items()) == [0, 1, 2, 3, 4]
    assert list(Job.objects.filter(pk__in=job_ids).values_list("attempt", flat=True).distinct()) == [1]


# -- the claim query's plan -----------------------------------------------------------------------------------------


def _plan_nodes(
    plan: dict[str, Any], parents: tuple[str, ...] = ()
) -> Iterator[tuple[dict[str, Any], tuple[str, ...]]]:
    yield plan, parents
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child, (*parents, plan["Node Type"]))


@pytest.mark.parametrize("queues", [["default"], ["default", "mail"]], ids=["one_queue", "two_queues"])
def test_claim_uses_the_ready_index_with_a_large_finished_backlog(queues):
    finished = [JobFactory.build(status=JobStatus.SUCCEEDED, attempt=1) for _ in range(3000)]
    Job.objects.bulk_create(finished, batch_size=1000)
    for n in range(5):
        enqueue("tests.record", {"n": n}, queue=queues[n % len(queues)], priority=n)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workhorse_job")

    params = {
        "queues": queues, "fair_queues": [], "fair_after": [], "fair_unkeyed": [], "limit": 10, "lease": timedelta(seconds=30),
        "worker": "explain", "rate_limits": "{}",
    }  # fmt: skip
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + workhorse_sql.claims.CLAIM, params)
        plan = _json(cursor.fetchone()[0])[0]["Plan"]
        transaction.set_rollback(True)

    scans = [(node, parents) for node, parents in _plan_nodes(plan) if node.get("Relation Name") == "workhorse_job"]
    ready = [(node, parents) for node, parents in scans if node.get("Index Name") == JOB_READY_IDX]
    assert ready, f"the claim does not use {JOB_READY_IDX}: {plan}"
    # The index gives the claim order: no sort between the scan and the nearest LIMIT above it.
    node, parents = ready[0]
    assert "Limit" in parents, (parents, plan)
    below_limit = parents[len(parents) - parents[::-1].index("Limit") :]
    assert "Sort" not in below_limit and "Incremental Sort" not in below_limit, (parents, plan)
    assert all(n.get("Node Type") != "Seq Scan" for n, _ in scans), plan


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def test_enqueue_options_value_is_honoured_by_the_worker():
    options = EnqueueOptions(queue="opts", max_attempts=1)
    job_id = enqueue("tests.always_fail", {"n": 1}, options)

    run_worker(queues=["opts"])

    assert (status_of(job_id), Job.objects.get(pk=job_id).attempt) == (JobStatus.DEAD, 1)
