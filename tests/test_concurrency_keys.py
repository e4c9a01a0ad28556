"""Concurrency keys: at most ``concurrency_limit`` jobs of a key run at once, enforced by the claim.

Each running job of a key holds one of the key's slots 1..limit, and the partial unique index
workhorse_job_concurrency_slot_uniq over running jobs is what holds the line. These tests run real
workers on their own threads and racing claims on their own connections against real PostgreSQL.
Handlers that hold a key's slots wait on a gate (``tests.worker_tasks.GATE``) until the test lets
them out, one at a time and only after every worker has tried to claim again; nothing waits on a
clock, and nothing asserts on timing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, OperationalError, connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_workhorse import EnqueueOptions, EnqueueRequest, enqueue, enqueue_many, redrive
from django_workhorse import sql as workhorse_sql
from django_workhorse.models import JOB_CONCURRENCY_SLOT_UNIQ, Job, JobStatus
from django_workhorse.worker.execution import Outcome, record
from tests.conftest import connect_directly, race
from tests.factories import JobFactory
from tests.worker_tasks import CALLS, GATE, WorkerThread, make_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ALIAS = "default"
LEASE = timedelta(minutes=5)
KEY = "tenant-1"
DEADLOCK_DETECTED = "40P01"


@pytest.fixture(autouse=True)
def _fresh_gate_and_calls() -> Iterator[None]:
    GATE.reset()
    CALLS.clear()
    yield
    GATE.reset()
    CALLS.clear()


# -- helpers ------------------------------------------------------------------------------------------


class ClaimLog:
    """Stands in for ``sql.claims.claim``: runs it and notes, per worker, which claims began after a mark."""

    def __init__(self, claim: Any) -> None:
        self._claim = claim
        self._lock = threading.Lock()
        self._begun = 0
        self._done: list[tuple[int, str]] = []

    def __call__(self, alias: str, **kwargs: Any) -> list[workhorse_sql.claims.ClaimedJob]:
        with self._lock:
            self._begun += 1
            number = self._begun
        jobs = self._claim(alias, **kwargs)
        with self._lock:
            self._done.append((number, kwargs["worker"]))
        return jobs

    def mark(self) -> int:
        """The number of the last claim begun so far."""
        with self._lock:
            return self._begun

    def each_claimed_since(self, mark: int, workers: Sequence[str]) -> bool:
        """Whether every worker finished a claim that began after ``mark``."""
        with self._lock:
            return {worker for number, worker in self._done if number > mark} >= set(workers)


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> ClaimLog:
    log = ClaimLog(workhorse_sql.claims.claim)
    monkeypatch.setattr(workhorse_sql.claims, "claim", log)
    return log


@contextmanager
def workers(count: int, *, labels: Sequence[str], **options: Any) -> Iterator[list[str]]:
    """Run ``count`` non-burst workers named w0, w1, ...; yield their names, then stop them.

    On the way out the gates of ``labels`` open, so no handler is left waiting.
    """
    names = [f"w{i}" for i in range(count)]
    threads = [WorkerThread(make_worker(name=name, **options)).start() for name in names]
    try:
        yield names
    finally:
        for label in labels:
            GATE.open(label)
        for thread in threads:
            thread.worker.stop()
        for thread in threads:
            thread.join()


def gated(key: str | None, label: str, **options: Any) -> EnqueueRequest:
    """A ``tests.gated`` job under ``label``, with concurrency ``key`` (and its options) if given."""
    return EnqueueRequest("tests.gated", {"label": label}, EnqueueOptions(concurrency_key=key, **options))


def running_slots(key: str) -> list[int | None]:
    """The slots of the jobs of ``key`` running now, read in a fresh snapshot."""
    jobs = Job.objects.filter(concurrency_key=key, status=JobStatus.RUNNING)
    return sorted(jobs.values_list("concurrency_slot", flat=True), key=lambda slot: -1 if slot is None else slot)


def claim(limit: int = 10, worker: str = "test", lease: timedelta = LEASE) -> list[workhorse_sql.claims.ClaimedJob]:
    return workhorse_sql.claims.claim(ALIAS, queues=["default"], limit=limit, lease=lease, worker=worker)


def slots_of(job_ids: Sequence[int]) -> dict[int, int | None]:
    return dict(Job.objects.filter(pk__in=job_ids).values_list("id", "concurrency_slot"))


def succeed(*jobs: workhorse_sql.claims.ClaimedJob) -> None:
    assert record(ALIAS, [Outcome(job, "succeeded", result_json="null") for job in jobs]) == ["succeeded"] * len(jobs)


def hold_key_through_workers(key: str, limit: int, total: int, names: Sequence[str], claims: ClaimLog) -> list[int]:
    """Let the ``total`` gated jobs of ``key`` out one at a time, each time only once the key ran as
    many of them as it may and every worker claimed again since; return every count of running
    jobs of the key sampled from the database meanwhile."""
    sampled: list[int] = []

    def sample() -> list[int | None]:
        slots = running_slots(key)
        sampled.append(len(slots))
        assert len(slots) <= limit, f"{len(slots)} jobs of {key!r} running at once, limit {limit}: slots {slots}"
        return slots

    for released in range(total):
        expected = min(limit, total - released)

        def holding(released: int = released, expected: int = expected) -> bool:
            sample()
            assert GATE.most_in_flight(key) <= limit, f"{GATE.most_in_flight(key)} handlers of {key!r} ran at once"
            return GATE.exited(key) == released and GATE.in_flight(key) == expected

        wait_for(holding, what=f"{expected} handler(s) of {key!r} in flight after {released} let out")
        mark = claims.mark()

        def every_worker_tried(mark: int = mark) -> bool:
            sample()
            return claims.each_claimed_since(mark, names)

        wait_for(every_worker_tried, what="every worker to claim again while the key is held")
        assert (GATE.in_flight(key), GATE.entered(key)) == (expected, released + expected)
        slots = sample()
        if expected == limit:
            # A slot frees only once its job's outcome is written: at the limit, every slot is held.
            assert slots == list(range(1, limit + 1))
        else:
            assert expected <= len(slots) <= limit and set(slots) <= set(range(1, limit + 1))
        GATE.let_out(key)
    return sampled


def all_succeeded(job_ids: Sequence[int]) -> bool:
    return Job.objects.filter(pk__in=job_ids, status=JobStatus.SUCCEEDED).count() == len(job_ids)


# -- real workers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("limit", "count"), [(2, 24), (3, 12)])
def test_four_workers_run_at_most_limit_jobs_of_a_key_at_once_and_reach_it(claims, limit, count):
    requests = []
    for n in range(count):
        requests.append(gated(KEY, KEY, concurrency_limit=limit))
        if n % 3 == 0:
            requests.append(EnqueueRequest("tests.record", {"n": n}))
    job_ids = [result.job_id for result in enqueue_many(requests)]
    keyed = list(Job.objects.filter(pk__in=job_ids, concurrency_key=KEY).values_list("id", flat=True))
    assert len(keyed) == count

    # Each worker could run every job the key may run at once and still claim more.
    with workers(4, labels=[KEY], concurrency=4, batch=3) as names:
        sampled = hold_key_through_workers(KEY, limit, count, names, claims)
        wait_for(lambda: all_succeeded(job_ids), what="every job to succeed")

    assert GATE.most_in_flight(KEY) == limit
    assert GATE.entered(KEY) == count
    assert max(sampled) == limit
    assert sorted(call["n"] for call in CALLS.items()) == list(range(0, count, 3))
    jobs = Job.objects.filter(pk__in=job_ids)
    assert set(jobs.values_list("status", "attempt")) == {(JobStatus.SUCCEEDED, 1)}
    assert set(jobs.filter(concurrency_key=KEY).values_list("concurrency_slot", flat=True)) == set(range(1, limit + 1))
    assert set(jobs.filter(concurrency_key=None).values_list("concurrency_slot", flat=True)) == {None}


def test_the_same_workers_run_more_than_two_jobs_at_once_without_a_key():
    # The control for the test above: its workers and gate can see more than the limit run at once.
    job_ids = [result.job_id for result in enqueue_many([gated(None, "free") for _ in range(24)])]

    with workers(4, labels=["free"], concurrency=3, batch=3):
        wait_for(lambda: GATE.in_flight("free") > 2, what="more than two handlers in flight")
        GATE.open("free")
        wait_for(lambda: all_succeeded(job_ids), what="every job to succeed")

    assert GATE.most_in_flight("free") > 2
    assert GATE.entered("free") == 24


def test_a_key_at_its_default_limit_of_one_runs_one_job_at_a_time_across_two_workers(claims):
    job_ids = [result.job_id for result in enqueue_many([gated("solo", "solo") for _ in range(6)])]
    assert set(Job.objects.filter(pk__in=job_ids).values_list("concurrency_limit", flat=True)) == {1}

    with workers(2, labels=["solo"], concurrency=3, batch=3) as names:
        sampled = hold_key_through_workers("solo", 1, 6, names, claims)
        wait_for(lambda: all_succeeded(job_ids), what="every job to succeed")

    assert (GATE.most_in_flight("solo"), max(sampled)) == (1, 1)


def test_two_keys_are_limited_independently_by_the_same_workers(claims):
    requests = [gated("a", "a", concurrency_limit=1) for _ in range(4)]
    requests += [gated("b", "b", concurrency_limit=3) for _ in range(6)]
    job_ids = [result.job_id for result in enqueue_many(requests)]

    with workers(3, labels=["a", "b"], concurrency=5, batch=3) as names:

        def at_limits() -> bool:
            assert GATE.most_in_flight("a") <= 1 and GATE.most_in_flight("b") <= 3
            return (GATE.in_flight("a"), GATE.in_flight("b")) == (1, 3)

        wait_for(at_limits, what="both keys at their limits")
        mark = claims.mark()
        wait_for(lambda: claims.each_claimed_since(mark, names), what="every worker to claim again")
        assert (GATE.in_flight("a"), GATE.in_flight("b")) == (1, 3)
        assert (running_slots("a"), running_slots("b")) == ([1], [1, 2, 3])
        GATE.open("a")
        GATE.open("b")
        wait_for(lambda: all_succeeded(job_ids), what="every job to succeed")

    assert (GATE.most_in_flight("a"), GATE.most_in_flight("b")) == (1, 3)


# -- the limit a job gets ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "key", "given", "expected"),
    [
        pytest.param({}, "tenant-1", None, 1, id="default-1"),
        pytest.param({}, "tenant-1", 5, 5, id="given"),
        pytest.param({}, None, None, None, id="no-key-no-limit"),
        pytest.param({"WORKHORSE_DEFAULT_CONCURRENCY_LIMIT": 3}, "tenant-1", None, 3, id="default-setting"),
        pytest.param({"WORKHORSE_CONCURRENCY_LIMITS": {"tenant-9": 4}}, "tenant-9", None, 4, id="per-key-setting"),
        pytest.param({"WORKHORSE_CONCURRENCY_LIMITS": {"tenant-9": 4}}, "tenant-1", None, 1, id="other-key-default"),
        pytest.param(
            {"WORKHORSE_CONCURRENCY_LIMITS": {"tenant-9": 4}, "WORKHORSE_DEFAULT_CONCURRENCY_LIMIT": 3},
            "tenant-1",
            None,
            3,
            id="other-key-default-setting",
        ),
        pytest.param({"WORKHORSE_CONCURRENCY_LIMITS": {"tenant-9": 4}}, "tenant-9", 2, 2, id="given-beats-setting"),
        pytest.param({"WORKHORSE_CONCURRENCY_LIMITS": {"Tenant-9": 4}}, "tenant-9", None, 1, id="exact-key-match"),
    ],
)
@pytest.mark.parametrize("via", ["enqueue", "enqueue_many"])
def test_a_job_stores_the_limit_resolved_at_enqueue(overrides, key, given, expected, via):
    options = EnqueueOptions(concurrency_key=key, concurrency_limit=given)
    with override_settings(**overrides):
        if via == "enqueue":
            job_id = enqueue("tests.record", {}, options)
        else:
            job_id = enqueue_many([EnqueueRequest("tests.record", {}, options)] * 2)[0].job_id

    assert Job.objects.get(pk=job_id).concurrency_limit == expected


def test_the_claim_uses_the_stored_limit_after_the_setting_changes():
    with override_settings(WORKHORSE_DEFAULT_CONCURRENCY_LIMIT=3):
        enqueue_many([EnqueueRequest("tests.record", {}, EnqueueOptions(concurrency_key=KEY))] * 5)

    with override_settings(WORKHORSE_DEFAULT_CONCURRENCY_LIMIT=1):
        assert len(claim()) == 3
    assert running_slots(KEY) == [1, 2, 3]


# -- what one claim takes ------------------------------------------------------------------------------------


def test_a_claim_takes_limit_jobs_of_a_key_in_distinct_slots_and_the_next_takes_a_freed_slot():
    job_ids = [enqueue("tests.record", {"n": n}, concurrency_key=KEY, concurrency_limit=2) for n in range(5)]

    first = claim(limit=10)

    assert [job.id for job in first] == job_ids[:2]
    assert slots_of(job_ids[:2]) == {job_ids[0]: 1, job_ids[1]: 2}
    assert claim(limit=10) == []

    succeed(first[1])  # frees slot 2
    second = claim(limit=10)

    assert [job.id for job in second] == [job_ids[2]]
    assert running_slots(KEY) == [1, 2] and slots_of([job_ids[2]]) == {job_ids[2]: 2}
    assert claim(limit=10) == []

    succeed(first[0], second[0])
    third = claim(limit=10)

    assert [job.id for job in third] == job_ids[3:5]
    assert slots_of(job_ids[3:5]) == {job_ids[3]: 1, job_ids[4]: 2}


def test_one_claim_gives_each_key_its_own_slots():
    a = [enqueue("tests.record", {}, concurrency_key="a", concurrency_limit=2) for _ in range(3)]
    b = [enqueue("tests.record", {}, concurrency_key="b", concurrency_limit=3) for _ in range(4)]
    free = [enqueue("tests.record", {}) for _ in range(2)]

    claimed = claim(limit=20)

    assert sorted(job.id for job in claimed) == sorted(a[:2] + b[:3] + free)
    assert (running_slots("a"), running_slots("b")) == ([1, 2], [1, 2, 3])
    assert slots_of(free) == dict.fromkeys(free)
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 2


def test_a_claim_returns_jobs_in_priority_order_with_keys_mixed_in():
    low = enqueue("tests.record", {}, priority=1)
    keyed_high = enqueue("tests.record", {}, priority=9, concurrency_key=KEY, concurrency_limit=1)
    keyed_blocked = enqueue("tests.record", {}, priority=8, concurrency_key=KEY, concurrency_limit=1)
    middle = enqueue("tests.record", {}, priority=5)

    assert [job.id for job in claim(limit=10)] == [keyed_high, middle, low]
    assert Job.objects.get(pk=keyed_blocked).status == JobStatus.QUEUED


def test_a_saturated_key_does_not_hold_back_jobs_queued_behind_it():
    holder = enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=1, priority=100)
    assert [job.id for job in claim(limit=1)] == [holder]
    ahead = [enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=1, priority=50) for _ in range(5)]
    unkeyed = enqueue("tests.record", {}, priority=5)
    other_key = enqueue("tests.record", {}, concurrency_key="tenant-2", concurrency_limit=1, priority=1)

    assert [job.id for job in claim(limit=1)] == [unkeyed]
    assert [job.id for job in claim(limit=1)] == [other_key]
    assert claim(limit=10) == []
    assert set(Job.objects.filter(pk__in=ahead).values_list("status", flat=True)) == {JobStatus.QUEUED}
    assert slots_of([other_key]) == {other_key: 1}


def test_a_key_with_one_free_slot_gives_one_job_and_the_jobs_behind_still_get_claimed():
    holder = enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=2, priority=100)
    assert [job.id for job in claim(limit=1)] == [holder]
    ahead = [enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=2, priority=50) for _ in range(5)]
    behind = [enqueue("tests.record", {}) for _ in range(2)]

    first = claim(limit=3)
    second = claim(limit=3)

    claimed = [job.id for job in first + second]
    assert sorted(claimed) == sorted([ahead[0], *behind])
    assert running_slots(KEY) == [1, 2]


# -- the database constraint ------------------------------------------------------------------------------------


def running_job(key: str | None, slot: int | None, **fields: Any) -> Job:
    limit = None if key is None else 2
    return JobFactory(
        status=JobStatus.RUNNING, concurrency_key=key, concurrency_limit=limit, concurrency_slot=slot, **fields
    )


def test_the_index_rejects_two_running_jobs_of_a_key_in_one_slot():
    running_job(KEY, 1)
    second = running_job(KEY, 2)

    with pytest.raises(IntegrityError) as caught:
        Job.objects.filter(pk=second.pk).update(concurrency_slot=1)

    assert workhorse_sql.connection.constraint_name(caught.value) == JOB_CONCURRENCY_SLOT_UNIQ
    assert running_slots(KEY) == [1, 2]


def test_the_index_rejects_a_job_entering_running_in_a_taken_slot():
    running_job(KEY, 1)
    queued = JobFactory(status=JobStatus.QUEUED, concurrency_key=KEY, concurrency_limit=2, concurrency_slot=1)

    with pytest.raises(IntegrityError) as caught:
        Job.objects.filter(pk=queued.pk).update(status=JobStatus.RUNNING)

    assert workhorse_sql.connection.constraint_name(caught.value) == JOB_CONCURRENCY_SLOT_UNIQ


@pytest.mark.parametrize(
    "status", [JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED, JobStatus.QUEUED], ids=str
)
def test_a_job_that_is_not_running_may_share_a_running_jobs_slot(status):
    running_job(KEY, 1)
    JobFactory(status=status, concurrency_key=KEY, concurrency_limit=2, concurrency_slot=1)
    JobFactory(status=status, concurrency_key=KEY, concurrency_limit=2, concurrency_slot=1)

    assert Job.objects.filter(concurrency_key=KEY, concurrency_slot=1).count() == 3


def test_running_jobs_of_different_keys_or_no_key_may_share_a_slot_number():
    running_job("a", 1)
    running_job("b", 1)
    running_job(None, None)
    running_job(None, None)

    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 4


# -- racing claims ---------------------------------------------------------------------------------------------


def test_racing_claims_take_exactly_the_limit_of_a_key_round_after_round():
    job_ids = [enqueue("tests.record", {"n": n}, concurrency_key=KEY, concurrency_limit=3) for n in range(20)]

    for round_ in range(5):
        results = race(8, lambda i: claim(limit=5, worker=f"racer-{i}"))

        assert all(isinstance(result, list) for result in results), [r for r in results if not isinstance(r, list)]
        claimed = [job for result in results for job in result]
        assert len(claimed) == 3, (round_, claimed)
        assert running_slots(KEY) == [1, 2, 3]
        succeed(*claimed)

    assert Job.objects.filter(pk__in=job_ids, status=JobStatus.SUCCEEDED).count() == 15


def test_racing_claims_over_several_keys_never_exceed_a_limit_and_leave_nothing_claimable():
    limits = {"a": 1, "b": 2, "c": 3}
    requests = []
    for n in range(8):
        requests += [
            EnqueueRequest("tests.record", {}, EnqueueOptions(concurrency_key=k, concurrency_limit=v))
            for k, v in limits.items()
        ]
        requests.append(EnqueueRequest("tests.record", {"n": n}))
    enqueue_many(requests)

    results = race(8, lambda i: claim(limit=4, worker=f"racer-{i}"))

    assert all(isinstance(result, list) for result in results), [r for r in results if not isinstance(r, list)]
    for key, limit in limits.items():
        assert len(running_slots(key)) <= limit
    claim(limit=100)  # whatever the race left claimable
    assert {key: running_slots(key) for key in limits} == {"a": [1], "b": [1, 2], "c": [1, 2, 3]}
    assert not Job.objects.filter(status=JobStatus.QUEUED, concurrency_key=None).exists()


# What CLAIM and CLAIM_JOB begin with, up to their first parameter, to find them in pg_stat_activity.
CLAIM_PREFIX = os.path.commonprefix([workhorse_sql.claims.CLAIM, workhorse_sql.claims.CLAIM_JOB]).split("%(")[0]


@contextmanager
def slot_taken_uncommitted(key: str) -> Iterator[Any]:
    """Take slot 1 of ``key`` for its first queued job in another session's open transaction; yield
    that session (the caller commits it, or leaving the block rolls it back).

    A plain UPDATE, not CLAIM: it takes no advisory lock, so a claim running meanwhile does consider
    the key, as one whose snapshot predates another claim's commit would.
    """
    with connect_directly(autocommit=False) as other:
        rows = other.execute(
            "UPDATE workhorse_job SET status = 'running', attempt = attempt + 1, concurrency_slot = 1, "
            "lease_token = gen_random_uuid(), lease_expires_at = clock_timestamp() + interval '5 minutes' "
            "WHERE id = (SELECT id FROM workhorse_job WHERE status = 'queued' AND concurrency_key = %s "
            "ORDER BY priority DESC, run_at, id LIMIT 1) RETURNING id",
            [key],
        ).fetchall()
        assert len(rows) == 1
        yield other


def a_claim_waits_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND left(query, %s) = %s",
            [len(CLAIM_PREFIX), CLAIM_PREFIX],
        )
        return cursor.fetchone()[0] == 1


class Attempts:
    """Counts the claim statements run, and the slot collisions and deadlocks among them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements = 0
        self.collisions = 0
        self.deadlocks = 0
        execute = workhorse_sql.claims.execute

        def counting(alias: str, statement: str, params: dict[str, Any]) -> Any:
            if statement not in (workhorse_sql.claims.CLAIM, workhorse_sql.claims.CLAIM_JOB):
                return execute(alias, statement, params)
            self.statements += 1
            try:
                return execute(alias, statement, params)
            except IntegrityError as exc:
                if workhorse_sql.connection.constraint_name(exc) == JOB_CONCURRENCY_SLOT_UNIQ:
                    self.collisions += 1
                raise
            except OperationalError as exc:
                if getattr(exc.__cause__, "sqlstate", None) == DEADLOCK_DETECTED:
                    self.deadlocks += 1
                raise

        monkeypatch.setattr(workhorse_sql.claims, "execute", counting)


