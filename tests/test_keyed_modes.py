"""Keyed modes against real PostgreSQL: unique, debounce, throttle, mode exclusivity, lifecycle, maintenance.

Jobs are moved through their states by the worker's own statements (claim, record outcome,
reclaim) or by a real burst worker; elapsed time is simulated by moving timestamps with SQL,
never by sleeping.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection

from django_workhorse import (
    Debounce,
    EnqueueIdempotencyConflictError,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueResult,
    Idempotency,
    NonReplaceableReason,
    RetryPolicy,
    Throttle,
    Unique,
    cancel,
    enqueue_with_result,
    redrive,
)
from django_workhorse import sql as workhorse_sql
from django_workhorse.enqueueing.validation import prepare
from django_workhorse.models import TERMINAL_STATUSES, IdempotencyBinding, Job, JobEvent, JobStatus
from django_workhorse.operations.maintenance import prune_expired_bindings, prune_finished_jobs
from django_workhorse.worker.execution import Outcome, record
from tests.conftest import connect_directly, count_rows, race
from tests.worker_tasks import CALLS, run_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ACCEPTED = EnqueueOutcome.ACCEPTED
COALESCED = EnqueueOutcome.COALESCED
REPLACED = EnqueueOutcome.REPLACED
NON_REPLACEABLE = EnqueueOutcome.NON_REPLACEABLE

JOB_TYPE = "tests.record"
KEY = "order:42"
SCOPE = "orders"
WINDOW = timedelta(hours=1)
PAYLOAD = {"order": 42}
PAST = datetime(2000, 1, 1, tzinfo=timezone.utc)
LEASE = timedelta(minutes=5)
NEVER_SOON = RetryPolicy.fixed(timedelta(hours=1))
MODES = ("idempotency", "unique", "debounce", "throttle")
OTHER_MODE_PAIRS = [(existing, requested) for existing in MODES for requested in MODES if existing != requested]
LIVE_STATES = ("queued", "running", "retry")
TERMINAL_STATES = ("succeeded", "dead", "cancelled")


@pytest.fixture(autouse=True)
def _fresh_calls() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


# -- helpers ------------------------------------------------------------------------------------------


def keyed(mode: str, key: str = KEY, *, schedule: str = "reset", window: timedelta = WINDOW) -> Any:
    """The keyed-mode value of ``mode`` for ``key`` in the test scope."""
    if mode == "idempotency":
        return Idempotency(key, scope=SCOPE)
    if mode == "unique":
        return Unique(key, scope=SCOPE)
    if mode == "debounce":
        return Debounce(key, window, schedule=schedule, scope=SCOPE)  # type: ignore[arg-type]
    assert mode == "throttle"
    return Throttle(key, window, scope=SCOPE)


def submit(
    mode: str,
    payload: Any = PAYLOAD,
    *,
    key: str = KEY,
    job_type: str = JOB_TYPE,
    schedule: str = "reset",
    window: timedelta = WINDOW,
    **options: Any,
) -> EnqueueResult:
    """Enqueue one keyed request and return what PostgreSQL decided."""
    return enqueue_with_result(
        job_type, payload, **{mode: keyed(mode, key, schedule=schedule, window=window)}, **options
    )


def digest_of(mode: str, payload: Any = PAYLOAD, *, job_type: str = JOB_TYPE, **options: Any) -> str:
    """The hex request digest the library computes for a request (what bindings and events store)."""
    prepared = prepare(job_type, payload, EnqueueOptions(**{mode: keyed(mode)}, **options))
    assert prepared.binding is not None
    return prepared.binding.request_digest.hex()


def claim(job_id: int) -> workhorse_sql.claims.ClaimedJob:
    """Lease a queued job as a worker would (whatever its run_at)."""
    job = workhorse_sql.claims.claim_job("default", job_id=job_id, lease=LEASE, worker="tests", scheduled=True)
    assert job is not None, f"job {job_id} could not be claimed"
    return job


def end_attempt(job: workhorse_sql.claims.ClaimedJob, status: str) -> None:
    """Record how a claimed attempt ended, through the worker's outcome statement."""
    failed = ("failed", {"error": "boom"})
    outcomes = {
        "succeeded": Outcome(job, "succeeded", result_json="null", events=(("succeeded", {}),)),
        "dead": Outcome(job, "dead", error="boom", events=(failed, ("dead", {}))),
        "queued": Outcome(
            job,
            "queued",
            error="boom",
            run_at=datetime.now(timezone.utc) + timedelta(hours=1),
            events=(failed, ("retry_scheduled", {})),
        ),
        "cancelled": Outcome(job, "cancelled", events=(("cancelled", {}),)),
    }
    assert record("default", [outcomes[status]]) == [status]


