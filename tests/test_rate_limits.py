"""Rate limits: the definition's bounds, the setting's check, enqueue's refusals, the grant and the
holds in the claim, a limit removed from settings, and acquire/available, on real PostgreSQL."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.db import connection, transaction
from hypothesis import given, settings
from hypothesis import strategies as st

from django_workhorse import (
    EnqueueValidationError,
    RateLimit,
    RateLimitTimeoutError,
    RateLimitValidationError,
    conf,
    enqueue,
    rate_limits,
)
from django_workhorse.admin.breakers import rate_held_line
from django_workhorse.admission import rate_limits as definitions
from django_workhorse.models import Job, JobEvent, JobStatus, RateBudget
from django_workhorse.sql import claims
from django_workhorse.tasks.decorator import task
from tests import rate_tasks
from tests.worker_tasks import run_worker

MS = timedelta(milliseconds=1)
US = timedelta(microseconds=1)
LEASE = timedelta(seconds=30)
RECORD = "tests.rate.record_start"


def _claim(limit: int = 50, worker: str = "w", ahead_us: int = 0) -> claims.Claimed:
    return claims.claim(
        "default", queues=["default"], limit=limit, lease=LEASE, worker=worker,
        rate_limits=definitions.claim_parameter(), rate_ahead_us=ahead_us,
    )  # fmt: skip


def within_bound(times: list, per: timedelta, most: int) -> bool:
    """No half-open window [t, t + per) holds more than ``most`` of ``times``."""
    ordered = sorted(times)
    return all(ordered[i + most] - ordered[i] >= per for i in range(len(ordered) - most))


# -- the definition ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "good", "bad"),
    [
        ("limit", [1, conf.MAX_RATE_LIMIT], [0, -1, conf.MAX_RATE_LIMIT + 1, 1.5, 2.0, True, "5", None]),
        ("per", [MS, timedelta(days=1)], [MS - US, timedelta(days=1) + US, timedelta(0), -MS, 1, 1.0]),
        ("burst", [0, conf.MAX_RATE_BURST], [-1, conf.MAX_RATE_BURST + 1, 0.5, False, "1"]),
        ("partitioned", [True, False], [1, "yes", None]),
    ],
)
def test_rate_limit_bounds_are_exact(field, good, bad):
    base = {"limit": 10}
    for value in good:
        assert getattr(RateLimit(**{**base, field: value}), field) == value
    for value in bad:
        with pytest.raises(RateLimitValidationError) as caught:
            RateLimit(**{**base, field: value})
        assert caught.value.field == field
        assert field in str(caught.value)


def test_the_emission_interval_is_rounded_up_to_a_microsecond():
    assert RateLimit(3).interval_us == 333_334
    assert RateLimit(20).interval_us == 50_000
    assert RateLimit(10, burst=4).tolerance_us == 400_000
    assert RateLimit(conf.MAX_RATE_LIMIT, per=MS).interval_us == 1


@pytest.mark.parametrize(
    "value",
    [
        ["stripe"],
        {"": RateLimit(1)},
        {"n" * (conf.MAX_RATE_LIMIT_NAME_CHARS + 1): RateLimit(1)},
        {"a\x00b": RateLimit(1)},
        {7: RateLimit(1)},
        {"stripe": 100},
        {"stripe": {"limit": 100}},
    ],
)
def test_a_malformed_setting_is_a_system_check_error(settings, value):
    settings.WORKHORSE_RATE_LIMITS = value
    assert [m.id for m in run_checks() if m.id == "workhorse.E402"] == ["workhorse.E402"]


def test_a_well_formed_setting_passes_the_check(settings):
    settings.WORKHORSE_RATE_LIMITS = {"n" * conf.MAX_RATE_LIMIT_NAME_CHARS: RateLimit(1), "b": RateLimit(5, burst=5)}
    assert not [m for m in run_checks() if m.id == "workhorse.E402"]


# -- enqueue -------------------------------------------------------------------------------------


@pytest.fixture
def limits(settings):
    settings.WORKHORSE_RATE_LIMITS = {
        "stripe": RateLimit(10, burst=2),
        "accounts": RateLimit(10, partitioned=True),
        "tests.default": RateLimit(10),
    }
    return settings.WORKHORSE_RATE_LIMITS


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"rate_limit": "unknown"}, "rate_limit"),
        ({"rate_limit": "accounts"}, "rate_partition"),
        ({"rate_limit": "stripe", "rate_partition": "p"}, "rate_partition"),
        ({"rate_partition": "p"}, "rate_partition"),
        ({"rate_limit": "accounts", "rate_partition": "a\x00b"}, "rate_partition"),
        ({"rate_limit": "accounts", "rate_partition": "x" * (conf.MAX_RATE_PARTITION_BYTES + 1)}, "rate_partition"),
        ({"rate_limit": "accounts", "rate_partition": ""}, "rate_partition"),
    ],
)
def test_enqueue_refuses_a_bad_rate_limit_and_writes_nothing(limits, options, field):
    with transaction.atomic():
        with pytest.raises(EnqueueValidationError) as caught:
            enqueue(RECORD, {"bad": True}, **options)
        assert caught.value.field == field
        assert Job.objects.filter(payload__bad=True).count() == 0  # the caller's transaction is usable


@pytest.mark.django_db
def test_enqueue_takes_a_configured_limit_and_the_largest_partition(limits):
    largest = "x" * conf.MAX_RATE_PARTITION_BYTES
    one = enqueue(RECORD, {}, rate_limit="stripe")
    two = enqueue(RECORD, {}, rate_limit="accounts", rate_partition=largest)
    assert Job.objects.get(pk=one).rate_limit == "stripe"
    assert Job.objects.get(pk=two).rate_partition == largest


@pytest.mark.django_db
def test_a_tasks_rate_limit_is_its_default_and_a_call_may_name_another(limits):
    assert Job.objects.get(pk=rate_tasks.stripe_default.enqueue()).rate_limit == "tests.default"
    assert Job.objects.get(pk=rate_tasks.stripe_default.apply_async(rate_limit="stripe").job_id).rate_limit == "stripe"


def test_a_task_refuses_a_malformed_rate_limit_name():
    for bad in ("", "n" * (conf.MAX_RATE_LIMIT_NAME_CHARS + 1), 5):
        with pytest.raises(RateLimitValidationError) as caught:
            task(name="tests.rate.bad", rate_limit=bad)(lambda: None)
        assert caught.value.field == "rate_limit"


# -- the claim -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_claim_grants_the_burst_and_holds_the_rest_at_their_own_slots(limits):
    ids = [enqueue(RECORD, {"n": i}, rate_limit="stripe") for i in range(8)]
    claimed = _claim()
    assert [job.id for job in claimed] == ids[:3]  # 1 + burst, in claim order
    assert claimed.held == 5 and claimed.next_slot is not None and claimed.next_slot > 0
    held = list(Job.objects.filter(pk__in=ids[3:]).order_by("id"))
    assert {job.status for job in held} == {JobStatus.QUEUED} and {job.attempt for job in held} == {0}
    assert all(job.held_since is not None for job in held)
    gaps = [later.run_at - earlier.run_at for earlier, later in zip(held, held[1:], strict=False)]
    assert gaps == [timedelta(milliseconds=100)] * 4  # one emission interval apart
    budget = RateBudget.objects.get(name="stripe")
    assert (budget.partition, budget.admitted, budget.deferred, budget.granted) == ("", 3, 5, 3)
    assert budget.reserved_until == held[-1].run_at + timedelta(milliseconds=100)
    event = JobEvent.objects.get(job_id=ids[3], kind="held")
    assert event.details["rate_limit"] == "stripe" and event.details["partition"] is None
    assert event.details["until"].startswith(held[0].run_at.isoformat()[:19])
    assert rate_held_line(held[0]).startswith("held by rate limit stripe since ")
    # Nothing is due now: a second claim finds nothing, holds nothing (the worker then waits).
    again = _claim()
    assert (len(again), again.held) == (0, 0)


@pytest.mark.django_db
def test_a_claim_admits_ahead_the_starts_that_conform_within_its_horizon_and_not_one_more(settings):
    settings.WORKHORSE_RATE_LIMITS = {"strict": RateLimit(100)}  # one start per 10 ms, no burst
    ids = [enqueue(RECORD, {"n": i}, rate_limit="strict") for i in range(10)]
    claimed = _claim(ahead_us=50_000)
    # Its instants now, +10, ..., +50 ms conform by now + 50 ms (the last exactly at it); +60 does not.
    assert [job.id for job in claimed] == ids[:6] and claimed.held == 4
    jobs = {job.id: job for job in Job.objects.filter(pk__in=ids)}
    starts = [jobs[i].started_at for i in ids[:6]]
    assert [b - a for a, b in zip(starts, starts[1:], strict=False)] == [10 * MS] * 5
    assert claimed[0].start_in < 0.001 < claimed[1].start_in < claimed[5].start_in <= 0.05
    # The held ones take the instants after the last admitted, one interval apart, and come back
    # one horizon before theirs (a claim then admits them ahead, at their instants).
    assert [jobs[i].run_at for i in ids[6:]] == [starts[-1] + (n + 1) * 10 * MS - 50 * MS for n in range(4)]
    assert RateBudget.objects.get(name="strict").admitted == 6


@pytest.mark.django_db(transaction=True)
def test_a_worker_never_runs_a_handler_before_the_instant_its_limit_admitted_it(settings):
    settings.WORKHORSE_RATE_LIMITS = {"strict": RateLimit(50)}  # one start per 20 ms: 3 admitted ahead per claim
    rate_tasks.create_start_table()
    ids = [enqueue(RECORD, {"n": i}, rate_limit="strict") for i in range(12)]
    stats = run_worker(concurrency=4, batch=10)
    assert stats.finished == {"succeeded": 12}
    recorded = rate_tasks.starts()
    assert sorted(job_id for job_id, *_ in recorded) == ids and {attempt for _, attempt, *_ in recorded} == {1}
    counted = [started for _, _, started, _ in recorded]
    gaps = [b - a for a, b in zip(counted, counted[1:], strict=False)]
    # Never closer than the interval; admitted ahead, starts fall exactly on it (a claim admitting
    # at its own instant, after the slot, would lose its lateness at every gap).
    assert min(gaps) >= 20 * MS and gaps.count(20 * MS) >= 6
    assert all(began >= started for _, _, started, began in recorded)  # never before its instant


@pytest.mark.django_db
def test_each_partition_has_a_budget_of_its_own(limits):
    for partition in ("a", "b"):
        for i in range(3):
            enqueue(RECORD, {"n": i}, rate_limit="accounts", rate_partition=partition)
    claimed = _claim()
    assert len(claimed) == 2 and claimed.held == 4
    rows = dict(RateBudget.objects.filter(name="accounts").values_list("partition", "admitted"))
    assert rows == {"a": 1, "b": 1}


@pytest.mark.django_db
def test_jobs_without_a_rate_limit_never_touch_a_budget(limits):
    for i in range(5):
        enqueue(RECORD, {"n": i})
    assert len(_claim()) == 5
    assert not RateBudget.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_limit_removed_from_settings_runs_its_jobs_unlimited_logged_once(limits, settings, caplog):
    rate_tasks.create_start_table()
    ids = [enqueue(RECORD, {"n": i}, rate_limit="stripe") for i in range(6)]
    settings.WORKHORSE_RATE_LIMITS = {"accounts": RateLimit(10, partitioned=True)}
    definitions._unknown_logged.discard("stripe")
    with caplog.at_level(logging.WARNING, logger="django_workhorse.admission.rate_limits"):
        run_worker(batch=2, concurrency=1)
    assert Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == 6
    assert not RateBudget.objects.filter(name="stripe").exists()
    logged = [r for r in caplog.records if "stripe" in r.getMessage()]
    assert len(logged) == 1


@pytest.mark.django_db(transaction=True)
def test_retries_spend_the_same_budget(settings):
    settings.WORKHORSE_RATE_LIMITS = {"flaky": RateLimit(1000, burst=10)}
    job_id = enqueue("tests.rate.fail_once", {}, rate_limit="flaky")
    run_worker(concurrency=1)
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.SUCCEEDED, 2)
    assert RateBudget.objects.get(name="flaky").admitted == 2


@pytest.mark.django_db
def test_a_redrive_keeps_what_admits_its_source_and_spends_the_same_budget(limits):
    from django_workhorse import EnqueueOptions, redrive

    options = EnqueueOptions(rate_limit="accounts", rate_partition="acct_7", breaker_key="crm", partition_key="t1")
    source = enqueue(RECORD, {"n": 1}, options)
    Job.objects.filter(pk=source).update(status=JobStatus.DEAD, attempt=1)
    again = redrive(source, request_id="r1")
    copied = Job.objects.values("rate_limit", "rate_partition", "breaker_key", "partition_key").get(pk=again)
    assert copied == {"rate_limit": "accounts", "rate_partition": "acct_7", "breaker_key": "crm", "partition_key": "t1"}
    assert [job.id for job in _claim()] == [again]
    assert RateBudget.objects.get(name="accounts", partition="acct_7").admitted == 1


@pytest.mark.django_db
def test_eager_claims_spend_the_budget_and_hold_when_it_is_spent(settings):
    from django_workhorse.worker.eager import run_job

    settings.WORKHORSE_RATE_LIMITS = {"one": RateLimit(1, per=timedelta(hours=1))}
    first, second = (enqueue(RECORD + ".noop", {}, rate_limit="one") for _ in range(2))
    assert run_job(first) == "succeeded"
    assert run_job(second) is None  # held until the budget refills
    assert Job.objects.get(pk=second).held_since is not None


# -- many claimers at once: never over -------------------------------------------------------------


def _claim_until(total: int, stop: threading.Event, errors: list[BaseException], ahead_us: int) -> None:
    try:
        while not stop.is_set() and Job.objects.filter(status=JobStatus.QUEUED).exists():
            if not _claim(limit=3, worker=threading.current_thread().name, ahead_us=ahead_us):
                stop.wait(0.005)  # a poll, as a worker's: the held jobs are due at their slots
    except BaseException as exc:  # noqa: BLE001 (reported by the test)
        errors.append(exc)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
@settings(max_examples=6)
@given(
    limit=st.integers(1, 8),
    per_ms=st.sampled_from([100, 200, 300]),
    burst=st.integers(0, 3),
    threads=st.integers(2, 4),
    ahead_ms=st.sampled_from([0, 20, 50]),
)
def test_concurrent_claims_never_start_more_than_the_limit(limit, per_ms, burst, threads, ahead_ms):
    Job.objects.all().delete()
    RateBudget.objects.all().delete()
    per = timedelta(milliseconds=per_ms)
    with override_limits({"p": RateLimit(limit, per=per, burst=burst)}):
        total = 2 * (limit + burst) + 2
        for i in range(total):
            enqueue(RECORD, {"n": i}, rate_limit="p")
        stop, errors = threading.Event(), []
        workers = [
            threading.Thread(target=_claim_until, args=(total, stop, errors, ahead_ms * 1000)) for _ in range(threads)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        stop.set()
        assert not errors
        started = list(Job.objects.filter(status=JobStatus.RUNNING).values_list("started_at", "attempt"))
        assert len(started) == total and {attempt for _, attempt in started} == {1}
        assert within_bound([at for at, _ in started], per, limit + burst)


def override_limits(limits):
    from django.test import override_settings

    return override_settings(WORKHORSE_RATE_LIMITS=limits)


# -- acquire and available ------------------------------------------------------------------------


@pytest.mark.django_db
def test_acquire_spends_the_budget_and_available_says_what_is_left(settings):
    settings.WORKHORSE_RATE_LIMITS = {"api": RateLimit(1, per=timedelta(hours=1), burst=1)}
    assert rate_limits.available("api") == 2
    rate_limits.acquire("api")
    assert rate_limits.available("api") == 1
    rate_limits.acquire("api", timeout=0)
    assert rate_limits.available("api") == 0
    with pytest.raises(RateLimitTimeoutError) as caught:
        rate_limits.acquire("api", timeout=timedelta(seconds=1))  # the next start is an hour away
    assert caught.value.name == "api" and caught.value.retry_after > 3000
    budget = RateBudget.objects.get(name="api")
    assert (budget.admitted, budget.deferred) == (2, 1)  # the refused try counts; the wait never began


@pytest.mark.django_db
def test_acquire_waits_for_the_next_start_within_its_timeout(settings):
    settings.WORKHORSE_RATE_LIMITS = {"api": RateLimit(20, partitioned=True)}
    for _ in range(3):  # the 2nd and 3rd wait about 50 ms each for their slot
        rate_limits.acquire("api", "acct", timeout=5)
    assert RateBudget.objects.get(name="api", partition="acct").admitted == 3
    assert rate_limits.available("api", "other") == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "partition", "timeout", "field"),
    [
        ("unknown", None, 0, "name"),
        ("", None, 0, "name"),
        ("api", "p", 0, "partition"),
        ("parts", None, 0, "partition"),
        ("parts", "a\x00b", 0, "partition"),
        ("parts", "x" * (conf.MAX_RATE_PARTITION_BYTES + 1), 0, "partition"),
        ("api", None, -1, "timeout"),
        ("api", None, timedelta(days=1, microseconds=1), "timeout"),
        ("api", None, True, "timeout"),
    ],
)
def test_acquire_refuses_bad_input(settings, name, partition, timeout, field):
    settings.WORKHORSE_RATE_LIMITS = {"api": RateLimit(5), "parts": RateLimit(5, partitioned=True)}
    with pytest.raises(RateLimitValidationError) as caught:
        rate_limits.acquire(name, partition, timeout=timeout)
    assert caught.value.field == field
    assert not RateBudget.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_worker_facing_only_rate_held_work_does_not_spin(settings, monkeypatch):
    from tests.worker_tasks import make_worker, running, wait_for

    settings.WORKHORSE_RATE_LIMITS = {"hourly": RateLimit(1, per=timedelta(hours=1))}
    ids = [enqueue(RECORD + ".noop", {"n": i}, rate_limit="hourly") for i in range(5)]
    calls = []
    real = claims.claim
    monkeypatch.setattr(claims, "claim", lambda *a, **k: calls.append(1) or real(*a, **k))
    with running(make_worker(poll_interval=0.05, concurrency=2)):
        wait_for(lambda: Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == 1, 10)
        wait_for(lambda: Job.objects.filter(pk__in=ids, held_since__isnull=False).count() == 4, 10)
        before = len(calls)
        threading.Event().wait(0.5)  # the window measured, not a synchronisation: about 10 polls
        during = len(calls) - before
    assert 1 <= during <= 20  # it polls; a spinning loop would claim thousands of times
    assert Job.objects.filter(pk__in=ids, status=JobStatus.QUEUED, attempt=0).count() == 4