class InThread:
    """Runs ``work()`` on its own thread (so with its own connection) from construction on."""

    def __init__(self, work: Any) -> None:
        self._outcome: dict[str, Any] = {}
        self._work = work
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._outcome["value"] = self._work()
        except BaseException as exc:  # reported by join()
            self._outcome["error"] = exc
        finally:
            connections.close_all()

    def ended(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> Any:
        """Return what ``work()`` returned, or raise what it raised."""
        self._thread.join(60)
        assert self.ended(), "the claiming thread did not finish"
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]


def waiting_or_ended(claiming: InThread) -> bool:
    """Whether the claim waits on a lock, or gave up (its error comes out of ``join``)."""
    return claiming.ended() or a_claim_waits_on_a_lock()


@pytest.mark.parametrize(("limit", "expected_slot"), [(1, None), (2, 2)])
def test_a_claim_that_collides_on_a_slot_claims_again(monkeypatch, limit, expected_slot):
    job_ids = [enqueue("tests.record", {"n": n}, concurrency_key=KEY, concurrency_limit=limit) for n in range(3)]
    attempts = Attempts(monkeypatch)

    with slot_taken_uncommitted(KEY) as other:
        # This claim picks the same free slot 1 and waits on the other session's index entry.
        claiming = InThread(lambda: claim(limit=1))
        wait_for(lambda: waiting_or_ended(claiming), what="the claim to wait on the uncommitted slot")
        other.commit()
        claimed = claiming.join()

    assert (attempts.statements, attempts.collisions) == (2, 1)
    assert Job.objects.get(pk=job_ids[0]).concurrency_slot == 1
    if expected_slot is None:
        assert claimed == []
        assert running_slots(KEY) == [1]
    else:
        assert [job.id for job in claimed] == [job_ids[1]]
        assert slots_of([job_ids[1]]) == {job_ids[1]: expected_slot}