def put_in_state(job_id: int, state: str) -> None:
    """Move a freshly enqueued (queued, attempt 0) job to ``state`` the way the library would."""
    if state == "queued":
        pass
    elif state == "running":
        claim(job_id)
    elif state == "retry":  # a failed attempt waiting for its retry: queued, attempt 1
        end_attempt(claim(job_id), "queued")
    elif state == "cancelled":
        assert cancel(job_id) == JobStatus.QUEUED
    else:
        end_attempt(claim(job_id), state)
    job = Job.objects.get(pk=job_id)
    expected = {"retry": ("queued", 1), "queued": ("queued", 0), "cancelled": ("cancelled", 0)}
    assert (job.status, job.attempt) == expected.get(state, (state, 1))


def expire_bindings() -> None:
    """Move every binding that has an expiry into the past (unique bindings have none)."""
    IdempotencyBinding.objects.filter(expires_at__isnull=False).update(expires_at=PAST)


def binding() -> IdempotencyBinding:
    return IdempotencyBinding.objects.get()


def binding_rows() -> list[dict[str, Any]]:
    """Every binding as plain values (bytes instead of memoryviews), to compare snapshots."""
    rows = IdempotencyBinding.objects.order_by("id").values()
    return [{k: bytes(v) if isinstance(v, memoryview) else v for k, v in row.items()} for row in rows]


def job_row(job_id: int) -> dict[str, Any]:
    return Job.objects.values().get(pk=job_id)


def live_job_ids() -> list[int]:
    return list(Job.objects.exclude(status__in=TERMINAL_STATUSES).order_by("id").values_list("id", flat=True))


def event_kinds(job_id: int) -> list[str]:
    return list(JobEvent.objects.filter(job_id=job_id).order_by("id").values_list("kind", flat=True))


def replaced_events(job_id: int) -> list[dict[str, Any]]:
    return list(
        JobEvent.objects.filter(job_id=job_id, kind="replaced").order_by("id").values_list("details", flat=True)
    )


def db_clock() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


# -- unique ---------------------------------------------------------------------------------------------


def test_unique_first_request_is_accepted_with_a_binding_that_lives_as_long_as_its_job():
    result = submit("unique")

    assert result == EnqueueResult(result.job_id, ACCEPTED)
    bound = binding()
    assert (bound.mode, bound.scope, bound.job_id, bound.expires_at) == ("unique", SCOPE, result.job_id, None)
    assert bytes(bound.request_digest).hex() == digest_of("unique")


def test_unique_repeat_coalesces_and_writes_nothing_and_notifies_nothing(listener):
    first = submit("unique")
    assert listener(5, 1) == ["default"]
    before, bindings_before = count_rows(), binding_rows()

    again = submit("unique")

    assert again == EnqueueResult(first.job_id, COALESCED)
    assert count_rows() == before and binding_rows() == bindings_before
    assert listener(0.2) == []


@pytest.mark.parametrize("state", LIVE_STATES)
def test_unique_repeat_coalesces_while_the_job_is_live(state):
    first = submit("unique").job_id
    put_in_state(first, state)
    before, job_before = count_rows(), job_row(first)

    again = submit("unique")

    assert again == EnqueueResult(first, COALESCED)
    assert count_rows() == before and job_row(first) == job_before


@pytest.mark.parametrize("state", LIVE_STATES)
def test_unique_changed_request_conflicts_while_the_job_is_live(state):
    first = submit("unique").job_id
    put_in_state(first, state)
    before = count_rows()

    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        submit("unique", {"order": 43})

    error = caught.value
    assert (error.job_id, error.mode, error.conflicting_fields, error.ordinal) == (first, "unique", ("payload",), None)
    assert count_rows() == before


@pytest.mark.parametrize("state", TERMINAL_STATES)
@pytest.mark.parametrize("payload", [PAYLOAD, {"order": 43}], ids=["same", "changed"])
def test_unique_key_is_free_once_the_job_is_terminal(state, payload):
    old = submit("unique").job_id
    put_in_state(old, state)
    old_before = job_row(old)

    taken = submit("unique", payload)

    assert taken.outcome == ACCEPTED and taken.job_id != old
    assert job_row(old) == old_before  # the old job is untouched
    bound = binding()
    assert (bound.job_id, bound.mode, bound.expires_at) == (taken.job_id, "unique", None)
    assert bytes(bound.request_digest).hex() == digest_of("unique", payload)
    assert live_job_ids() == [taken.job_id]
    assert submit("unique", payload) == EnqueueResult(taken.job_id, COALESCED)


def test_unique_key_is_freed_when_a_real_worker_runs_the_job_to_success():
    old = submit("unique").job_id

    assert run_worker().finished == {"succeeded": 1}

    assert Job.objects.get(pk=old).status == JobStatus.SUCCEEDED and CALLS.items() == [PAYLOAD]
    taken = submit("unique")
    assert taken.outcome == ACCEPTED and taken.job_id != old


