"""Circuit breakers: the policy's bounds, breaker keys at enqueue, and the state machine against a
fake provider (a real local HTTP server), with real workers on real PostgreSQL."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest
from django.utils import timezone as django_timezone

from django_workhorse import Breaker, BreakerValidationError, EnqueueValidationError, Idempotency, conf, enqueue
from django_workhorse.admission.breakers import DEFAULT_BREAKER, FAILURE, SUCCESS, verdict
from django_workhorse.models import Breaker as BreakerRow
from django_workhorse.models import Job, JobEvent, JobStatus
from django_workhorse.operations.breakers import breaker_states, reset_breaker
from django_workhorse.worker.eager import run_job
from tests import breaker_tasks
from tests.breaker_tasks import (
    PROVIDER_BREAKER,
    SLOW_BREAKER,
    TRIP_AFTER,
    call_destination,
    call_provider,
    call_without_breaker,
    provider,
)
from tests.worker_tasks import make_worker, run_worker, running, wait_for

MS = timedelta(milliseconds=1)
US = timedelta(microseconds=1)


# -- the policy's bounds ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "good", "bad"),
    [
        ("failures", [1, conf.MAX_BREAKER_FAILURES], [0, conf.MAX_BREAKER_FAILURES + 1, True, 2.0, "5"]),
        ("probes", [1, conf.MAX_BREAKER_PROBES], [0, conf.MAX_BREAKER_PROBES + 1, False, 1.5]),
        ("within", [MS, timedelta(days=365)], [MS - US, timedelta(days=365) + US, timedelta(0), 60]),
        ("cooldown", [MS, timedelta(days=365)], [MS - US, timedelta(days=365) + US, -MS, 30.0]),
    ],
)
def test_breaker_bounds_are_exact(field, good, bad):
    for value in good:
        assert getattr(Breaker(**{field: value, "max_cooldown": timedelta(days=365)}), field) == value
    for value in bad:
        with pytest.raises(BreakerValidationError) as caught:
            Breaker(**{field: value})
        assert caught.value.field == field
        assert field in str(caught.value)


def test_max_cooldown_is_at_least_the_cooldown_and_at_most_a_year():
    cooldown = timedelta(seconds=30)
    assert Breaker(cooldown=cooldown, max_cooldown=cooldown).max_cooldown == cooldown
    assert Breaker(cooldown=cooldown, max_cooldown=timedelta(days=365)).max_cooldown == timedelta(days=365)
    for bad in (cooldown - US, timedelta(days=365) + US, 600):
        with pytest.raises(BreakerValidationError) as caught:
            Breaker(cooldown=cooldown, max_cooldown=bad)
        assert caught.value.field == "max_cooldown"
    assert Breaker().max_cooldown == conf.DEFAULT_MAX_BREAKER_COOLDOWN
    assert Breaker(cooldown=timedelta(hours=1)).max_cooldown == timedelta(hours=1)


def test_a_task_breaker_must_be_a_breaker():
    from django_workhorse.tasks.decorator import task

    with pytest.raises(BreakerValidationError) as caught:
        task(name="tests.breaker.bad", breaker={"failures": 5})
    assert caught.value.field == "breaker"


def test_what_counts_as_a_failure():
    assert verdict("succeeded", "succeeded", "") == SUCCESS
    assert verdict("queued", "retry", "RuntimeError: down") == FAILURE
    assert verdict("queued", "retry", "Retry: retry after 0:02:00") == FAILURE  # raise Retry.from_response(429)
    assert verdict("dead", "dead", "RuntimeError: down") == FAILURE
    assert verdict("dead", "dead", "TimeoutError: the attempt ran longer than its timeout") == FAILURE
    # Not the destination's doing: no verdict.
    assert verdict("dead", "dead", "DeadlineExceeded: the job's deadline passed before it could start") is None
    assert verdict("dead", "dead", "Snooze: snoozed more than 100 times") is None
    assert verdict("queued", "snoozed", "") is None
    assert verdict("dead", "failed", "Fail: card permanently declined") is None  # Fail, fail_on, retry_on
    assert verdict("cancelled", "cancelled", "order was refunded") is None
    for status in ("cancelled", "lost", "unrecorded", "queued"):
        assert verdict(status, "", "") is None


# -- breaker keys at enqueue ------------------------------------------------------------------


@pytest.mark.django_db
def test_breaker_key_bounds_at_enqueue():
    largest = "é" * (conf.MAX_BREAKER_KEY_BYTES // 2)
    job_id = enqueue("tests.record", {}, breaker_key=largest)
    assert Job.objects.get(pk=job_id).breaker_key == largest
    for bad in [largest + "a", "", "a\x00b", "\ud800", 5, b"smtp"]:
        with pytest.raises(EnqueueValidationError) as caught:
            enqueue("tests.record", {}, breaker_key=bad)
        assert caught.value.field == "breaker_key"
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_a_task_with_a_breaker_keys_it_by_job_type_unless_the_call_names_one():
    by_type = call_provider.enqueue("http://x")
    per_call = call_provider.apply_async(("http://x",), breaker_key="smtp:mail.example.com").job_id
    by_name = enqueue("tests.breaker.provider", {"url": "http://x"})
    plain = call_without_breaker.enqueue("http://x")
    keyed_plain = enqueue("tests.record", {}, breaker_key="smtp:a")
    keys = dict(Job.objects.values_list("id", "breaker_key"))
    assert keys == {
        by_type: "tests.breaker.provider",
        per_call: "smtp:mail.example.com",
        by_name: "tests.breaker.provider",
        plain: None,
        keyed_plain: "smtp:a",
    }


@pytest.mark.django_db
def test_breaker_key_is_not_part_of_the_fingerprint():
    key = Idempotency("order-1")
    first = enqueue("tests.record", {"n": 1}, idempotency=key, breaker_key="smtp:a")
    # Admission, not content: another breaker key for the same request replays, it is no conflict.
    assert enqueue("tests.record", {"n": 1}, idempotency=key, breaker_key="smtp:b") == first
    assert enqueue("tests.record", {"n": 1}, idempotency=key) == first


@pytest.mark.django_db
def test_a_batch_carries_breaker_keys():
    from django_workhorse import EnqueueOptions, EnqueueRequest, enqueue_many

    results = enqueue_many(
        [
            EnqueueRequest("tests.record", {"n": 1}, EnqueueOptions(breaker_key="smtp:a")),
            EnqueueRequest("tests.record", {"n": 2}),
            EnqueueRequest("tests.record", {"n": 3}, EnqueueOptions(breaker_key="smtp:b", unique=None)),
            EnqueueRequest("tests.record", {"n": 4}, EnqueueOptions(idempotency=Idempotency("k"), breaker_key="x")),
        ]
    )
    keys = [Job.objects.get(pk=r.job_id).breaker_key for r in results]
    assert keys == ["smtp:a", None, "smtp:b", "x"]


# -- the state machine ------------------------------------------------------------------------


def _row(key: str) -> BreakerRow | None:
    return BreakerRow.objects.filter(key=key).first()


def _held(key: str) -> list[Job]:
    return list(Job.objects.filter(breaker_key=key, status=JobStatus.QUEUED, held_since__isnull=False))


def _open(key: str, *, until: datetime, policy: Breaker = PROVIDER_BREAKER) -> None:
    BreakerRow.objects.create(
        key=key,
        state="open",
        opened_at=django_timezone.now(),
        open_until=until,
        cooldown=policy.cooldown,
        probes=policy.probes,
        policy=policy.to_json(),
        changed_at=django_timezone.now(),
    )


@pytest.mark.django_db(transaction=True)
def test_failures_trip_the_breaker_after_exactly_failures_then_a_canary_failure_doubles_the_cooldown_and_a_success_closes_it(
    caplog,
):
    caplog.set_level(logging.INFO, logger="django_workhorse.admission")
    key = "tests.breaker.provider"
    with provider() as fake:
        ids = [call_provider.enqueue(fake.url, f"/job-{i}") for i in range(8)]
        # One worker, one thread: attempts end one after the other, so the count is exact.
        with running(make_worker(concurrency=1)):
            wait_for(lambda: (row := _row(key)) is not None and row.state == "open", 30, what="the breaker to open")
            assert fake.count() == TRIP_AFTER
            failed = Job.objects.filter(pk__in=ids, attempt=1)
            assert failed.count() == TRIP_AFTER
            wait_for(lambda: len(_held(key)) == len(ids) - TRIP_AFTER, 30, what="the other jobs to be held")
            # Held jobs consumed no attempt, and say why they wait.
            assert all(job.attempt == 0 for job in _held(key))
            held_events = JobEvent.objects.filter(kind="held", job_id__in=[job.id for job in _held(key)])
            assert held_events.exists()
            assert all(event.details["breaker"] == key and event.details["until"] for event in held_events)

            # After the cooldown one canary runs; it fails too: open again, for twice the cooldown.
            wait_for(
                lambda: (row := _row(key)) is not None and row.cooldown == 2 * PROVIDER_BREAKER.cooldown,
                30,
                what="the breaker to reopen with a doubled cooldown",
            )
            row = _row(key)
            assert row is not None and row.state == "open"
            assert [(t["from"], t["to"]) for t in row.transitions] == [
                ("closed", "open"),
                ("open", "half_open"),
                ("half_open", "open"),
            ]
            assert row.transitions[-1]["reason"] == "a canary failed"
            assert fake.count() == TRIP_AFTER + 1

            # The provider recovers: the next canary succeeds, the breaker closes and every held
            # job runs, each exactly once.
            fake.failing = False
            remaining = [job.id for job in _held(key)]
            wait_for(
                lambda: Job.objects.filter(pk__in=remaining, status=JobStatus.SUCCEEDED).count() == len(remaining),
                60,
                what="the held jobs to succeed",
            )
        row = _row(key)
        assert row is not None and row.state == "closed" and row.recent_failures == []
        assert row.transitions[-1]["to"] == "closed" and row.transitions[-1]["reason"] == "a canary succeeded"
        for job in Job.objects.filter(pk__in=remaining):
            assert job.attempt == 1 and job.held_since is None
            assert fake.succeeded(job.payload["path"]) == 1
    logged = [
        (r.levelno, r.getMessage().split(" from=")[0]) for r in caplog.records if "Circuit breaker" in r.getMessage()
    ]
    assert logged == [
        (logging.WARNING, f"Circuit breaker open key={key}"),
        (logging.INFO, f"Circuit breaker half_open key={key}"),
        (logging.WARNING, f"Circuit breaker open key={key}"),
        (logging.INFO, f"Circuit breaker half_open key={key}"),
        (logging.INFO, f"Circuit breaker closed key={key}"),
    ]


@pytest.mark.django_db(transaction=True)
def test_other_job_types_keep_flowing_while_a_breaker_is_open():
    key = "tests.breaker.destination"
    with provider() as fake:
        fake.failing = False
        _open(key, until=django_timezone.now() + timedelta(hours=1), policy=SLOW_BREAKER)
        held = [call_destination.enqueue(fake.url, f"/held-{i}") for i in range(20)]
        plain = [call_without_breaker.enqueue(fake.url, f"/plain-{i}") for i in range(20)]
        run_worker(concurrency=2)
        assert Job.objects.filter(pk__in=plain, status=JobStatus.SUCCEEDED).count() == len(plain)
        assert fake.count("/held") == 0
        assert len(_held(key)) == len(held)
        assert set(Job.objects.filter(pk__in=held).values_list("attempt", flat=True)) == {0}


@pytest.mark.django_db(transaction=True)
def test_a_per_call_breaker_key_separates_two_destinations_of_one_job_type():
    with provider() as fake:
        fake.failing = False
        fake.failing_paths = ("/a",)
        down = [call_destination.apply_async((fake.url, f"/a-{i}"), breaker_key="smtp:a").job_id for i in range(5)]
        up = [call_destination.apply_async((fake.url, f"/b-{i}"), breaker_key="smtp:b").job_id for i in range(5)]
        run_worker(concurrency=1)
        assert fake.count("/a") == SLOW_BREAKER.failures
        a, b = _row("smtp:a"), _row("smtp:b")
        assert a is not None and a.state == "open"
        assert b is None  # successes of a closed breaker write nothing
        assert len(_held("smtp:a")) == len(down) - SLOW_BREAKER.failures
        assert Job.objects.filter(pk__in=up, status=JobStatus.SUCCEEDED).count() == len(up)
        assert _row("tests.breaker.destination") is None


@pytest.mark.django_db(transaction=True)
def test_a_handler_opens_its_breaker_until_a_given_time():
    key = "tests.breaker.quota"
    until = (django_timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    first = breaker_tasks.quota_exhausted.enqueue(until.isoformat())
    others = [breaker_tasks.quota_exhausted.enqueue(until.isoformat()) for _ in range(3)]
    run_worker(concurrency=1, max_jobs=1)
    row = _row(key)
    assert row is not None and (row.state, row.open_until) == ("open", until)
    assert row.transitions[-1]["reason"] == "opened by the handler"
    assert row.recent_failures == []  # the attempt that opened it is no verdict
    assert Job.objects.get(pk=first).attempt == 1
    run_worker(concurrency=1)
    for job in Job.objects.filter(pk__in=others):
        assert (job.attempt, job.run_at, job.held_since is not None) == (0, until, True)
    [status] = [s for s in breaker_states() if s.key == key]
    assert status.effective == f"open until {until:%Y-%m-%d %H:%M:%S} UTC"
    assert status.held_jobs == len(others)


@pytest.mark.django_db(transaction=True)
def test_a_snooze_with_breaker_true_opens_the_breaker_until_the_snooze_ends():
    key = "tests.breaker.snooze_quota"
    until = (django_timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    first = breaker_tasks.snooze_until_the_quota_resets.enqueue(until.isoformat())
    others = [breaker_tasks.snooze_until_the_quota_resets.enqueue(until.isoformat()) for _ in range(3)]
    run_worker(concurrency=1, max_jobs=1)
    row = _row(key)
    assert row is not None and (row.state, row.open_until) == ("open", until)
    assert row.recent_failures == []  # a snooze is no verdict
    snoozed = Job.objects.get(pk=first)
    assert (snoozed.status, snoozed.attempt, snoozed.snoozes, snoozed.run_at) == ("queued", 0, 1, until)
    run_worker(concurrency=1)
    for job in Job.objects.filter(pk__in=others):
        assert (job.attempt, job.run_at, job.held_since is not None) == (0, until, True)


@pytest.mark.django_db
def test_a_snooze_with_breaker_true_behind_no_breaker_fails_its_own_job_readably():
    job_id = enqueue("tests.outcome.snooze_breaker", {})
    assert run_job(job_id, propagate=False) == "queued"
    job = Job.objects.get(pk=job_id)
    assert (job.attempt, job.snoozes) == (1, 0)
    assert job.last_error.startswith("BreakerValidationError:") and "breaker_key" in job.last_error


def _context(breaker_key: str | None):
    from django_workhorse.sql.claims import ClaimedJob
    from django_workhorse.worker import HandlerContext

    job = ClaimedJob(1, "tests.breaker.quota", "default", {}, 1, 5, {}, None, None, None, 1, breaker_key=breaker_key)
    return HandlerContext(job, alias="default", on_heartbeat=lambda: None)


def test_open_breaker_bounds():
    ctx = _context("smtp:a")
    now = datetime.now(timezone.utc)
    beyond = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-1)))
    for bad in [now - timedelta(seconds=1), datetime(2999, 1, 1), beyond, "2999-01-01T00:00:00+00:00", None]:
        with pytest.raises(BreakerValidationError) as caught:
            ctx.open_breaker(until=bad)
        assert caught.value.field == "until"
    with pytest.raises(BreakerValidationError) as caught:
        _context(None).open_breaker(until=now + timedelta(hours=1))
    assert caught.value.field == "breaker_key"


@pytest.mark.django_db
def test_open_breaker_accepts_the_largest_instant():
    ctx = _context("smtp:a")
    ctx.open_breaker(until=conf.MAX_STORED_DATETIME)
    row = _row("smtp:a")
    assert row is not None and (row.state, row.open_until) == ("open", conf.MAX_STORED_DATETIME)
    assert ctx.opened_breaker


@pytest.mark.django_db
def test_eager_mode_holds_jobs_of_an_open_breaker():
    _open("smtp:a", until=django_timezone.now() + timedelta(hours=1))
    job_id = enqueue("tests.record", {}, breaker_key="smtp:a")
    assert run_job(job_id) is None
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt, job.held_since is not None) == (JobStatus.QUEUED, 0, True)


@pytest.mark.django_db
def test_reset_closes_the_breaker_and_gives_its_held_jobs_back():
    _open("smtp:a", until=django_timezone.now() + timedelta(hours=1))
    job_id = enqueue("tests.record", {}, breaker_key="smtp:a")
    assert run_job(job_id) is None
    reset = reset_breaker("smtp:a", requested_by="alice")
    assert (reset.previous, reset.released) == ("open", 1)
    row = _row("smtp:a")
    assert row is not None and row.state == "closed"
    assert row.transitions[-1]["reason"] == "reset by alice"
    assert Job.objects.get(pk=job_id).held_since is None
    assert run_job(job_id) == "succeeded"
    assert reset_breaker("nothing-here").previous is None
    for bad in ["", "a" * (conf.MAX_BREAKER_KEY_BYTES + 1), "a\x00"]:
        with pytest.raises(BreakerValidationError):
            reset_breaker(bad)


def test_the_default_policy_is_the_documented_one():
    assert Breaker(failures=5, within=timedelta(minutes=1), cooldown=timedelta(seconds=30), probes=1) == DEFAULT_BREAKER


@pytest.mark.django_db
def test_a_handler_opening_its_breaker_with_a_bad_instant_fails_its_own_job_readably():
    job_id = breaker_tasks.open_with_a_naive_instant.enqueue()
    other = enqueue("tests.record", {})
    assert run_job(job_id, propagate=False) == "queued"
    job = Job.objects.get(pk=job_id)
    assert job.last_error.startswith("BreakerValidationError: until must be an aware datetime")
    assert _row("tests.breaker.bad_quota") is not None  # a failure behind its breaker, counted
    assert run_job(other) == "succeeded"