def test_a_claim_skips_a_key_another_claim_is_taking_slots_of_without_waiting():
    enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=3, priority=10)
    enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=3, priority=10)
    unkeyed = enqueue("tests.record", {})
    with connect_directly(autocommit=False) as other:
        taken = other.execute(
            workhorse_sql.claims.CLAIM,
            {
                "queues": ["default"],
                "fair_queues": [],
                "fair_after": [],
                "fair_unkeyed": [],
                "limit": 1,
                "lease": LEASE,
                "worker": "other",
                "rate_limits": "{}",
            },
        ).fetchall()
        assert len(taken) == 1  # holds KEY's advisory lock until it commits

        assert [job.id for job in claim(limit=10)] == [unkeyed]  # KEY skipped, nothing waited

        other.commit()
    assert len(claim(limit=10)) == 1  # the other free slot of KEY, now that the first claim is done


def test_a_claim_aborted_by_a_deadlock_on_the_slot_index_claims_again(monkeypatch):
    enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=1, priority=10)
    second = enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=1)
    other_key = enqueue("tests.record", {}, concurrency_key="tenant-2", concurrency_limit=1)
    attempts = Attempts(monkeypatch)

    def claim_and_detect_deadlocks() -> list[workhorse_sql.claims.ClaimedJob]:
        with connection.cursor() as cursor:
            cursor.execute("SET deadlock_timeout = '2s'")
        return claim(limit=10)

    with slot_taken_uncommitted(KEY) as other:  # holds the first job in slot 1 of KEY, uncommitted
        other.execute("SET deadlock_timeout = '1min'")  # so the claim, not this session, is the victim
        claiming = InThread(claim_and_detect_deadlocks)
        # The claim locked its candidates (second, other_key) and waits for this session's slot 1.
        wait_for(lambda: waiting_or_ended(claiming), what="the claim to wait on the uncommitted slot")
        # Waiting for the claim's row lock closes the cycle; this returns once the claim is aborted.
        # The retry can lock other_key again before this UPDATE, woken by the abort, takes the row (a
        # tuple whose locker aborted looks free to SKIP LOCKED): that closes the cycle once more, and
        # the claim is the victim again. The UPDATE returns in the round it wins the row.
        other.execute("UPDATE workhorse_job SET priority = priority WHERE id = %s", [other_key])
        # The claim's retry skips other_key (locked now) and waits for slot 1 again.
        wait_for(lambda: waiting_or_ended(claiming), what="the retried claim to wait on the uncommitted slot")
        other.commit()
        claimed = claiming.join()

    assert attempts.deadlocks >= 1
    # each deadlock cost one statement; then one collision on slot 1, then the claim of other_key
    assert (attempts.statements, attempts.collisions) == (attempts.deadlocks + 2, 1)
    assert [job.id for job in claimed] == [other_key]
    assert Job.objects.get(pk=second).status == JobStatus.QUEUED
    assert (running_slots(KEY), running_slots("tenant-2")) == ([1], [1])