def test_unique_key_is_freed_when_a_real_worker_buries_the_job():
    old = submit("unique", job_type="tests.always_fail", max_attempts=1).job_id

    assert run_worker().finished == {"dead": 1}

    taken = submit("unique", job_type="tests.always_fail", max_attempts=1)
    assert taken.outcome == ACCEPTED and taken.job_id != old


def test_unique_key_is_held_while_a_real_worker_schedules_a_retry():
    options = {"job_type": "tests.fail_until", "max_attempts": 5, "retry_policy": NEVER_SOON}
    old = submit("unique", {"succeed_on": 2}, **options).job_id
    bindings_before = binding_rows()

    assert run_worker().finished == {"queued": 1}

    assert (Job.objects.get(pk=old).status, Job.objects.get(pk=old).attempt) == (JobStatus.QUEUED, 1)
    assert binding_rows() == bindings_before
    assert submit("unique", {"succeed_on": 2}, **options) == EnqueueResult(old, COALESCED)
    with pytest.raises(EnqueueIdempotencyConflictError):
        submit("unique", {"succeed_on": 3}, **options)


def test_unique_key_of_a_running_job_asked_to_cancel_is_held_until_the_job_ends():
    old = submit("unique").job_id
    held = claim(old)

    assert cancel(old) == JobStatus.RUNNING
    assert submit("unique") == EnqueueResult(old, COALESCED)

    end_attempt(held, "cancelled")
    taken = submit("unique")
    assert taken.outcome == ACCEPTED and taken.job_id != old


def test_unique_keys_in_other_scopes_or_with_other_keys_are_independent():
    first = submit("unique").job_id
    other_key = submit("unique", key="order:43").job_id
    other_scope = enqueue_with_result(JOB_TYPE, PAYLOAD, unique=Unique(KEY, scope="elsewhere"))

    assert other_scope.outcome == ACCEPTED
    assert len({first, other_key, other_scope.job_id}) == 3


# -- unique: the release race -------------------------------------------------------------------------


def assert_one_owner_at_a_time(old: int, results: list[Any]) -> int:
    """Check racing enqueues onto a unique key whose job ``old`` finished meanwhile; return the owner.

    Each request either coalesced onto the old job (it was still live when the request looked) or
    onto the one new job, which exactly one request accepted and which was created only after the
    old job had finished: two live jobs never existed at once.
    """
    assert all(isinstance(r, EnqueueResult) for r in results), results
    new_ids = {r.job_id for r in results} - {old}
    assert len(new_ids) <= 1, results
    for r in results:
        assert r.outcome in ((COALESCED,) if r.job_id == old else (ACCEPTED, COALESCED)), results
    assert [r.outcome for r in results].count(ACCEPTED) == len(new_ids), results
    owner = new_ids.pop() if new_ids else old
    assert binding().job_id == owner
    old_job = Job.objects.get(pk=old)
    assert old_job.status in TERMINAL_STATUSES
    if owner != old:
        assert Job.objects.get(pk=owner).created_at >= old_job.finished_at
    assert live_job_ids() == ([owner] if owner != old else [])
    return owner


def finish_directly(conn: Any, job_id: int) -> None:
    """Mark a job succeeded from another session, committing at once."""
    conn.execute(
        "UPDATE workhorse_job SET status = 'succeeded', finished_at = clock_timestamp(),"
        " lease_token = NULL, lease_expires_at = NULL WHERE id = %s",
        [job_id],
    )


@pytest.mark.parametrize("mode", MODES)
def test_racing_producers_on_a_free_key_accept_exactly_one_new_job(mode):
    old = submit(mode).job_id
    put_in_state(old, "succeeded")
    expire_bindings()

    results = race(12, lambda i: submit(mode))

    assert all(isinstance(r, EnqueueResult) for r in results), results
    repeat = {"idempotency": EnqueueOutcome.REPLAYED, "debounce": REPLACED}.get(mode, COALESCED)
    assert sorted(r.outcome for r in results) == sorted([ACCEPTED] + [repeat] * 11)
    new_ids = {r.job_id for r in results}
    assert len(new_ids) == 1 and old not in new_ids
    assert live_job_ids() == list(new_ids) and binding().job_id in new_ids
    assert Job.objects.count() == 2


