"""Idempotent enqueue: outcomes, fingerprints, scopes, expiry, hash-only storage."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection

from django_workhorse import (
    EnqueueIdempotencyConflictError,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    Idempotency,
    RetryPolicy,
    Throttle,
    Unique,
    enqueue,
    enqueue_many,
    enqueue_with_result,
)
from django_workhorse.enqueueing.fingerprints import key_digest, key_hash, key_preview
from django_workhorse.models import EventKind, IdempotencyBinding, Job, JobStatus
from tests.conftest import count_rows

pytestmark = pytest.mark.django_db

KEY = Idempotency("capture:inv-2048", scope="invoice-capture")
PAYLOAD = {"invoiceId": "inv-2048", "amount": 1999}


def test_enqueue_accepts_a_new_request():
    result = enqueue_with_result("invoice.capture", PAYLOAD, queue="billing", idempotency=KEY)

    assert result.outcome == EnqueueOutcome.ACCEPTED and result.reason is None
    job = Job.objects.get(pk=result.job_id)
    assert (job.job_type, job.queue, job.payload, job.status) == (
        "invoice.capture",
        "billing",
        PAYLOAD,
        JobStatus.QUEUED,
    )
    binding = IdempotencyBinding.objects.get(job=job)
    assert (binding.scope, binding.mode, bytes(binding.key_hash)) == (
        "invoice-capture",
        "idempotency",
        key_hash("invoice-capture", "capture:inv-2048"),
    )
    assert binding.expires_at - binding.created_at == timedelta(hours=24)
    assert not job.events.exists()  # the job row records the enqueue (decision 0013)
    assert job.enqueued_event().kind == EventKind.ENQUEUED and job.enqueued_event().at == job.created_at


def test_enqueue_replays_equivalent_request_and_writes_nothing():
    first = enqueue("invoice.capture", PAYLOAD, idempotency=KEY)
    before = count_rows()

    again = enqueue_with_result("invoice.capture", PAYLOAD, idempotency=KEY)

    assert again.job_id == first and again.outcome == EnqueueOutcome.REPLAYED
    assert count_rows() == before


def sequence_value() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_value FROM workhorse_job_id_seq")
        return cursor.fetchone()[0]


@pytest.mark.parametrize(
    "mode",
    [Idempotency("k-1"), Unique("k-1"), Throttle("k-1", window=timedelta(minutes=1))],
    ids=lambda mode: type(mode).__name__,
)
def test_a_repeat_of_a_live_key_draws_no_job_id(mode):
    """A replay (or coalesce) is answered by the binding it finds: no id is drawn, nothing locked."""
    name = {Idempotency: "idempotency", Unique: "unique", Throttle: "throttle"}[type(mode)]
    first = enqueue("invoice.capture", PAYLOAD, **{name: mode})
    drawn = sequence_value()
    for _ in range(3):
        assert enqueue("invoice.capture", PAYLOAD, **{name: mode}) == first
    assert sequence_value() == drawn
    enqueue("invoice.capture", PAYLOAD, **{name: type(mode)("k-2", **_extra(mode))})
    assert sequence_value() == drawn + 1  # a new key draws one


def _extra(mode):
    return {"window": mode.window} if isinstance(mode, Throttle) else {}


def test_enqueue_and_enqueue_with_result_agree_on_the_job_id():
    job_id = enqueue("invoice.capture", PAYLOAD, idempotency=KEY)
    assert enqueue("invoice.capture", PAYLOAD, idempotency=KEY) == job_id
    assert enqueue_with_result("invoice.capture", PAYLOAD, idempotency=KEY).job_id == job_id


def test_enqueue_without_key_always_creates_a_job():
    assert enqueue("invoice.capture", PAYLOAD) != enqueue("invoice.capture", PAYLOAD)
    assert Job.objects.count() == 2 and IdempotencyBinding.objects.count() == 0


def test_enqueue_keeps_scopes_apart():
    a = enqueue("t", PAYLOAD, idempotency=Idempotency("order-123", scope="emails"))
    b = enqueue("t", PAYLOAD, idempotency=Idempotency("order-123", scope="invoices"))
    assert a != b


def test_enqueue_uses_the_default_scope_when_omitted():
    a = enqueue("t", PAYLOAD, idempotency=Idempotency("order-123"))
    assert enqueue("t", PAYLOAD, idempotency=Idempotency("order-123", scope="default")) == a
    assert IdempotencyBinding.objects.get().scope == "default"


def test_enqueue_accepts_options_as_one_value_and_keywords_override_it():
    options = EnqueueOptions(queue="billing", priority=5, idempotency=KEY)
    result = enqueue_with_result("t", PAYLOAD, options, priority=7)
    job = Job.objects.get(pk=result.job_id)
    assert (job.queue, job.priority) == ("billing", 7)


RUN_AT = datetime(2030, 1, 1, tzinfo=timezone.utc)
# Each field of the fingerprint, with a value that changes it.
CHANGES = {
    "queue": {"queue": "other"},
    "job_type": {"job_type": "other.type"},
    "payload": {"payload": {"invoiceId": "inv-2049"}},
    "priority": {"priority": 9},
    "concurrency_key": {"concurrency_key": "tenant-1"},
    "tags": {"tags": ["vip"]},
    "max_attempts": {"max_attempts": 3},
    "retry_policy": {"retry_policy": RetryPolicy.fixed(timedelta(seconds=5))},
    "deadline": {"deadline": RUN_AT},
    "timeout": {"timeout": timedelta(seconds=30)},
    "ttl": {"idempotency": Idempotency(KEY.key, scope=KEY.scope, ttl=timedelta(hours=1))},
    "run_at": {"run_at": RUN_AT},
    "delay": {"delay": timedelta(minutes=5)},
}


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_enqueue_conflict_names_the_changed_field(field):
    original = enqueue("invoice.capture", PAYLOAD, idempotency=KEY)
    change = dict(CHANGES[field])
    job_type = change.pop("job_type", "invoice.capture")
    payload = change.pop("payload", PAYLOAD)
    options = {"idempotency": KEY, **change}
    before = count_rows()

    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue(job_type, payload, **options)

    error = caught.value
    # A concurrency key brings its limit (from the settings here) into the fingerprint.
    assert error.conflicting_fields == ((field, "concurrency_limit") if field == "concurrency_key" else (field,))
    assert (error.job_id, error.mode, error.scope, error.ordinal) == (original, "idempotency", KEY.scope, None)
    assert error.key_preview == key_preview(KEY.key) and error.key_digest == key_digest(key_hash(KEY.scope, KEY.key))
    assert error.stored_request_digest != error.rejected_request_digest
    assert count_rows() == before


def test_enqueue_conflict_names_a_changed_concurrency_limit():
    enqueue("invoice.capture", PAYLOAD, idempotency=KEY, concurrency_key="tenant-1", concurrency_limit=2)
    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue("invoice.capture", PAYLOAD, idempotency=KEY, concurrency_key="tenant-1", concurrency_limit=3)
    assert caught.value.conflicting_fields == ("concurrency_limit",)


def test_enqueue_conflict_names_every_changed_field():
    enqueue("invoice.capture", PAYLOAD, idempotency=KEY)
    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue("invoice.capture", {"other": 1}, idempotency=KEY, priority=3, queue="q2")
    assert caught.value.conflicting_fields == ("payload", "priority", "queue")


def test_enqueue_treats_tag_order_and_payload_key_order_as_the_same_request():
    first = enqueue("t", {"a": 1, "b": 2}, idempotency=KEY, tags=["b", "a"])
    again = enqueue_with_result("t", {"b": 2, "a": 1}, idempotency=KEY, tags=("a", "b"))
    assert again.outcome == EnqueueOutcome.REPLAYED and again.job_id == first
    assert Job.objects.get(pk=first).tags == ["a", "b"]


def test_enqueue_treats_equal_instants_in_other_time_zones_as_the_same_request():
    first = enqueue("t", PAYLOAD, idempotency=KEY, run_at=RUN_AT)
    shifted = RUN_AT.astimezone(timezone(timedelta(hours=5)))
    assert enqueue_with_result("t", PAYLOAD, idempotency=KEY, run_at=shifted).job_id == first


def test_enqueue_omitted_run_at_replays_later_and_explicit_run_at_is_material():
    first = enqueue("t", PAYLOAD, idempotency=KEY)
    # A later retry of an immediate job: the acceptance time is not part of the request.
    assert enqueue_with_result("t", PAYLOAD, idempotency=KEY).outcome == EnqueueOutcome.REPLAYED
    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue("t", PAYLOAD, idempotency=KEY, run_at=Job.objects.get(pk=first).run_at)
    assert caught.value.conflicting_fields == ("run_at",)


def test_enqueue_explicit_default_values_replay_omitted_ones():
    first = enqueue("t", PAYLOAD, idempotency=KEY)
    again = enqueue_with_result(
        "t", PAYLOAD, idempotency=KEY, queue="default", priority=0, max_attempts=25, retry_policy=RetryPolicy(), tags=[]
    )
    assert again.outcome == EnqueueOutcome.REPLAYED and again.job_id == first


def test_enqueue_schedules_run_at_and_delay():
    at = enqueue("t", PAYLOAD, run_at=RUN_AT)
    later = enqueue("t", PAYLOAD, delay=timedelta(minutes=10))
    assert Job.objects.get(pk=at).run_at == RUN_AT
    job = Job.objects.get(pk=later)
    assert job.run_at - job.created_at == timedelta(minutes=10)


def test_enqueue_stores_every_option():
    job_id = enqueue(
        "t",
        PAYLOAD,
        queue="billing",
        priority=100,
        tags=["z", "a"],
        max_attempts=3,
        retry_policy=RetryPolicy.fixed(timedelta(seconds=5)),
        deadline=RUN_AT,
        timeout=timedelta(seconds=30),
        concurrency_key="tenant-1",
    )
    job = Job.objects.get(pk=job_id)
    assert (job.queue, job.priority, job.tags, job.max_attempts) == ("billing", 100, ["a", "z"], 3)
    assert job.retry_policy == {"kind": "fixed", "base_ms": 5000, "factor": 1.0, "max_ms": 5000, "jitter": 0.0}
    assert (job.deadline, job.timeout, job.concurrency_key) == (RUN_AT, timedelta(seconds=30), "tenant-1")


def test_enqueue_takes_over_an_expired_key_and_leaves_the_old_job_untouched():
    old = enqueue("t", PAYLOAD, idempotency=KEY)
    _expire_bindings()
    old_row = Job.objects.values().get(pk=old)

    taken = enqueue_with_result("t", {"new": True}, idempotency=KEY)

    assert taken.outcome == EnqueueOutcome.ACCEPTED and taken.job_id != old
    assert Job.objects.values().get(pk=old) == old_row
    binding = IdempotencyBinding.objects.get()
    assert binding.job_id == taken.job_id and binding.expires_at > binding.created_at
    assert enqueue_with_result("t", {"new": True}, idempotency=KEY).outcome == EnqueueOutcome.REPLAYED


def test_enqueue_never_stores_the_raw_key():
    secret = "capture:SECRET-INVOICE-7f3a9c"
    enqueue("t", PAYLOAD, idempotency=Idempotency(secret, scope="s"))
    enqueue_many([EnqueueRequest("t", {"i": 1}, EnqueueOptions(idempotency=Idempotency(secret + "-batch")))])
    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue("t", {"changed": 1}, idempotency=Idempotency(secret, scope="s"))
    assert secret not in str(caught.value) and secret not in repr(caught.value.__dict__)

    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        tables = [row[0] for row in cursor.fetchall()]
        for table in tables:
            # Every row of every table, as text; bytea shows as hex, so check the UTF-8 hex too.
            cursor.execute(f'SELECT t::text FROM "{table}" AS t')
            for (text,) in cursor.fetchall():
                assert secret not in text and secret.encode().hex() not in text, table
    assert "workhorse_binding" in tables


def test_enqueue_with_result_repr_of_keyed_modes_hides_the_key():
    assert "SECRET" not in repr(Idempotency("SECRET-KEY"))


def _expire_bindings():
    IdempotencyBinding.objects.update(expires_at=datetime(2000, 1, 1, tzinfo=timezone.utc))