@pytest.mark.parametrize(("limit", "claimed_slot"), [(1, None), (2, 2)])
def test_claim_job_in_a_transaction_claims_again_after_a_collision_and_leaves_it_usable(
    monkeypatch, limit, claimed_slot
):
    first, second = (enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=limit) for _ in range(2))
    attempts = Attempts(monkeypatch)

    def claim_second_in_a_transaction() -> tuple[workhorse_sql.claims.ClaimedJob | None, int]:
        with transaction.atomic():
            job = workhorse_sql.claims.claim_job(ALIAS, job_id=second, lease=LEASE, worker="eager")
            return job, Job.objects.filter(status=JobStatus.RUNNING).count()

    with slot_taken_uncommitted(KEY) as other:
        claiming = InThread(claim_second_in_a_transaction)
        wait_for(lambda: waiting_or_ended(claiming), what="claim_job to wait on the uncommitted slot")
        other.commit()
        job, running = claiming.join()

    assert (attempts.statements, attempts.collisions) == (2, 1)
    assert Job.objects.get(pk=first).concurrency_slot == 1
    if claimed_slot is None:
        assert (job, running) == (None, 1)
        assert Job.objects.get(pk=second).status == JobStatus.QUEUED
    else:
        assert job is not None and job.id == second and running == 2
        assert slots_of([second]) == {second: claimed_slot}