def test_racing_producers_in_different_modes_on_a_new_key_leave_it_to_one_mode():
    modes = [MODES[i % 4] for i in range(12)]

    results = race(12, lambda i: submit(modes[i]))

    accepted = [i for i, r in enumerate(results) if isinstance(r, EnqueueResult) and r.outcome == ACCEPTED]
    assert len(accepted) == 1, results
    winner, owner = modes[accepted[0]], results[accepted[0]].job_id
    repeat = {"idempotency": EnqueueOutcome.REPLAYED, "debounce": REPLACED}.get(winner, COALESCED)
    for i, result in enumerate(results):
        if i == accepted[0]:
            continue
        if modes[i] == winner:
            assert result == EnqueueResult(owner, repeat)
        elif modes[i] == "debounce":
            assert result == EnqueueResult(owner, NON_REPLACEABLE, NonReplaceableReason.INCOMPATIBLE_KEY_MODE)
        else:
            assert isinstance(result, EnqueueIdempotencyConflictError), result
            assert (result.conflicting_fields, result.mode, result.job_id) == (("mode",), winner, owner)
    assert list(Job.objects.values_list("id", flat=True)) == [owner]
    assert binding().mode == winner


def test_a_unique_job_finishing_while_producers_enqueue_never_has_a_live_successor_before_it_ends():
    old = submit("unique").job_id
    claim(old)

    with connect_directly() as finisher:

        def work(i: int) -> EnqueueResult | None:
            if i == 0:
                finish_directly(finisher, old)
                return None
            return submit("unique")

        results = race(9, work)

    assert results[0] is None
    assert_one_owner_at_a_time(old, results[1:])


def test_finishing_and_enqueueing_a_unique_key_in_every_interleaving_keeps_one_live_job():
    owner = submit("unique").job_id
    iterations = 30
    with connect_directly() as finisher:
        for _ in range(iterations):
            claim(owner)

            def work(i: int, job_id: int = owner) -> EnqueueResult | None:
                if i == 0:
                    finish_directly(finisher, job_id)
                    return None
                return submit("unique")

            result = race(2, work)[1]
            new_owner = assert_one_owner_at_a_time(owner, [result])
            if new_owner == owner:  # it coalesced onto the job that then finished: the key is free now
                fresh = submit("unique")
                assert fresh.outcome == ACCEPTED and fresh.job_id != owner
                new_owner = fresh.job_id
            owner = new_owner
            assert live_job_ids() == [owner]
    assert Job.objects.count() == iterations + 1


# -- debounce -------------------------------------------------------------------------------------------


def test_debounce_first_request_schedules_the_job_one_window_ahead_without_notifying(listener):
    start = db_clock()
    result = submit("debounce")
    end = db_clock()

    assert result == EnqueueResult(result.job_id, ACCEPTED)
    job = Job.objects.get(pk=result.job_id)
    assert start + WINDOW <= job.run_at <= end + WINDOW
    assert job.run_at - job.created_at == WINDOW
    bound = binding()
    assert (bound.mode, bound.job_id, bound.previous_request_digest) == ("debounce", job.pk, None)
    assert bound.expires_at == job.run_at + WINDOW
    assert event_kinds(job.pk) == []
    assert listener(0.2) == []


def test_debounce_repeat_replaces_the_pending_definition_in_place():
    first = submit("debounce").job_id
    deadline = datetime(2999, 1, 1, tzinfo=timezone.utc)
    before = count_rows()

    again = submit(
        "debounce",
        {"order": 43},
        job_type="tests.record_ctx",
        queue="billing",
        priority=7,
        tags=["vip", "eu"],
        max_attempts=3,
        retry_policy=NEVER_SOON,
        deadline=deadline,
        timeout=timedelta(seconds=30),
        concurrency_key="tenant-1",
        concurrency_limit=2,
    )

    assert again == EnqueueResult(first, REPLACED)
    job = Job.objects.get(pk=first)
    assert (job.job_type, job.queue, job.payload, job.priority, job.tags) == (
        "tests.record_ctx",
        "billing",
        {"order": 43},
        7,
        ["eu", "vip"],
    )
    assert (job.max_attempts, job.retry_policy, job.deadline, job.timeout) == (
        3,
        NEVER_SOON.to_json(),
        deadline,
        timedelta(seconds=30),
    )
    assert (job.concurrency_key, job.concurrency_limit, job.status, job.attempt) == ("tenant-1", 2, "queued", 0)
    # Only one event was added, no job and no binding.
    assert count_rows() == {**before, "workhorse_job_event": before["workhorse_job_event"] + 1}
    assert event_kinds(first) == ["replaced"]


def test_debounce_same_request_again_is_replaced_too(listener):
    first = submit("debounce").job_id
    digest = digest_of("debounce")

    again = submit("debounce")

    assert again == EnqueueResult(first, REPLACED)
    (details,) = replaced_events(first)
    assert (details["prior_request_digest"], details["request_digest"]) == (digest, digest)
    assert listener(0.2) == []


def test_debounce_reset_moves_run_at_to_now_plus_window():
    first = submit("debounce").job_id
    earlier = Job.objects.get(pk=first).run_at - timedelta(minutes=30)
    Job.objects.filter(pk=first).update(run_at=earlier)

    start = db_clock()
    assert submit("debounce", {"order": 43}) == EnqueueResult(first, REPLACED)
    end = db_clock()

    job = Job.objects.get(pk=first)
    assert start + WINDOW <= job.run_at <= end + WINDOW
    assert job.run_at > earlier
    assert binding().expires_at == job.run_at + WINDOW


