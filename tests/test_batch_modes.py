"""enqueue_many in every keyed mode: in-batch repeats, collisions with earlier calls, whole-batch rollback.

Only a material conflict (a changed request, or a request in another mode than the key's owner)
fails a batch; debounce rows that cannot replace are reported per row. Batches take their keys in
sorted order, so two batches with the same keys in opposite order cannot deadlock.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_workhorse import (
    Debounce,
    EnqueueIdempotencyConflictError,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    EnqueueResult,
    Idempotency,
    NonReplaceableReason,
    Throttle,
    Unique,
    enqueue_many,
    enqueue_with_result,
)
from django_workhorse import sql as workhorse_sql
from django_workhorse.enqueueing.validation import prepare
from django_workhorse.models import IdempotencyBinding, Job, JobEvent
from tests.conftest import count_rows, race

pytestmark = pytest.mark.django_db(transaction=True)

ACCEPTED = EnqueueOutcome.ACCEPTED
REPLAYED = EnqueueOutcome.REPLAYED
COALESCED = EnqueueOutcome.COALESCED
REPLACED = EnqueueOutcome.REPLACED
NON_REPLACEABLE = EnqueueOutcome.NON_REPLACEABLE

JOB_TYPE = "tests.record"
SCOPE = "orders"
WINDOW = timedelta(hours=1)
PAST = datetime(2000, 1, 1, tzinfo=timezone.utc)
MODES = ("idempotency", "unique", "debounce", "throttle")
REFUSING_MODES = ("idempotency", "unique", "throttle")  # a changed request is a conflict
# What a repeat of the same request gets, per mode.
REPEAT_OUTCOME = {"idempotency": REPLAYED, "unique": COALESCED, "debounce": REPLACED, "throttle": COALESCED}
OTHER_MODE_PAIRS = [(existing, requested) for existing in MODES for requested in MODES if existing != requested]


# -- helpers ------------------------------------------------------------------------------------------


def keyed(mode: str, key: str) -> Any:
    """The keyed-mode value of ``mode`` for ``key`` in the test scope."""
    if mode == "idempotency":
        return Idempotency(key, scope=SCOPE)
    if mode == "unique":
        return Unique(key, scope=SCOPE)
    if mode == "debounce":
        return Debounce(key, WINDOW, scope=SCOPE)
    assert mode == "throttle"
    return Throttle(key, WINDOW, scope=SCOPE)


def req(mode: str, key: str, payload: Any = None, **options: Any) -> EnqueueRequest:
    """A batch entry for ``key`` in ``mode``; the payload defaults to one derived from the key."""
    return EnqueueRequest(JOB_TYPE, payload or {"key": key}, EnqueueOptions(**{mode: keyed(mode, key)}, **options))


def plain(n: int, **options: Any) -> EnqueueRequest:
    return EnqueueRequest(JOB_TYPE, {"plain": n}, EnqueueOptions(**options))


def submit(mode: str, key: str, payload: Any = None, **options: Any) -> EnqueueResult:
    """Enqueue one request on its own (an earlier call than the batch under test)."""
    return enqueue_with_result(JOB_TYPE, payload or {"key": key}, **{mode: keyed(mode, key)}, **options)


def digest_of(entry: EnqueueRequest) -> str:
    prepared = prepare(entry.job_type, entry.payload, entry.options)
    assert prepared.binding is not None
    return prepared.binding.request_digest.hex()


def replaced_events(job_id: int) -> list[dict[str, Any]]:
    return list(
        JobEvent.objects.filter(job_id=job_id, kind="replaced").order_by("id").values_list("details", flat=True)
    )


def job_row(job_id: int) -> dict[str, Any]:
    return Job.objects.values().get(pk=job_id)


def start(job_id: int) -> None:
    """Claim a job as a worker would, whatever its run_at: it is running, attempt 1."""
    claimed = workhorse_sql.claims.claim_job(
        "default", job_id=job_id, lease=timedelta(minutes=5), worker="t", scheduled=True
    )
    assert claimed is not None


# -- repeats inside one batch ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_key_repeated_inside_a_batch_maps_to_one_job_in_input_order(mode):
    results = enqueue_many([req(mode, "a"), req(mode, "b"), req(mode, "a"), plain(0), req(mode, "a")])

    repeat = REPEAT_OUTCOME[mode]
    assert [r.outcome for r in results] == [ACCEPTED, ACCEPTED, repeat, ACCEPTED, repeat]
    ids = [r.job_id for r in results]
    assert ids[0] == ids[2] == ids[4] and len({ids[0], ids[1], ids[3]}) == 3
    assert Job.objects.count() == 3 and IdempotencyBinding.objects.count() == 2
    assert len(replaced_events(ids[0])) == (2 if mode == "debounce" else 0)
    assert IdempotencyBinding.objects.get(job_id=ids[0]).mode == mode


def test_debounce_repeats_inside_a_batch_let_the_last_row_win_with_one_event_each():
    rows = [
        req("debounce", "a", {"v": 0}),
        req("debounce", "b"),
        req("debounce", "a", {"v": 1}, priority=3),
        req("debounce", "a", {"v": 2}, priority=5, tags=["last"]),
    ]

    results = enqueue_many(rows)

    assert [r.outcome for r in results] == [ACCEPTED, ACCEPTED, REPLACED, REPLACED]
    job_id = results[0].job_id
    assert results[2].job_id == results[3].job_id == job_id != results[1].job_id
    job = Job.objects.get(pk=job_id)
    assert (job.payload, job.priority, job.tags) == ({"v": 2}, 5, ["last"])
    digests = [digest_of(rows[i]) for i in (0, 2, 3)]
    chain = [(e["prior_request_digest"], e["request_digest"]) for e in replaced_events(job_id)]
    assert chain == [(digests[0], digests[1]), (digests[1], digests[2])]
    binding = IdempotencyBinding.objects.get(job_id=job_id)
    assert (bytes(binding.previous_request_digest).hex(), bytes(binding.request_digest).hex()) == tuple(digests[1:])
    assert replaced_events(results[1].job_id) == []


def test_a_repeat_of_a_refused_debounce_row_is_refused_too_and_other_modes_still_resolve():
    owner = submit("unique", "a").job_id

    results = enqueue_many([req("debounce", "a"), req("debounce", "a", {"v": 2}), req("unique", "a")])

    refused = EnqueueResult(owner, NON_REPLACEABLE, NonReplaceableReason.INCOMPATIBLE_KEY_MODE)
    assert results == [refused, refused, EnqueueResult(owner, COALESCED)]
    assert Job.objects.count() == 1


# -- collisions with earlier calls ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_batch_row_colliding_with_a_live_job_from_an_earlier_call_maps_to_it(mode):
    existing = submit(mode, "b").job_id
    # A debounce row may change the pending definition; the other modes need the same request.
    payload = {"key": "b", "changed": True} if mode == "debounce" else None

    results = enqueue_many([req(mode, "a"), req(mode, "b", payload), req(mode, "c")])

    assert [r.outcome for r in results] == [ACCEPTED, REPEAT_OUTCOME[mode], ACCEPTED]
    assert results[1].job_id == existing and len({r.job_id for r in results}) == 3
    assert Job.objects.count() == 3
    assert Job.objects.get(pk=existing).payload == (payload or {"key": "b"})


@pytest.mark.parametrize("mode", ["unique", "debounce"])
def test_a_batch_takes_over_a_free_key_once_and_maps_its_repeats_to_the_new_job(mode):
    old = submit(mode, "a").job_id
    start(old)
    Job.objects.filter(pk=old).update(status="succeeded", finished_at=PAST)
    IdempotencyBinding.objects.filter(expires_at__isnull=False).update(expires_at=PAST)

    results = enqueue_many([req(mode, "a"), req(mode, "a")])

    assert [r.outcome for r in results] == [ACCEPTED, REPEAT_OUTCOME[mode]]
    assert results[0].job_id == results[1].job_id != old
    assert IdempotencyBinding.objects.get().job_id == results[0].job_id


# -- material conflicts fail the whole batch --------------------------------------------------------------


@pytest.mark.parametrize("mode", REFUSING_MODES)
def test_a_changed_request_on_a_live_key_fails_the_whole_batch_and_names_its_ordinal(mode):
    owner = submit(mode, "c").job_id
    before = count_rows()

    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue_many([req(mode, "a"), plain(1), req(mode, "c", {"changed": True}), req(mode, "d")])

    error = caught.value
    assert (error.ordinal, error.job_id, error.mode, error.conflicting_fields) == (2, owner, mode, ("payload",))
    assert count_rows() == before


@pytest.mark.parametrize("mode", REFUSING_MODES)
def test_a_changed_request_repeated_inside_a_batch_fails_the_whole_batch(mode):
    before = count_rows()

    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue_many([req(mode, "a"), req(mode, "b"), req(mode, "a", {"changed": True})])

    assert (caught.value.ordinal, caught.value.mode, caught.value.conflicting_fields) == (2, mode, ("payload",))
    assert count_rows() == before


@pytest.mark.parametrize(("existing", "requested"), [p for p in OTHER_MODE_PAIRS if p[1] != "debounce"])
def test_a_request_in_another_mode_than_a_live_keys_owner_fails_the_whole_batch(existing, requested):
    owner = submit(existing, "c").job_id
    before = count_rows()

    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue_many([req(requested, "a"), plain(1), req(requested, "c")])

    error = caught.value
    assert (error.ordinal, error.job_id, error.mode, error.conflicting_fields) == (2, owner, existing, ("mode",))
    assert count_rows() == before


@pytest.mark.parametrize(("first", "second"), [p for p in OTHER_MODE_PAIRS if p[1] != "debounce"])
def test_two_modes_for_one_key_inside_a_batch_fail_it(first, second):
    before = count_rows()

    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue_many([req(first, "a"), req(first, "b"), req(second, "a")])

    assert (caught.value.ordinal, caught.value.mode, caught.value.conflicting_fields) == (2, first, ("mode",))
    assert count_rows() == before


@pytest.mark.parametrize("existing", REFUSING_MODES)
def test_a_debounce_row_on_another_modes_live_key_is_non_replaceable_and_the_batch_goes_through(existing):
    owner = submit(existing, "c").job_id
    owner_before = job_row(owner)

    results = enqueue_many([req("debounce", "a"), req("debounce", "c"), plain(2)])

    assert results[1] == EnqueueResult(owner, NON_REPLACEABLE, NonReplaceableReason.INCOMPATIBLE_KEY_MODE)
    assert results[0].outcome == results[2].outcome == ACCEPTED
    assert job_row(owner) == owner_before and Job.objects.count() == 3


@pytest.mark.parametrize("first", REFUSING_MODES)
def test_a_debounce_row_after_another_modes_row_of_the_same_key_in_one_batch_is_non_replaceable(first):
    results = enqueue_many([req(first, "a"), req("debounce", "a", {"v": 2})])

    assert results[0].outcome == ACCEPTED
    assert results[1] == EnqueueResult(results[0].job_id, NON_REPLACEABLE, NonReplaceableReason.INCOMPATIBLE_KEY_MODE)
    assert Job.objects.get().payload == {"key": "a"}


def test_a_failed_batch_sends_no_notification(listener):
    submit("unique", "c")
    assert listener(5, 1) == ["default"]

    with pytest.raises(EnqueueIdempotencyConflictError):
        enqueue_many([plain(0, queue="mail"), req("unique", "a", queue="other"), req("unique", "c", {"changed": 1})])

    assert listener(0.2) == []
    assert Job.objects.count() == 1


def test_a_failed_batch_leaves_the_callers_transaction_usable():
    submit("unique", "c")

    with transaction.atomic():
        kept = enqueue_with_result(JOB_TYPE, {"kept": True}).job_id
        with pytest.raises(EnqueueIdempotencyConflictError):
            enqueue_many([req("unique", "a"), req("unique", "c", {"changed": 1})])
        also_kept = enqueue_many([req("unique", "b")])[0].job_id

    assert Job.objects.filter(pk__in=[kept, also_kept]).count() == 2
    assert Job.objects.count() == 3 and not IdempotencyBinding.objects.filter(job__payload={"key": "a"}).exists()


# -- mixed batches and the fast path ------------------------------------------------------------------------


def test_a_mixed_batch_reports_non_replaceable_debounce_rows_without_failing():
    started = submit("debounce", "started").job_id
    start(started)
    due = submit("debounce", "due").job_id
    Job.objects.filter(pk=due).update(run_at=PAST)
    pending = submit("debounce", "pending").job_id
    unique_owner = submit("unique", "u").job_id
    before = {job_id: job_row(job_id) for job_id in (started, due, unique_owner)}

    results = enqueue_many(
        [
            plain(0),
            req("debounce", "started", {"v": 1}),
            req("debounce", "due", {"v": 1}),
            req("debounce", "u"),
            req("debounce", "pending", {"v": 1}),
            req("unique", "u"),
            req("idempotency", "new"),
            req("debounce", "fresh"),
        ]
    )

    assert results[1:6] == [
        EnqueueResult(started, NON_REPLACEABLE, NonReplaceableReason.NOT_PENDING),
        EnqueueResult(due, NON_REPLACEABLE, NonReplaceableReason.WINDOW_ELAPSED_PENDING),
        EnqueueResult(unique_owner, NON_REPLACEABLE, NonReplaceableReason.INCOMPATIBLE_KEY_MODE),
        EnqueueResult(pending, REPLACED),
        EnqueueResult(unique_owner, COALESCED),
    ]
    assert [results[i].outcome for i in (0, 6, 7)] == [ACCEPTED] * 3
    assert {job_id: job_row(job_id) for job_id in before} == before
    assert Job.objects.get(pk=pending).payload == {"v": 1}
    assert Job.objects.count() == 7


def test_a_batch_without_keys_is_one_statement_and_all_accepted(django_assert_num_queries):
    with django_assert_num_queries(1):
        results = enqueue_many([plain(n) for n in range(50)])

    assert all(r.outcome == ACCEPTED for r in results) and len({r.job_id for r in results}) == 50
    assert not IdempotencyBinding.objects.exists()


def test_a_batch_of_new_keys_in_every_mode_is_one_enqueue_statement():
    rows = [req(MODES[n % 4], f"k{n}") for n in range(40)] + [plain(n) for n in range(5)]

    with CaptureQueriesContext(connection) as queries:
        results = enqueue_many(rows)

    assert all(r.outcome == ACCEPTED for r in results) and len({r.job_id for r in results}) == 45
    # Django 5.2 logs a prepared statement's text as None; transaction control is not a statement here.
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK")
    statements = [q["sql"] for q in queries.captured_queries if not (q["sql"] or "").startswith(control)]
    assert len(statements) == 1, statements
    assert statements[0] is None or statements[0].count("INSERT INTO workhorse_binding") == 1, statements
    modes = dict(IdempotencyBinding.objects.values_list("job_id", "mode"))
    assert [modes.get(r.job_id) for r in results] == [MODES[n % 4] for n in range(40)] + [None] * 5


# -- concurrency ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [*MODES, "mixed"])
def test_batches_with_the_same_keys_in_opposite_order_do_not_deadlock(mode):
    keys = [f"k{n:03d}" for n in range(60)]
    rows = [req(MODES[n % 4] if mode == "mixed" else mode, key) for n, key in enumerate(keys)]

    def batch(i: int) -> list[EnqueueResult]:
        with transaction.atomic():
            return enqueue_many(rows if i % 2 == 0 else rows[::-1])

    for _ in range(4):
        results = race(2, batch)
        assert all(isinstance(r, list) for r in results), results
        forward, backward = results[0], results[1][::-1]
        assert [r.job_id for r in forward] == [r.job_id for r in backward]

    assert Job.objects.count() == len(keys) and IdempotencyBinding.objects.count() == len(keys)
    bound = dict(IdempotencyBinding.objects.values_list("job_id", "mode"))
    assert sorted(bound) == sorted(r.job_id for r in forward)


def test_debounce_batches_replacing_the_same_keys_in_opposite_order_do_not_deadlock(monkeypatch):
    keys = [f"k{n:03d}" for n in range(40)]
    originals = [r.job_id for r in enqueue_many([req("debounce", key) for key in keys])]
    # Hold each batch after its first statement until both have read their keys: neither holds a
    # lock yet, and both then replace the same pending jobs, one forwards and one backwards.
    both_read = threading.Barrier(2, timeout=30)
    waited = threading.local()
    real_enqueue_rows = workhorse_sql.enqueue.enqueue_rows

    def enqueue_rows_then_wait(*args: Any, **kwargs: Any) -> Any:
        rows = real_enqueue_rows(*args, **kwargs)
        if not getattr(waited, "done", False):
            waited.done = True
            both_read.wait()
        return rows

    monkeypatch.setattr(workhorse_sql.enqueue, "enqueue_rows", enqueue_rows_then_wait)

    def batch(i: int) -> list[EnqueueResult]:
        rows = [req("debounce", key, {"key": key, "batch": i}) for key in keys]
        with transaction.atomic():
            return enqueue_many(rows if i == 0 else rows[::-1])

    results = race(2, batch)

    assert all(isinstance(r, list) for r in results), results
    forward, backward = results[0], results[1][::-1]
    assert [r.job_id for r in forward] == [r.job_id for r in backward] == originals
    assert {r.outcome for r in forward + backward} == {REPLACED}
    # The batches were serialized: every job carries the definition of the batch that committed last.
    assert len({payload["batch"] for payload in Job.objects.values_list("payload", flat=True)}) == 1
    assert JobEvent.objects.filter(kind="replaced").count() == 2 * len(keys)