def test_claim_job_does_not_claim_a_job_of_a_saturated_key():
    first, second = (enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=1) for _ in range(2))

    job = workhorse_sql.claims.claim_job(ALIAS, job_id=first, lease=LEASE, worker="eager")

    assert job is not None and job.id == first and slots_of([first]) == {first: 1}
    assert workhorse_sql.claims.claim_job(ALIAS, job_id=second, lease=LEASE, worker="eager") is None
    assert Job.objects.get(pk=second).status == JobStatus.QUEUED


# -- leaving 'running' frees the slot -----------------------------------------------------------------------------


def _retry(job: workhorse_sql.claims.ClaimedJob) -> None:
    later = timezone.now() + timedelta(hours=1)
    assert record(ALIAS, [Outcome(job, "queued", error="boom", run_at=later)]) == ["queued"]


def _outcome(status: str) -> Any:
    def leave(job: workhorse_sql.claims.ClaimedJob) -> None:
        assert record(ALIAS, [Outcome(job, status, error="boom" if status == "dead" else "")]) == [status]

    return leave


def _release(job: workhorse_sql.claims.ClaimedJob) -> None:
    workhorse_sql.outcomes.release(ALIAS, [(job, True)])


def _reclaim(job: workhorse_sql.claims.ClaimedJob) -> None:
    Job.objects.filter(pk=job.id).update(lease_expires_at=timezone.now() - timedelta(minutes=1))
    assert workhorse_sql.outcomes.reclaim_expired(ALIAS) == 1