def test_debounce_preserve_keeps_run_at():
    first = submit("debounce", schedule="preserve").job_id
    scheduled = Job.objects.get(pk=first).run_at
    expires = binding().expires_at

    assert submit("debounce", {"order": 43}, schedule="preserve") == EnqueueResult(first, REPLACED)
    assert submit("debounce", {"order": 44}, schedule="preserve") == EnqueueResult(first, REPLACED)

    job = Job.objects.get(pk=first)
    assert (job.run_at, job.payload) == (scheduled, {"order": 44})
    assert binding().expires_at == expires == scheduled + WINDOW


def test_debounce_replacements_record_a_chain_of_request_digests():
    payloads = [{"order": n} for n in range(4)]
    first = submit("debounce", payloads[0]).job_id
    digests = [digest_of("debounce", p) for p in payloads]
    assert bytes(binding().request_digest).hex() == digests[0]

    for n, payload in enumerate(payloads[1:], start=1):
        prior = bytes(binding().request_digest).hex()
        assert submit("debounce", payload) == EnqueueResult(first, REPLACED)
        bound = binding()
        assert prior == digests[n - 1]
        assert bytes(bound.request_digest).hex() == digests[n]
        assert bytes(bound.previous_request_digest).hex() == prior
        details = replaced_events(first)[-1]
        assert (details["prior_request_digest"], details["request_digest"]) == (prior, digests[n])

    chain = [(d["prior_request_digest"], d["request_digest"]) for d in replaced_events(first)]
    assert chain == list(zip(digests, digests[1:], strict=False))
    assert (
        JobEvent.objects.filter(job_id=first, kind="replaced").values_list("attempt", flat=True).distinct().get() == 0
    )


@pytest.mark.parametrize("state", ["running", "retry", *TERMINAL_STATES])
def test_debounce_after_the_job_started_or_finished_is_not_pending_and_leaves_it_unchanged(state):
    first = submit("debounce").job_id
    put_in_state(first, state)
    before, job_before, bindings_before = count_rows(), job_row(first), binding_rows()

    result = submit("debounce", {"order": 43})

    assert result == EnqueueResult(first, NON_REPLACEABLE, NonReplaceableReason.NOT_PENDING)
    assert job_row(first) == job_before and job_before["payload"] == PAYLOAD
    assert count_rows() == before and binding_rows() == bindings_before


def test_debounce_of_a_running_job_stays_not_pending_after_its_binding_expired():
    first = submit("debounce").job_id
    put_in_state(first, "running")
    expire_bindings()

    result = submit("debounce", {"order": 43})

    assert result == EnqueueResult(first, NON_REPLACEABLE, NonReplaceableReason.NOT_PENDING)
    assert Job.objects.count() == 1


def test_debounce_after_a_lease_reclaim_is_not_pending():
    first = submit("debounce").job_id
    claim(first)
    Job.objects.filter(pk=first).update(lease_expires_at=PAST)
    assert workhorse_sql.outcomes.reclaim_expired("default") == 1

    result = submit("debounce", {"order": 43})

    assert result == EnqueueResult(first, NON_REPLACEABLE, NonReplaceableReason.NOT_PENDING)
    assert Job.objects.get(pk=first).payload == PAYLOAD


@pytest.mark.parametrize("state", ["running", "retry", "due", "cancelled"])
def test_a_replacement_racing_a_claim_leaves_a_job_that_is_no_longer_pending_alone(state):
    # What replace_debounced re-checks under the job's row lock when the job changed after the
    # enqueue saw it pending (claimed, retried, cancelled or due meanwhile).
    first = submit("debounce").job_id
    if state == "due":
        Job.objects.filter(pk=first).update(run_at=PAST)
    else:
        put_in_state(first, state)
    before, job_before = count_rows(), job_row(first)
    request = prepare(JOB_TYPE, {"order": 43}, EnqueueOptions(debounce=keyed("debounce")))

    assert workhorse_sql.enqueue.replace_debounced("default", 0, request, first) is False

    assert job_row(first) == job_before and count_rows() == before


@pytest.mark.parametrize("binding_expired", [False, True])
def test_debounce_of_a_job_still_queued_after_its_window_elapsed_is_window_elapsed_pending(binding_expired):
    first = submit("debounce").job_id
    Job.objects.filter(pk=first).update(run_at=PAST)
    if binding_expired:
        expire_bindings()
    before, job_before = count_rows(), job_row(first)

    result = submit("debounce", {"order": 43})

    assert result == EnqueueResult(first, NON_REPLACEABLE, NonReplaceableReason.WINDOW_ELAPSED_PENDING)
    assert job_row(first) == job_before and count_rows() == before


