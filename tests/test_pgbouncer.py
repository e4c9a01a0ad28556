"""The library through a real PgBouncer in transaction pooling mode (tests/pgbouncer.py).

"pooled" is a pool of many server connections, "pooled_single" a pool of one: every client of it
shares one server session, which is what makes session state (an advisory lock, a ``SET``)
visibly wrong behind a pooler. LISTEN runs on "default", which reaches PostgreSQL directly.
The tests run with WORKHORSE_PREPARED_STATEMENTS off (what PgBouncer before 1.21 needs); those
marked for both modes also run with it on when the installed PgBouncer keeps prepared statements.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connections, transaction
from django.http import HttpResponse, JsonResponse
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext, override_settings

from django_workhorse import (
    EnqueueIdempotencyConflictError,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    Idempotency,
    enqueue,
    enqueue_many,
    enqueue_with_result,
)
from django_workhorse import sql as workhorse_sql
from django_workhorse.http import idempotent
from django_workhorse.models import Job, JobStatus, Lease
from django_workhorse.operations.maintenance import MAINTENANCE_LEASE_NAME, run_maintenance
from django_workhorse.schedules.evaluation import enqueue_due_schedules
from django_workhorse.worker import Worker
from tests.conftest import race
from tests.pgbouncer import POOLED, POOLED_SINGLE, PgBouncer
from tests.processes import WorkerProcess, worker_spawner
from tests.worker_tasks import CALLS, make_worker, run_worker, running, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", POOLED, POOLED_SINGLE]),
    pytest.mark.usefixtures("pgbouncer"),
]

ROOT = Path(__file__).resolve().parent.parent
WORKER_MAIN = ROOT / "tests" / "worker_main.py"
KEY = Idempotency("order:1", scope="pgbouncer")


@pytest.fixture(autouse=True)
def _unprepared(settings: Any) -> Iterator[None]:
    settings.WORKHORSE_PREPARED_STATEMENTS = False
    CALLS.clear()
    yield
    CALLS.clear()


@pytest.fixture(params=[False, True], ids=["unprepared", "prepared"])
def statement_mode(request: Any, settings: Any, pgbouncer: PgBouncer, _unprepared: None) -> bool:
    """Both values of WORKHORSE_PREPARED_STATEMENTS; on only where the pooler keeps prepared statements."""
    if request.param and not pgbouncer.keeps_prepared_statements:
        version = ".".join(map(str, pgbouncer.version))
        pytest.skip(f"PgBouncer {version} keeps no prepared statements (1.21+ with max_prepared_statements does)")
    settings.WORKHORSE_PREPARED_STATEMENTS = request.param
    return bool(request.param)


def single_session(pgbouncer: PgBouncer) -> psycopg.Connection[Any]:
    """A new client of the one-server-connection pool."""
    entry = connections[POOLED_SINGLE].settings_dict
    return pgbouncer.connect(entry["NAME"], entry["USER"] or "postgres")


def backend_pid(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


# -- what a transaction pooler does to session state ---------------------------------------------


def test_clients_of_the_single_pool_share_one_server_session(pgbouncer):
    with single_session(pgbouncer) as first, single_session(pgbouncer) as second:
        pids = {conn.execute("SELECT pg_backend_pid()").fetchone()[0] for conn in (first, second, first)}
    assert len(pids) == 1


def test_a_session_advisory_lock_excludes_nobody_behind_the_pooler(pgbouncer):
    # The lock maintenance used to take: two clients both "get" it, because it belongs to the
    # server session they share, and would both have run maintenance.
    with single_session(pgbouncer) as first, single_session(pgbouncer) as second:
        try:
            assert first.execute("SELECT pg_try_advisory_lock(1234)").fetchone()[0] is True
            assert second.execute("SELECT pg_try_advisory_lock(1234)").fetchone()[0] is True
        finally:
            first.execute("SELECT pg_advisory_unlock_all()")


def test_prepared_statements_break_behind_a_pooler_that_cannot_keep_them(pgbouncer):
    if pgbouncer.keeps_prepared_statements:
        pytest.skip("this PgBouncer keeps prepared statements")
    # Why WORKHORSE_PREPARED_STATEMENTS must be off there: psycopg names each connection's
    # statements _pg3_0, _pg3_1, ...; two clients of one server session collide on the first.
    with single_session(pgbouncer) as first, single_session(pgbouncer) as second:
        first.execute("SELECT 1", prepare=True)
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
            second.execute("SELECT 1", prepare=True)


def test_a_claim_leaves_no_planner_setting_on_the_shared_server_session(pgbouncer):
    enqueue("tests.record", {"n": 1}, using=POOLED_SINGLE)
    [claimed] = workhorse_sql.claims.claim(
        POOLED_SINGLE, queues=["default"], limit=1, lease=timedelta(seconds=30), worker="w"
    )
    assert claimed.payload == {"n": 1}
    with single_session(pgbouncer) as other:
        assert other.execute("SHOW plan_cache_mode").fetchone()[0] == "auto"


@override_settings(WORKHORSE_PREPARED_STATEMENTS=True)
def test_with_prepared_statements_a_pooled_alias_sets_generic_plans_for_its_claim_transaction_only():
    # The path a PgBouncer 1.21+ alias takes (prepared statements on, DISABLE_SERVER_SIDE_CURSORS),
    # on a direct connection so that the session can be inspected afterwards.
    direct = connections["default"].settings_dict
    enqueue("tests.record", {"n": 1})
    enqueue("tests.record", {"n": 2})
    direct["DISABLE_SERVER_SIDE_CURSORS"] = True
    try:
        assert len(
            workhorse_sql.claims.claim("default", queues=["default"], limit=1, lease=timedelta(seconds=30), worker="w")
        )
        assert show_plan_cache_mode("default") == "auto"
    finally:
        direct.pop("DISABLE_SERVER_SIDE_CURSORS")
    # A direct alias keeps it for the session: set once, not per claim.
    assert len(
        workhorse_sql.claims.claim("default", queues=["default"], limit=1, lease=timedelta(seconds=30), worker="w")
    )
    assert show_plan_cache_mode("default") == "force_generic_plan"
    connections["default"].close()


def show_plan_cache_mode(alias: str) -> str:
    with connections[alias].cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        return str(cursor.fetchone()[0])


# -- the maintenance lease -------------------------------------------------------------------------


class BlockedStep:
    """Holds a maintenance run inside its "stale workers" step until ``release``; records who was inside."""

    def __init__(self, monkeypatch: Any, *, on: Callable[[], bool]) -> None:
        self.inside = threading.Event()
        self.released = threading.Event()
        self.pids: list[int] = []
        self._real = workhorse_sql.housekeeping.prune_stale_workers
        self._on = on
        monkeypatch.setattr(workhorse_sql.housekeeping, "prune_stale_workers", self._step)

    def _step(self, alias: str, stale_after: timedelta) -> int:
        if self._on():
            self.pids.append(backend_pid(alias))
            self.inside.set()
            assert self.released.wait(60), "the test never let the maintenance run go on"
        return self._real(alias, stale_after)

    def release(self) -> None:
        self.released.set()


def _in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(target())
        except BaseException as exc:  # reported by the test
            result.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_the_maintenance_lease_holds_for_another_client_of_the_same_server_session(monkeypatch):
    # The case the session advisory lock got wrong: two clients of one server session.
    holder_threads: list[threading.Thread] = []
    step = BlockedStep(monkeypatch, on=lambda: threading.current_thread() in holder_threads)
    thread, result = _in_thread(lambda: run_maintenance(using=POOLED_SINGLE))
    holder_threads.append(thread)
    assert step.inside.wait(60)
    try:
        # Between statements the first run holds no transaction, so this client gets the very
        # same server session; the lease row still says the maintenance is taken.
        assert backend_pid(POOLED_SINGLE) == step.pids[0]
        assert run_maintenance(using=POOLED_SINGLE).ran is False
    finally:
        step.release()
        thread.join(60)
    assert result[0].ran is True
    assert run_maintenance(using=POOLED_SINGLE).ran is True
    assert Lease.objects.get(name=MAINTENANCE_LEASE_NAME).expires_at <= datetime.now(timezone.utc)


def test_only_one_of_many_racing_maintenance_runs_through_the_pooler_holds_the_lease(monkeypatch):
    holder_threads: list[threading.Thread] = []
    step = BlockedStep(monkeypatch, on=lambda: threading.current_thread() in holder_threads)
    thread, result = _in_thread(lambda: run_maintenance(using=POOLED))
    holder_threads.append(thread)
    assert step.inside.wait(60)
    try:
        # Eight more runs at once, each on its own client connection (and server connection).
        reports = race(8, lambda _: run_maintenance(using=POOLED))
        assert [report.ran for report in reports] == [False] * 8
    finally:
        step.release()
        thread.join(60)
    assert result[0].ran is True


def test_two_workers_through_the_pooler_take_turns_at_maintenance(monkeypatch, settings):
    # Two real workers try maintenance at every turn of their loops. The one inside holds on until
    # it has seen the other refused, and no two runs are ever inside at once.
    settings.WORKHORSE_MAINTENANCE_INTERVAL = timedelta(milliseconds=1)
    lock = threading.Lock()
    inside: list[str] = []
    overlaps: list[list[str]] = []
    refused = threading.Event()
    runs = []
    real_take = workhorse_sql.leases.take_lease
    real_step = workhorse_sql.housekeeping.prune_stale_workers

    def take(alias: str, name: str, ttl: timedelta) -> Any:
        holder = real_take(alias, name, ttl)
        if holder is None:
            refused.set()
        return holder

    def step(alias: str, stale_after: timedelta) -> int:
        me = str(threading.get_ident())
        with lock:
            inside.append(me)
            if len(inside) > 1:
                overlaps.append(list(inside))
        refused.clear()
        try:
            assert refused.wait(60), "the other worker never tried maintenance meanwhile"
            runs.append(me)
            return real_step(alias, stale_after)
        finally:
            with lock:
                inside.remove(me)

    monkeypatch.setattr(workhorse_sql.leases, "take_lease", take)
    monkeypatch.setattr(workhorse_sql.housekeeping, "prune_stale_workers", step)
    workers = [make_worker(using=POOLED, name=f"w{i}", scheduler=False) for i in range(2)]
    with running(workers[0]), running(workers[1]):
        wait_for(lambda: len(runs) >= 4, 60, what="four maintenance runs")
    assert overlaps == []


# -- enqueue ----------------------------------------------------------------------------------------


def test_enqueue_through_the_pooler(statement_mode):
    plain = enqueue("tests.record", {"n": 1}, using=POOLED)
    first = enqueue_with_result("tests.record", {"n": 2}, using=POOLED, idempotency=KEY)
    again = enqueue_with_result("tests.record", {"n": 2}, using=POOLED, idempotency=KEY)

    assert first.outcome is EnqueueOutcome.ACCEPTED
    assert (again.job_id, again.outcome) == (first.job_id, EnqueueOutcome.REPLAYED)
    assert set(Job.objects.using("default").values_list("id", flat=True)) == {plain, first.job_id}


def test_a_conflict_through_the_pooler_leaves_the_transaction_usable(statement_mode):
    with transaction.atomic(using=POOLED):
        owner = enqueue("tests.record", {"n": 1}, using=POOLED, idempotency=KEY)
        with pytest.raises(EnqueueIdempotencyConflictError):
            enqueue("tests.record", {"n": 2}, using=POOLED, idempotency=KEY)
        after = enqueue("tests.record", {"n": 3}, using=POOLED)
    assert set(Job.objects.using("default").values_list("id", flat=True)) == {owner, after}


def test_enqueue_many_through_the_pooler(statement_mode):
    # Even rows unkeyed; odd rows share 25 keys (each key's requests are identical).
    requests = [
        EnqueueRequest("tests.record", {"n": n})
        if n % 2 == 0
        else EnqueueRequest(
            "tests.record", {"k": n % 50}, EnqueueOptions(idempotency=Idempotency(f"k{n % 50}", scope="b"))
        )
        for n in range(500)
    ]
    results = enqueue_many(requests, using=POOLED)
    again = enqueue_many(requests, using=POOLED)

    assert len(results) == 500 and len({r.job_id for r in results}) == 250 + 25
    assert [r.job_id for r in again if r.outcome is EnqueueOutcome.REPLAYED] == [r.job_id for r in results[1::2]]
    assert Job.objects.using("default").count() == 250 + 25 + 250


def test_racing_producers_through_the_pooler_get_one_job(statement_mode):
    results = race(8, lambda _: enqueue_with_result("tests.record", {"n": 1}, using=POOLED, idempotency=KEY))

    assert not [r for r in results if isinstance(r, BaseException)]
    assert sorted(r.outcome.value for r in results) == ["accepted"] + ["replayed"] * 7
    assert len({r.job_id for r in results}) == 1
    assert Job.objects.using("default").count() == 1


# -- @idempotent views ------------------------------------------------------------------------------


def pooled_view(gate: threading.Event | None = None, entered: threading.Event | None = None) -> Callable[..., Any]:
    @idempotent("tests.pooled", using=POOLED, anonymous=True)
    def view(request: Any) -> HttpResponse:
        if entered is not None:
            entered.set()
        if gate is not None:
            assert gate.wait(30)
        job_id = enqueue("tests.record", {"n": 1}, using=POOLED)
        return JsonResponse({"job": job_id}, status=201)

    return view


def keyed_post(key: str) -> Any:
    return RequestFactory().post("/orders/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


def test_an_idempotent_view_through_the_pooler_replays_and_sees_a_request_in_flight(statement_mode):
    gate, entered = threading.Event(), threading.Event()
    view = pooled_view(gate, entered)
    first: list[Any] = []

    def run_first() -> None:
        try:
            first.append(view(keyed_post("k-1")))
        finally:
            connections.close_all()

    running_first = threading.Thread(target=run_first, daemon=True)
    running_first.start()
    wait_for(entered.is_set, what="the first request to enter the view")
    busy = pooled_view()(keyed_post("k-1"))  # another pooled server connection, same key
    gate.set()
    running_first.join(30)
    replay = pooled_view()(keyed_post("k-1"))

    assert busy.status_code == 409
    assert (first[0].status_code, replay.status_code, replay["Idempotent-Replayed"]) == (201, 201, "true")
    assert replay.content == first[0].content
    assert Job.objects.using("default").count() == 1


def test_a_pooled_commit_notifies_a_direct_listener(listener):
    enqueue("tests.record", {"n": 1}, queue="mail", using=POOLED)
    assert listener(30, count=1) == ["mail"]


def test_a_wait_through_the_pooler_is_woken_by_the_result_listener_on_the_direct_alias(settings, monkeypatch):
    from django_workhorse import wait_for as wait_for_result
    from django_workhorse.awaiting import listener as listeners
    from django_workhorse.awaiting import waiting

    settings.WORKHORSE_RESULT_LISTEN_DATABASE = "default"  # LISTEN straight to PostgreSQL
    monkeypatch.setattr(waiting, "POLL_SECONDS", 3600.0)  # only a wake-up can end the wait
    monkeypatch.setattr(waiting, "DOWN_POLL_SECONDS", 3600.0)
    job_id = enqueue("tests.record", {"n": 3}, using=POOLED)
    got: list[Any] = []

    def wait() -> None:
        try:
            got.append(wait_for_result(job_id, timeout=60, using=POOLED))
        finally:
            connections.close_all()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    try:
        wait_for(lambda: Job.objects.filter(pk=job_id, awaited=True).exists(), what="the wait's flag")
        wait_for(listeners.listener("default").up.is_set, what="the direct result listener")
        run_worker(using=POOLED)  # the outcome commits through the pooler and notifies
        waiter.join(30)
        assert got == [{"n": 3}]
        assert listeners.listener(POOLED).connections == 0  # nothing LISTENed through the pooler
    finally:
        listeners.listener("default").stop()


# -- the worker -------------------------------------------------------------------------------------


def test_a_burst_worker_through_the_pooler_runs_every_job_once(statement_mode):
    job_ids = [r.job_id for r in enqueue_many([EnqueueRequest("tests.record", {"n": n}) for n in range(40)])]

    stats = run_worker(using=POOLED, concurrency=4, batch=4)

    assert stats.finished == {"succeeded": 40}
    assert sorted(CALLS.items(), key=lambda p: p["n"]) == [{"n": n} for n in range(40)]
    assert set(Job.objects.filter(id__in=job_ids).values_list("status", flat=True)) == {JobStatus.SUCCEEDED}


def test_a_worker_through_the_pooler_listening_on_a_direct_alias_runs_jobs_enqueued_through_the_pooler():
    worker = Worker(using=POOLED, listen_using="default", concurrency=2, poll_interval=0.05, scheduler=False)
    with running(worker) as handle:
        assert handle.worker.wait_until_listening(30)
        job_ids = [enqueue("tests.record", {"n": n}, using=POOLED) for n in range(10)]
        wait_for(
            lambda: Job.objects.filter(id__in=job_ids, status=JobStatus.SUCCEEDED).count() == 10,
            60,
            what="the jobs to succeed",
        )


@pytest.fixture
def spawn(tmp_path: Path, pgbouncer: PgBouncer) -> Iterator[Callable[..., WorkerProcess]]:
    env = {
        "WORKHORSE_TEST_PGBOUNCER": f"{pgbouncer.host}:{pgbouncer.port}",
        "WORKHORSE_TEST_PREPARED_STATEMENTS": "0",
    }
    with worker_spawner(tmp_path, [sys.executable, str(WORKER_MAIN)], env=env) as start:
        yield start


def test_a_worker_process_through_the_pooler_with_a_direct_listen_database(spawn):
    worker = spawn(
        "--database", POOLED, "--listen-database", "default", "--poll-interval", "0.05", "--concurrency", "2"
    )
    job_ids = [enqueue("tests.record", {"n": n}, using=POOLED) for n in range(10)]
    wait_for(
        lambda: Job.objects.filter(id__in=job_ids, status=JobStatus.SUCCEEDED).count() == 10,
        60,
        what="the worker process to run the jobs",
    )
    worker.popen.send_signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    assert "Claimed 10 job(s); finished: {'succeeded': 10}." in worker.output()


# -- schedules and the admin -----------------------------------------------------------------------

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)


@override_settings(WORKHORSE_SCHEDULES={"tick": {"task": "tests.record", "every": timedelta(minutes=10)}})
def test_schedules_evaluate_through_the_pooler():
    assert enqueue_due_schedules(T0, using=POOLED) == []
    results = race(4, lambda _: enqueue_due_schedules(T0 + timedelta(minutes=30), using=POOLED))

    assert not [r for r in results if isinstance(r, BaseException)]
    ticks = Job.objects.using("default").order_by("scheduled_for").values_list("scheduled_for", flat=True)
    assert list(ticks) == [T0 + timedelta(minutes=30)]  # catch_up="latest": one job for the window


@override_settings(DATABASE_ROUTERS=["tests.pgbouncer.EverythingThroughThePooler"])
def test_the_admin_through_the_pooler(client):
    user = get_user_model().objects.create_superuser("admin", "admin@example.com", "x")
    client.force_login(user)
    enqueue("tests.record", {"n": 1}, idempotency=KEY)
    run_worker(using=POOLED)
    dead = enqueue("tests.always_fail", {"n": 2}, max_attempts=1)
    run_worker(using=POOLED)

    pages = [
        "/admin/workhorse/job/",
        "/admin/workhorse/job/dashboard/",
        "/admin/workhorse/deadjob/",
        f"/admin/workhorse/deadjob/{dead}/change/",
        "/admin/workhorse/idempotencybinding/",
        "/admin/workhorse/workerrecord/",
        "/admin/workhorse/schedulestate/",
    ]
    with CaptureQueriesContext(connections[POOLED]) as pooled, CaptureQueriesContext(connections["default"]) as direct:
        statuses = {page: client.get(page).status_code for page in pages}
    assert statuses == dict.fromkeys(pages, 200)
    assert len(pooled) > 0 and len(direct) == 0


# -- the system check of prepared statements behind a pooler -------------------------------------


def test_the_check_warns_of_prepared_statements_through_a_pooler_that_does_not_keep_them(pgbouncer, settings):
    from io import StringIO

    from django.core.management import call_command

    from django_workhorse.checks import check_prepared_statements

    aliases = ["default", POOLED, POOLED_SINGLE]
    settings.WORKHORSE_PREPARED_STATEMENTS = True

    warned = [(w.id, w.msg.split(" is reached")[0]) for w in check_prepared_statements(databases=aliases)]
    err = StringIO()
    call_command("check", "--database", POOLED, stderr=err)

    if pgbouncer.keeps_prepared_statements:  # 1.21+ with max_prepared_statements (tests/pgbouncer.py sets it)
        assert warned == [] and "workhorse.W001" not in err.getvalue()
    else:
        assert warned == [("workhorse.W001", f"Database {POOLED!r}"), ("workhorse.W001", f"Database {POOLED_SINGLE!r}")]
        assert "(workhorse.W001) Database 'pooled' is reached through a connection pooler" in err.getvalue()
    with single_session(pgbouncer) as conn:  # the check's statements are gone from the server session
        left = conn.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%workhorse_check_%"]
        )
        assert left.fetchone()[0] == 0
    settings.WORKHORSE_PREPARED_STATEMENTS = False
    assert check_prepared_statements(databases=aliases) == []