@pytest.mark.parametrize(
    ("leave", "max_attempts", "status", "next_claim"),
    [
        pytest.param(_outcome("succeeded"), 3, JobStatus.SUCCEEDED, "other", id="succeeded"),
        pytest.param(_retry, 3, JobStatus.QUEUED, "other", id="retry-scheduled"),
        pytest.param(_outcome("dead"), 3, JobStatus.DEAD, "other", id="dead"),
        pytest.param(_outcome("cancelled"), 3, JobStatus.CANCELLED, "other", id="cancelled"),
        pytest.param(_release, 3, JobStatus.QUEUED, "same", id="released"),
        pytest.param(_release, 1, JobStatus.DEAD, "other", id="released-on-last-attempt"),
        pytest.param(_reclaim, 3, JobStatus.QUEUED, "same", id="reclaimed"),
        pytest.param(_reclaim, 1, JobStatus.DEAD, "other", id="reclaimed-on-last-attempt"),
    ],
)
def test_leaving_running_frees_the_slot_for_the_next_claim(leave, max_attempts, status, next_claim):
    first = enqueue(
        "tests.record", {}, concurrency_key=KEY, concurrency_limit=1, priority=10, max_attempts=max_attempts
    )
    other = enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=1)
    [job] = claim()
    assert job.id == first and claim() == []

    leave(job)

    assert Job.objects.get(pk=first).status == status
    assert [claimed.id for claimed in claim()] == [first if next_claim == "same" else other]
    assert running_slots(KEY) == [1]