@pytest.mark.parametrize("state", TERMINAL_STATES)
def test_debounce_key_is_free_once_the_job_is_terminal_and_its_binding_expired(state):
    old = submit("debounce").job_id
    put_in_state(old, state)
    assert submit("debounce", {"order": 43}).outcome == NON_REPLACEABLE  # terminal, window not over
    expire_bindings()
    old_before = job_row(old)

    start = db_clock()
    taken = submit("debounce", {"order": 43})

    assert taken.outcome == ACCEPTED and taken.job_id != old
    assert job_row(old) == old_before
    job = Job.objects.get(pk=taken.job_id)
    assert (job.status, job.payload) == ("queued", {"order": 43}) and job.run_at >= start + WINDOW
    bound = binding()
    assert (bound.job_id, bound.mode, bound.previous_request_digest) == (taken.job_id, "debounce", None)
    assert bound.expires_at == job.run_at + WINDOW
    assert submit("debounce", {"order": 44}) == EnqueueResult(taken.job_id, REPLACED)


def test_twelve_concurrent_debounce_requests_give_one_job_and_one_chain_of_replacements():
    payloads = [{"variant": i} for i in range(12)]
    digests = [digest_of("debounce", p) for p in payloads]
    assert len(set(digests)) == 12

    results = race(12, lambda i: submit("debounce", payloads[i]))

    assert all(isinstance(r, EnqueueResult) for r in results), results
    outcomes = [r.outcome for r in results]
    assert (outcomes.count(ACCEPTED), outcomes.count(REPLACED)) == (1, 11), outcomes
    (job_id,) = {r.job_id for r in results}
    assert list(Job.objects.values_list("id", flat=True)) == [job_id]
    assert IdempotencyBinding.objects.count() == 1

    events = replaced_events(job_id)
    assert len(events) == 11
    successor = {e["prior_request_digest"]: e["request_digest"] for e in events}
    assert len(successor) == 11  # every prior digest is superseded exactly once
    chain = [digests[outcomes.index(ACCEPTED)]]
    while chain[-1] in successor:
        chain.append(successor[chain[-1]])
    assert sorted(chain) == sorted(digests)  # one chain from the accepted request through all others
    assert [e["request_digest"] for e in events] == chain[1:]  # written in chain order

    job = Job.objects.get(pk=job_id)
    assert job.payload == payloads[digests.index(chain[-1])]
    bound = binding()
    assert bytes(bound.request_digest).hex() == chain[-1]
    assert bytes(bound.previous_request_digest).hex() == chain[-2]


def test_a_worker_claiming_a_debounced_job_while_requests_replace_it_runs_the_last_accepted_definition():
    first = submit("debounce", {"variant": 0}).job_id
    payloads = [{"variant": i} for i in range(1, 9)]

    def work(i: int) -> Any:
        if i == 0:  # a worker skips a row another transaction holds, and claims again at its next poll
            return wait_for(
                lambda: workhorse_sql.claims.claim_job(
                    "default", job_id=first, lease=LEASE, worker="t", scheduled=True
                ),
                what="the debounced job to be claimed",
            )
        return submit("debounce", payloads[i - 1])

    results = race(9, work)

    claimed, requests = results[0], results[1:]
    assert isinstance(claimed, workhorse_sql.claims.ClaimedJob), results
    assert all(isinstance(r, EnqueueResult) and r.job_id == first for r in requests), requests
    replaced = [r for r in requests if r.outcome == REPLACED]
    refused = [r for r in requests if r.outcome == NON_REPLACEABLE]
    assert len(replaced) + len(refused) == 8
    assert {r.reason for r in refused} <= {NonReplaceableReason.NOT_PENDING}
    # Every replacement happened before the claim, and the claim ran the definition they left.
    kinds = event_kinds(first)
    assert kinds == ["replaced"] * len(replaced) + ["claimed"]
    job = Job.objects.get(pk=first)
    assert (job.status, job.payload) == (JobStatus.RUNNING, claimed.payload)
    last = replaced_events(first)[-1]["request_digest"] if replaced else digest_of("debounce", {"variant": 0})
    assert last == digest_of("debounce", claimed.payload)


# -- throttle -------------------------------------------------------------------------------------------


def test_throttle_first_request_is_accepted_with_a_binding_for_one_window():
    result = submit("throttle")

    assert result.outcome == ACCEPTED
    job, bound = Job.objects.get(pk=result.job_id), binding()
    assert (bound.mode, bound.job_id) == ("throttle", job.pk)
    assert bound.expires_at - bound.created_at == WINDOW
    assert job.run_at == job.created_at  # throttling does not delay the accepted job


@pytest.mark.parametrize("state", [*LIVE_STATES, *TERMINAL_STATES])
def test_throttle_same_request_coalesces_whatever_the_job_state(state, listener):
    first = submit("throttle").job_id
    assert listener(5, 1) == ["default"]
    put_in_state(first, state)
    before, job_before = count_rows(), job_row(first)

    again = submit("throttle")

    assert again == EnqueueResult(first, COALESCED)
    assert count_rows() == before and job_row(first) == job_before
    assert listener(0.2) == []


@pytest.mark.parametrize("state", ["queued", "succeeded"])
def test_throttle_changed_request_within_the_window_conflicts(state):
    first = submit("throttle").job_id
    put_in_state(first, state)
    before = count_rows()

    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        submit("throttle", {"order": 43})
    assert (caught.value.job_id, caught.value.mode, caught.value.conflicting_fields) == (
        first,
        "throttle",
        ("payload",),
    )

    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        submit("throttle", window=timedelta(minutes=5))
    assert caught.value.conflicting_fields == ("window",)
    assert count_rows() == before


@pytest.mark.parametrize("state", ["queued", "succeeded"])
def test_throttle_accepts_a_new_job_once_the_window_has_passed(state):
    old = submit("throttle").job_id
    put_in_state(old, state)
    expire_bindings()
    old_before = job_row(old)

    taken = submit("throttle", {"order": 43})

    assert taken.outcome == ACCEPTED and taken.job_id != old
    assert job_row(old) == old_before
    bound = binding()
    assert bound.job_id == taken.job_id and bound.expires_at - bound.created_at == WINDOW
    assert submit("throttle", {"order": 43}) == EnqueueResult(taken.job_id, COALESCED)


# -- mode exclusivity -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("existing", "requested"), OTHER_MODE_PAIRS)
def test_a_live_key_refuses_requests_in_another_mode(existing, requested):
    owner = submit(existing).job_id
    before, job_before, bindings_before = count_rows(), job_row(owner), binding_rows()

    if requested == "debounce":
        result = submit(requested)
        assert result == EnqueueResult(owner, NON_REPLACEABLE, NonReplaceableReason.INCOMPATIBLE_KEY_MODE)
    else:
        with pytest.raises(EnqueueIdempotencyConflictError) as caught:
            submit(requested)
        error = caught.value
        assert (error.conflicting_fields, error.mode, error.job_id, error.ordinal) == (("mode",), existing, owner, None)

    assert count_rows() == before and job_row(owner) == job_before and binding_rows() == bindings_before


@pytest.mark.parametrize(("existing", "requested"), OTHER_MODE_PAIRS)
def test_a_free_key_is_taken_over_by_another_mode(existing, requested):
    old = submit(existing).job_id
    put_in_state(old, "succeeded")
    expire_bindings()

    taken = submit(requested)

    assert taken.outcome == ACCEPTED and taken.job_id != old
    bound = binding()
    assert (bound.mode, bound.job_id) == (requested, taken.job_id)
    assert bytes(bound.request_digest).hex() == digest_of(requested)
    lifetime = {"unique": None, "idempotency": timedelta(hours=24), "throttle": WINDOW, "debounce": 2 * WINDOW}
    assert (None if bound.expires_at is None else bound.expires_at - bound.created_at) == lifetime[requested]
    assert Job.objects.get(pk=old).status == JobStatus.SUCCEEDED


# -- the job lifecycle never touches keys ----------------------------------------------------------------


def test_a_failed_attempt_scheduling_a_retry_leaves_the_unique_binding_alone():
    first = submit("unique").job_id
    bindings_before = binding_rows()

    put_in_state(first, "retry")

    assert binding_rows() == bindings_before
    assert submit("unique") == EnqueueResult(first, COALESCED)


def test_a_lease_reclaim_leaves_the_unique_binding_alone():
    first = submit("unique").job_id
    claim(first)
    bindings_before = binding_rows()
    Job.objects.filter(pk=first).update(lease_expires_at=PAST)

    assert workhorse_sql.outcomes.reclaim_expired("default") == 1

    job = Job.objects.get(pk=first)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 1)
    assert binding_rows() == bindings_before
    assert submit("unique") == EnqueueResult(first, COALESCED)


def test_a_lease_reclaim_on_the_last_attempt_frees_the_unique_key():
    first = submit("unique", max_attempts=1).job_id
    claim(first)
    Job.objects.filter(pk=first).update(lease_expires_at=PAST)

    assert workhorse_sql.outcomes.reclaim_expired("default") == 1

    assert Job.objects.get(pk=first).status == JobStatus.DEAD
    taken = submit("unique", max_attempts=1)
    assert taken.outcome == ACCEPTED and binding().job_id == taken.job_id