def test_a_cancel_request_leaves_the_slot_taken_until_the_job_stops():
    first = enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=1, priority=10)
    other = enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=1)
    [job] = claim()

    assert workhorse_sql.actions.cancel(ALIAS, first, "test") == (JobStatus.RUNNING, None)
    assert claim() == []

    assert record(ALIAS, [Outcome(job, "cancelled")]) == ["cancelled"]
    assert [claimed.id for claimed in claim()] == [other]


def test_only_the_claim_statements_touch_concurrency_slots():
    modules = {name: getattr(workhorse_sql, name) for name in workhorse_sql.__all__}
    writers = [
        f"{module_name}.{name}"
        for module_name, module in modules.items()
        for name, value in vars(module).items()
        if isinstance(value, str)
        and value.lstrip().startswith(("WITH", "SELECT", "UPDATE", "INSERT", "DELETE"))
        and "concurrency_slot" in value
    ]

    assert writers == [
        "claims._CLAIM_TEMPLATE",
        "claims._UNFAIR_TEMPLATE",
        "claims.CLAIM",
        "claims.CLAIM_RATED",
        "claims.CLAIM_FAIR",
        "claims.CLAIM_FAIR_RATED",
        "claims.CLAIM_CAPABLE",
        "claims.CLAIM_CAPABLE_RATED",
        "claims.CLAIM_FAIR_CAPABLE",
        "claims.CLAIM_FAIR_CAPABLE_RATED",
        "claims.CLAIM_JOB",
        "claims.CLAIM_JOB_RATED",
    ]


# -- redrive and the database keep a key's limit ---------------------------------------------------------------------


def test_a_redriven_job_of_a_key_keeps_its_limit_and_can_be_claimed():
    dead = enqueue("tests.record", {}, concurrency_key=KEY, concurrency_limit=2, max_attempts=1)
    [job] = claim()
    _outcome("dead")(job)

    new_id = redrive(dead, request_id="r1")

    assert [claimed.id for claimed in claim()] == [new_id]
    assert Job.objects.filter(pk=new_id).values_list("concurrency_key", "concurrency_limit").get() == (KEY, 2)


def test_the_database_rejects_a_key_without_a_limit():
    with pytest.raises(IntegrityError):
        JobFactory(concurrency_key=KEY, concurrency_limit=None)