def test_cancelling_a_queued_unique_job_keeps_the_binding_until_the_key_is_taken_again():
    first = submit("unique").job_id
    bindings_before = binding_rows()

    assert cancel(first) == JobStatus.QUEUED

    assert binding_rows() == bindings_before  # the binding stays, owning nothing
    taken = submit("unique")
    assert taken.outcome == ACCEPTED and binding().job_id == taken.job_id


@pytest.mark.parametrize("options", [{}, {"concurrency_key": "tenant-1"}], ids=["plain", "concurrency-key"])
def test_redriving_a_dead_unique_job_binds_nothing_and_leaves_the_key_free(options):
    old = submit("unique", job_type="tests.always_fail", max_attempts=1, **options).job_id
    assert run_worker().finished == {"dead": 1}
    bindings_before = binding_rows()

    redriven = redrive(old, request_id="ticket-1")

    assert binding_rows() == bindings_before  # the key still names the dead job, which owns nothing
    assert not IdempotencyBinding.objects.filter(job_id=redriven).exists()
    assert Job.objects.get(pk=redriven).status == JobStatus.QUEUED
    taken = submit("unique", job_type="tests.always_fail", max_attempts=1, **options)
    assert taken.outcome == ACCEPTED and taken.job_id not in (old, redriven)
    assert binding().job_id == taken.job_id
    assert live_job_ids() == sorted([redriven, taken.job_id])


# -- maintenance ----------------------------------------------------------------------------------------


def test_prune_expired_bindings_deletes_expired_idempotency_and_throttle_bindings_whatever_their_jobs_state():
    expired = [submit("idempotency", key="a").job_id, submit("throttle", key="b").job_id]
    live = [submit("idempotency", key="c").job_id, submit("throttle", key="d").job_id]
    put_in_state(expired[1], "running")
    IdempotencyBinding.objects.filter(job_id__in=expired).update(expires_at=PAST)

    assert prune_expired_bindings() == 2

    assert sorted(IdempotencyBinding.objects.values_list("job_id", flat=True)) == sorted(live)
    assert Job.objects.count() == 4  # pruning a binding never deletes its job
    assert submit("idempotency", key="a").outcome == ACCEPTED


def test_prune_expired_bindings_deletes_a_debounce_binding_only_once_its_job_is_terminal_and_it_expired():
    done_expired = submit("debounce", key="a").job_id
    done_live = submit("debounce", key="b").job_id
    queued_expired = submit("debounce", key="c").job_id
    for job_id in (done_expired, done_live):
        put_in_state(job_id, "succeeded")
    Job.objects.filter(pk=queued_expired).update(run_at=PAST)
    IdempotencyBinding.objects.filter(job_id__in=[done_expired, queued_expired]).update(expires_at=PAST)

    assert prune_expired_bindings() == 1

    assert sorted(IdempotencyBinding.objects.values_list("job_id", flat=True)) == sorted([done_live, queued_expired])
    result = submit("debounce", {"order": 43}, key="c")
    assert result == EnqueueResult(queued_expired, NON_REPLACEABLE, NonReplaceableReason.WINDOW_ELAPSED_PENDING)


def test_prune_expired_bindings_leaves_unique_bindings_to_their_jobs():
    first = submit("unique").job_id
    put_in_state(first, "succeeded")

    assert prune_expired_bindings() == 0
    assert binding().job_id == first


def test_prune_finished_jobs_deletes_a_terminal_unique_job_past_retention_with_its_binding():
    old = submit("unique").job_id
    put_in_state(old, "succeeded")
    Job.objects.filter(pk=old).update(finished_at=PAST)

    assert prune_finished_jobs(older_than=timedelta(days=1)) == 1

    assert not Job.objects.exists() and not IdempotencyBinding.objects.exists() and not JobEvent.objects.exists()
    assert submit("unique").outcome == ACCEPTED


def test_prune_finished_jobs_keeps_a_recent_job_and_old_ones_whose_idempotency_or_debounce_binding_is_live():
    recent = submit("unique", key="a").job_id
    owner = submit("idempotency", key="b").job_id
    debounced = submit("debounce", key="c").job_id
    for job_id in (recent, owner, debounced):
        put_in_state(job_id, "succeeded")
    Job.objects.filter(pk__in=[owner, debounced]).update(finished_at=PAST)

    assert prune_finished_jobs(older_than=timedelta(days=1)) == 0
    assert sorted(IdempotencyBinding.objects.values_list("job_id", flat=True)) == sorted([recent, owner, debounced])
    assert submit("idempotency", key="b") == EnqueueResult(owner, EnqueueOutcome.REPLAYED)

    IdempotencyBinding.objects.filter(job_id__in=[owner, debounced]).update(expires_at=PAST)
    assert prune_finished_jobs(older_than=timedelta(days=1)) == 2
    assert list(Job.objects.values_list("id", flat=True)) == [recent]
    assert list(IdempotencyBinding.objects.values_list("job_id", flat=True)) == [recent]
