"""Encrypted jobs (decision 0024, increments 2 and 3): the payload sealed at enqueue, fingerprints and
derived keys keyed, the worker opening the payload and sealing the result and the error; fail closed."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections, transaction
from django.test import override_settings

from django_workhorse import (
    Debounce,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    Idempotency,
    Throttle,
    Unique,
    await_for,
    enqueue,
    enqueue_many,
    enqueue_with_result,
    redrive,
)
from django_workhorse import wait_for as wait_for_result
from django_workhorse.awaiting import listener as listeners
from django_workhorse.encryption import is_envelope
from django_workhorse.encryption.jobs import CHECKPOINT_PREFIX, EVENT_ERROR, LAST_ERROR, PAYLOAD, RESULT, open_value
from django_workhorse.enqueueing.fingerprints import (
    canonical_json,
    derived_step_key,
    field_digest,
    key_hash,
    keyed_field_digest,
)
from django_workhorse.exceptions import (
    DecryptionError,
    EncryptionNotConfiguredError,
    EnqueueIdempotencyConflictError,
    EnqueueValidationError,
    JobFailedError,
    WorkflowConflictError,
)
from django_workhorse.models import Checkpoint, IdempotencyBinding, Job, JobEvent, JobStatus
from django_workhorse.outcomes.values import Cancel, Fail
from django_workhorse.tasks.decorator import task
from django_workhorse.tasks.registry import register
from django_workhorse.tasks.retry import RetryPolicy
from django_workhorse.testing import eager
from django_workhorse.worker import HandlerContext
from django_workhorse.workflows import Workflow, WorkflowResult
from tests.encryption import ACTIVE, encryption_setting, new_key
from tests.worker_tasks import CALLS, make_worker, run_worker, running, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FAST_RETRY = RetryPolicy.fixed(timedelta(milliseconds=1))
SECRET = "tangerine-7f3a-secret"  # the distinctive text no stored row may show
SETTING = encryption_setting()
encrypted_settings = override_settings(WORKHORSE_ENCRYPTION=SETTING)


@register("tests.encryption.echo")
def echo(ctx: HandlerContext, payload: Any) -> Any:
    CALLS.add(payload)
    return {"echo": payload, "attempt": ctx.attempt}


@register("tests.encryption.fail")
def fail(payload: Any) -> Any:
    raise ValueError(f"cannot handle {payload['secret']}")


@register("tests.encryption.sized")
def sized(payload: dict[str, int]) -> str:
    return "x" * payload["chars"]


@register("tests.encryption.staged")
def staged(ctx: HandlerContext, payload: dict[str, Any]) -> Any:
    """Store a stage once; crash after it on attempt 1; return what the stage read back."""
    value = ctx.checkpoint("charge", lambda: {"charged": payload["secret"], "attempt": ctx.attempt})
    CALLS.add(value)
    if ctx.attempt == 1:
        raise RuntimeError("crashed after the charge")
    return value


@register("tests.encryption.big_checkpoint")
def big_checkpoint(ctx: HandlerContext, payload: dict[str, int]) -> Any:
    return ctx.checkpoint("big", lambda: "x" * payload["chars"])


@task(name="tests.encryption.auto", idempotent=True, encrypted=True)
def auto(order: str) -> str:
    return order


@pytest.fixture(autouse=True)
def _result_listener() -> Iterator[None]:
    """Stop the result listener a wait started, so its connection does not outlive the test."""
    yield
    listeners.listener("default").stop()


def _job(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


def _opened(job: Job, field: str, value: Any) -> Any:
    return json.loads(open_value(value, field=field, salt=bytes(job.cipher_salt), job_id=job.pk))


def _dump(table: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce(string_agg(row_to_json(t)::text, ''), '') FROM {table} t")  # noqa: S608
        return cursor.fetchone()[0]


# -- enqueue -------------------------------------------------------------------------------------


@encrypted_settings
def test_an_encrypted_job_round_trips_payload_to_handler_to_result():
    CALLS.clear()
    job_id = enqueue("tests.encryption.echo", {"secret": SECRET}, encrypted=True)
    job = _job(job_id)
    assert isinstance(job.payload, str) and job.payload.startswith(f"wh1:{ACTIVE}:")
    assert len(bytes(job.cipher_salt)) == 16
    assert _opened(job, PAYLOAD, job.payload) == {"secret": SECRET}

    run_worker()

    job = _job(job_id)
    assert CALLS.items() == [{"secret": SECRET}]
    assert job.status == JobStatus.SUCCEEDED
    assert is_envelope(job.result)
    assert _opened(job, RESULT, job.result) == {"echo": {"secret": SECRET}, "attempt": 1}


def test_encrypt_all_encrypts_jobs_that_do_not_say_and_false_keeps_one_clear():
    with override_settings(WORKHORSE_ENCRYPTION={**SETTING, "encrypt_all": True}):
        sealed = enqueue("tests.encryption.echo", {"secret": SECRET})
        clear = enqueue("tests.encryption.echo", {"n": 1}, encrypted=False)
        run_worker()
        job = _job(sealed)
        assert job.cipher_salt is not None and is_envelope(job.payload)
        assert _opened(job, RESULT, job.result)["echo"] == {"secret": SECRET}
    assert _job(clear).cipher_salt is None
    assert _job(clear).payload == {"n": 1}
    assert _job(clear).result == {"echo": {"n": 1}, "attempt": 1}


@encrypted_settings
def test_a_task_default_encrypts_its_calls_and_a_call_may_say_otherwise():
    assert _job(auto.enqueue("o-1")).cipher_salt is not None
    assert _job(auto.apply_async(["o-2"], encrypted=False).job_id).cipher_salt is None


def test_encrypted_true_without_configuration_raises_and_writes_nothing():
    with transaction.atomic():
        with pytest.raises(EncryptionNotConfiguredError) as caught:
            enqueue("tests.encryption.echo", {"secret": SECRET}, encrypted=True)
        assert Job.objects.count() == 0  # the transaction is still usable
    assert caught.value.field == "encrypted"
    assert str(caught.value) == "encrypted must be False or None while WORKHORSE_ENCRYPTION is not set, got True"
    with pytest.raises(EncryptionNotConfiguredError):
        enqueue_many([EnqueueRequest("tests.encryption.echo", {}, EnqueueOptions(encrypted=True))])
    with pytest.raises(EncryptionNotConfiguredError):
        auto.enqueue("o-1")
    assert Job.objects.count() == 0


@encrypted_settings
def test_encrypted_must_be_a_bool_or_none():
    with pytest.raises(EnqueueValidationError, match="encrypted must be True, False or None"):
        enqueue("tests.encryption.echo", {}, encrypted="yes")


def _stored_size(chars: int) -> int:
    """The stored size of the payload "x" * chars once encrypted: its envelope as a JSON string."""
    sealed = 12 + (chars + 2) + 16  # nonce, canonical JSON text, tag
    return 2 + len(f"wh1:{ACTIVE}:") + math.ceil(sealed * 4 / 3)


@encrypted_settings
def test_the_payload_bound_counts_the_envelope_exactly():
    limit = 300
    largest = max(chars for chars in range(limit) if _stored_size(chars) <= limit)
    with override_settings(WORKHORSE_MAX_PAYLOAD_BYTES=limit):
        job_id = enqueue("tests.encryption.echo", "x" * largest, encrypted=True)
        assert len(json.dumps(_job(job_id).payload)) == _stored_size(largest)
        with pytest.raises(EnqueueValidationError) as caught:
            enqueue("tests.encryption.echo", "x" * (largest + 1), encrypted=True)
        # the clear payload fits: only its envelope does not
        enqueue("tests.encryption.echo", "x" * (largest + 1))
    assert caught.value.field == "payload"
    assert caught.value.bound == f"at most {limit} bytes serialized"
    assert caught.value.value == f"{_stored_size(largest + 1)} bytes once encrypted"
    assert Job.objects.filter(cipher_salt__isnull=False).count() == 1


# -- fingerprints --------------------------------------------------------------------------------


@encrypted_settings
def test_an_encrypted_keyed_request_replays_and_its_digests_are_keyed():
    key = Idempotency("order-1")
    first = enqueue_with_result("tests.encryption.echo", {"secret": SECRET}, idempotency=key, encrypted=True)
    again = enqueue_with_result("tests.encryption.echo", {"secret": SECRET}, idempotency=key, encrypted=True)
    assert (first.outcome, again.outcome) == (EnqueueOutcome.ACCEPTED, EnqueueOutcome.REPLAYED)
    assert again.job_id == first.job_id and Job.objects.count() == 1
    digests = IdempotencyBinding.objects.get().field_digests
    text = canonical_json({"secret": SECRET})
    assert digests["encrypted"] == "true"
    assert digests["payload"] == keyed_field_digest(text) != field_digest(text)
    assert digests["queue"] == keyed_field_digest(canonical_json("default")) != field_digest(canonical_json("default"))


def test_the_cached_keyed_digests_follow_a_changed_fingerprint_key():
    from django_workhorse.enqueueing.validation import prepare

    def digests() -> dict[str, str]:
        job = prepare("tests.encryption.echo", {"n": 1}, EnqueueOptions(idempotency=Idempotency("k"), encrypted=True))
        assert job.binding is not None
        return job.binding.field_digests

    first, second = encryption_setting(), encryption_setting()
    with override_settings(WORKHORSE_ENCRYPTION=first):
        under_first = digests()
        assert digests() == under_first  # the same shape again: from the cache
    with override_settings(WORKHORSE_ENCRYPTION=second):
        under_second = digests()
    with override_settings(WORKHORSE_ENCRYPTION=first):
        assert digests() == under_first
    text = canonical_json("default")
    assert under_first["queue"] != under_second["queue"]
    with override_settings(WORKHORSE_ENCRYPTION=second):
        assert under_second["queue"] == keyed_field_digest(text)


@encrypted_settings
def test_two_unkeyed_enqueues_of_one_payload_store_different_ciphertexts():
    first = _job(enqueue("tests.encryption.echo", {"secret": SECRET}, encrypted=True))
    second = _job(enqueue("tests.encryption.echo", {"secret": SECRET}, encrypted=True))
    assert first.payload != second.payload
    assert bytes(first.cipher_salt) != bytes(second.cipher_salt)


@encrypted_settings
@pytest.mark.parametrize("first_encrypted", [True, False])
def test_a_key_sent_encrypted_and_then_in_clear_conflicts_on_encrypted_alone(first_encrypted):
    key = Idempotency("order-1")
    job_id = enqueue("tests.encryption.echo", {"n": 1}, idempotency=key, encrypted=first_encrypted)
    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue("tests.encryption.echo", {"n": 2}, idempotency=key, priority=5, encrypted=not first_encrypted)
    assert caught.value.conflicting_fields == ("encrypted",)
    assert caught.value.job_id == job_id


@encrypted_settings
def test_a_derived_key_of_an_encrypted_task_is_keyed():
    from django_workhorse.enqueueing.fingerprints import derived_key

    clear = derived_key("tests.encryption.auto", {"order": "o-1"})
    keyed = auto.derived_key("o-1")
    assert keyed.startswith("auto:") and keyed != clear
    assert keyed == derived_key("tests.encryption.auto", {"order": "o-1"}, encrypted=True)
    first, again = auto.enqueue_with_result("o-1"), auto.enqueue_with_result("o-1")
    assert again.outcome == EnqueueOutcome.COALESCED and again.job_id == first.job_id
    with override_settings(WORKHORSE_ENCRYPTION=encryption_setting()):  # another fingerprint key
        assert auto.derived_key("o-1") != keyed


# The acceptance rules of keyed modes, encrypted as in clear.
ENCRYPTIONS = pytest.mark.parametrize("encrypted", [False, True], ids=["clear", "encrypted"])


@encrypted_settings
@ENCRYPTIONS
def test_replays_and_conflicts_name_the_same_fields_encrypted_or_not(encrypted):
    key = Idempotency("order-1")
    first = enqueue_with_result("tests.encryption.echo", {"n": 1}, idempotency=key, encrypted=encrypted)
    assert enqueue_with_result("tests.encryption.echo", {"n": 1}, idempotency=key, encrypted=encrypted) == (
        type(first)(first.job_id, EnqueueOutcome.REPLAYED)
    )
    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue("tests.encryption.echo", {"n": 2}, idempotency=key, priority=3, encrypted=encrypted)
    assert caught.value.conflicting_fields == ("payload", "priority")
    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        enqueue("tests.encryption.echo", {"n": 1}, idempotency=key, queue="other", encrypted=encrypted)
    assert caught.value.conflicting_fields == ("queue",)


@encrypted_settings
@ENCRYPTIONS
def test_unique_and_throttle_coalesce_the_same_encrypted_or_not(encrypted):
    unique = [
        enqueue_with_result("tests.encryption.echo", {"n": n}, unique=Unique("u"), encrypted=encrypted).outcome
        for n in (1, 1)
    ]
    window = timedelta(minutes=5)
    throttled = [
        enqueue_with_result("tests.encryption.echo", {"n": 1}, throttle=Throttle("t", window), encrypted=encrypted)
        for _ in range(2)
    ]
    assert unique == [EnqueueOutcome.ACCEPTED, EnqueueOutcome.COALESCED]
    assert [r.outcome for r in throttled] == [EnqueueOutcome.ACCEPTED, EnqueueOutcome.COALESCED]
    assert throttled[0].job_id == throttled[1].job_id


@encrypted_settings
@ENCRYPTIONS
def test_debounce_replaces_the_pending_definition_the_same_encrypted_or_not(encrypted):
    CALLS.clear()
    mode = Debounce("d", window=timedelta(seconds=30))
    first = enqueue_with_result("tests.encryption.echo", {"v": 1}, debounce=mode, encrypted=encrypted)
    second = enqueue_with_result("tests.encryption.echo", {"v": 2}, debounce=mode, encrypted=encrypted)
    assert (first.outcome, second.outcome) == (EnqueueOutcome.ACCEPTED, EnqueueOutcome.REPLACED)
    assert second.job_id == first.job_id
    Job.objects.filter(pk=first.job_id).update(run_at=Job.objects.get(pk=first.job_id).created_at)
    run_worker()
    assert CALLS.items() == [{"v": 2}]  # the replacement's payload opens under the job's (new) salt
    assert (_job(first.job_id).cipher_salt is not None) is encrypted


@encrypted_settings
def test_a_batch_mixes_encrypted_and_clear_requests_and_replays_within_itself():
    options = EnqueueOptions(encrypted=True, idempotency=Idempotency("b-1"))
    results = enqueue_many(
        [
            EnqueueRequest("tests.encryption.echo", {"secret": SECRET}, options),
            EnqueueRequest("tests.encryption.echo", {"n": 2}),
            EnqueueRequest("tests.encryption.echo", {"secret": SECRET}, options),
        ]
    )
    assert [r.outcome for r in results] == [EnqueueOutcome.ACCEPTED, EnqueueOutcome.ACCEPTED, EnqueueOutcome.REPLAYED]
    assert _job(results[0].job_id).cipher_salt is not None
    assert _job(results[1].job_id).cipher_salt is None
    CALLS.clear()
    run_worker()
    assert sorted(map(json.dumps, CALLS.items())) == sorted(map(json.dumps, [{"secret": SECRET}, {"n": 2}]))


# -- the worker ----------------------------------------------------------------------------------


@encrypted_settings
def test_the_payload_shows_nowhere_in_the_stored_rows():
    enqueue("tests.encryption.echo", {"secret": SECRET}, idempotency=Idempotency("k-1"), encrypted=True)
    failing = enqueue("tests.encryption.fail", {"secret": SECRET}, encrypted=True, max_attempts=1)
    staged = enqueue("tests.encryption.staged", {"secret": SECRET}, encrypted=True, retry_policy=FAST_RETRY)
    run_worker(max_jobs=4)
    assert _job(staged).status == JobStatus.SUCCEEDED and Checkpoint.objects.filter(job_id=staged).exists()
    job = _job(failing)
    assert job.status == JobStatus.DEAD
    assert is_envelope(job.last_error)
    assert f"ValueError: cannot handle {SECRET}" in open_value(
        job.last_error, field=LAST_ERROR, salt=bytes(job.cipher_salt), job_id=job.pk
    )
    details = JobEvent.objects.get(job_id=failing, kind="failed").details
    assert open_value(details["error"], field=EVENT_ERROR, salt=bytes(job.cipher_salt), job_id=job.pk).startswith(
        f"ValueError: cannot handle {SECRET}"
    )
    for table in ("workhorse_job", "workhorse_binding", "workhorse_job_event", "workhorse_checkpoint"):
        assert SECRET not in _dump(table), table


@pytest.mark.parametrize("bound", [1024])
def test_the_result_bound_counts_the_envelope(bound):
    with override_settings(WORKHORSE_ENCRYPTION=SETTING, WORKHORSE_MAX_RESULT_BYTES=bound):
        fits = enqueue("tests.encryption.sized", {"chars": bound - 2}, encrypted=True, max_attempts=1)
        clear = enqueue("tests.encryption.sized", {"chars": bound - 2}, max_attempts=1)
        run_worker()
        job = _job(fits)
        assert job.status == JobStatus.DEAD
        error = open_value(job.last_error, field=LAST_ERROR, salt=bytes(job.cipher_salt), job_id=job.pk)
    assert error.startswith(f"ResultNotStorable: result must be at most {bound} bytes serialized")
    assert "bytes once encrypted" in error
    assert _job(clear).status == JobStatus.SUCCEEDED


def test_a_payload_under_an_unknown_key_fails_its_attempts_and_the_worker_goes_on(caplog):
    with override_settings(WORKHORSE_ENCRYPTION=encryption_setting(keys={"old": new_key()}, active="old")):
        lost = enqueue("tests.encryption.echo", {"secret": SECRET}, encrypted=True, max_attempts=2)
    with encrypted_settings:
        CALLS.clear()
        clear = enqueue("tests.encryption.echo", {"n": 1})
        worker = make_worker(concurrency=2)
        with caplog.at_level(logging.WARNING, logger="django_workhorse"), running(worker) as handle:
            wait_for(lambda: _job(lost).status == JobStatus.DEAD and _job(clear).status == JobStatus.SUCCEEDED)
            # the worker is still there: a job enqueued after runs too
            later = enqueue("tests.encryption.echo", {"n": 2}, encrypted=True)
            wait_for(lambda: _job(later).status == JobStatus.SUCCEEDED)
            assert handle.error is None
        job = _job(lost)
        error = open_value(job.last_error, field=LAST_ERROR, salt=bytes(job.cipher_salt), job_id=job.pk)
    assert job.attempt == 2
    assert error == (
        f"DecryptionError: cannot decrypt payload of job {lost}: key id 'old' is not among "
        'WORKHORSE_ENCRYPTION["keys"]'
    )
    assert {"secret": SECRET} not in CALLS.items()
    # The logs show why (the value that did not open, the key id): it holds nothing of the payload.
    dead = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"Job failed, dead id={lost} ")]
    assert dead == [f"Job failed, dead id={lost} type=tests.encryption.echo attempt=2/2 no more attempts error={error}"]


@encrypted_settings
def test_ciphertexts_swapped_between_two_jobs_fail_both_cleanly():
    first = enqueue("tests.encryption.echo", {"secret": SECRET}, encrypted=True, max_attempts=1)
    second = enqueue("tests.encryption.echo", {"secret": "other"}, encrypted=True, max_attempts=1)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workhorse_job AS a SET payload = b.payload FROM workhorse_job AS b "
            "WHERE (a.id, b.id) IN ((%s, %s), (%s, %s))",
            [first, second, second, first],
        )
    CALLS.clear()
    run_worker()
    assert CALLS.items() == []
    for job_id in (first, second):
        job = _job(job_id)
        error = open_value(job.last_error, field=LAST_ERROR, salt=bytes(job.cipher_salt), job_id=job.pk)
        assert job.status == JobStatus.DEAD
        assert error.startswith(f"DecryptionError: cannot decrypt payload of job {job_id}: it does not decrypt")


@encrypted_settings
def test_checkpoints_of_an_encrypted_job_are_sealed_and_read_back_opened():
    CALLS.clear()
    job_id = enqueue("tests.encryption.staged", {"secret": SECRET}, encrypted=True, retry_policy=FAST_RETRY)
    run_worker(max_jobs=2)
    job = _job(job_id)
    stored = Checkpoint.objects.get(job_id=job_id, name="charge").value
    assert is_envelope(stored)
    assert _opened(job, CHECKPOINT_PREFIX + "charge", stored) == {"charged": SECRET, "attempt": 1}
    # The second attempt read the first one's value back, opened.
    assert CALLS.items() == [{"charged": SECRET, "attempt": 1}] * 2
    assert job.status == JobStatus.SUCCEEDED
    assert SECRET not in _dump("workhorse_checkpoint")


@encrypted_settings
def test_a_checkpoint_copied_from_another_job_does_not_open():
    first = enqueue("tests.encryption.staged", {"secret": SECRET}, encrypted=True, max_attempts=1)
    run_worker()
    second = enqueue("tests.encryption.staged", {"secret": "other"}, encrypted=True, max_attempts=1)
    Checkpoint.objects.create(
        job_id=second, name="charge", attempt=1, value=Checkpoint.objects.get(job_id=first).value,
        created_at=_job(first).created_at,
    )  # fmt: skip
    run_worker()
    job = _job(second)
    error = open_value(job.last_error, field=LAST_ERROR, salt=bytes(job.cipher_salt), job_id=job.pk)
    assert job.status == JobStatus.DEAD
    assert error.startswith(f"DecryptionError: cannot decrypt checkpoint:charge of job {second}: it does not decrypt")


def test_the_checkpoint_bound_counts_the_envelope():
    with override_settings(WORKHORSE_ENCRYPTION=SETTING, WORKHORSE_MAX_RESULT_BYTES=1024):
        job_id = enqueue("tests.encryption.big_checkpoint", {"chars": 1000}, encrypted=True, max_attempts=1)
        clear = enqueue("tests.encryption.big_checkpoint", {"chars": 1000}, max_attempts=1)
        run_worker()
        job = _job(job_id)
        error = open_value(job.last_error, field=LAST_ERROR, salt=bytes(job.cipher_salt), job_id=job.pk)
    assert job.status == JobStatus.DEAD
    assert "checkpoint['big'] must be at most 1024 bytes serialized, got '" in error
    assert "bytes once encrypted" in error
    assert _job(clear).status == JobStatus.SUCCEEDED


@register("tests.encryption.decide")
def decide(payload: dict[str, str]) -> Any:
    raise (Cancel if payload["how"] == "cancel" else Fail)(f"gave up on {payload['secret']}")


@encrypted_settings
@pytest.mark.parametrize("how", ["cancel", "fail"])
def test_a_handlers_cancel_or_fail_reason_is_sealed_in_its_events(how):
    job_id = enqueue("tests.encryption.decide", {"how": how, "secret": SECRET}, encrypted=True)
    run_worker()
    job = _job(job_id)
    kind = "cancelled" if how == "cancel" else "failed"
    reason = JobEvent.objects.get(job_id=job_id, kind=kind).details["reason"]
    assert open_value(reason, field="event.reason", salt=bytes(job.cipher_salt), job_id=job_id) == (
        f"gave up on {SECRET}"
    )
    assert SECRET not in _dump("workhorse_job_event") + _dump("workhorse_job")


# -- workflows: results read by later steps ------------------------------------------------------


def _step(payload: dict[str, Any], *, encrypted: bool) -> EnqueueRequest:
    return EnqueueRequest("tests.wf.context", payload, EnqueueOptions(encrypted=encrypted, max_attempts=1))


def _diamond(*, key: Idempotency | None = None, a_encrypted: bool = True) -> Workflow:
    wf = Workflow("sealed", idempotency=key)
    wf.add("a", _step({"result": {"charged": SECRET}}, encrypted=a_encrypted))
    wf.add("b", _step({"result": ["packed"]}, encrypted=False), after="a")
    wf.add("c", _step({"result": "mailed"}, encrypted=True), after="a")
    wf.add("d", _step({"read": ["a", "c"]}, encrypted=True), after=["b", "c"])
    return wf


@encrypted_settings
def test_steps_read_encrypted_parents_and_steps_opened():
    CALLS.clear()
    _diamond().enqueue()
    run_worker()
    calls = {call["step"]: call for call in CALLS.items()}
    assert calls["b"]["parents"] == {"a": {"charged": SECRET}}
    assert calls["d"]["parents"] == {"b": ["packed"], "c": "mailed"}
    assert calls["d"]["read"] == {"a": {"result": {"charged": SECRET}}, "c": {"result": "mailed"}}
    assert SECRET not in _dump("workhorse_job")


@encrypted_settings
def test_a_keyed_workflow_of_encrypted_steps_replays_and_a_clear_step_makes_it_another():
    key = Idempotency("wf-1", scope="tests.encryption")
    first = _diamond(key=key).enqueue()
    assert _diamond(key=key).enqueue() == WorkflowResult(first.workflow_id, EnqueueOutcome.REPLAYED, first.jobs)
    with pytest.raises(WorkflowConflictError) as caught:
        _diamond(key=key, a_encrypted=False).enqueue()
    assert caught.value.steps == ("a",)


# -- waits ---------------------------------------------------------------------------------------


@encrypted_settings
def test_waits_return_an_encrypted_jobs_result_opened():
    result = enqueue_with_result("tests.encryption.echo", {"secret": SECRET}, encrypted=True)
    other = enqueue("tests.encryption.echo", {"secret": SECRET}, encrypted=True)
    with running(make_worker()):
        assert result.wait(30) == {"echo": {"secret": SECRET}, "attempt": 1}
        assert wait_for_result(other, timeout=30) == {"echo": {"secret": SECRET}, "attempt": 1}
    try:
        assert asyncio.run(await_for(other, timeout=5)) == {"echo": {"secret": SECRET}, "attempt": 1}
    finally:
        asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


@encrypted_settings
def test_a_wait_on_a_dead_encrypted_job_names_its_error_opened():
    job_id = enqueue("tests.encryption.fail", {"secret": SECRET}, encrypted=True, max_attempts=1)
    with running(make_worker()), pytest.raises(JobFailedError) as caught:
        wait_for_result(job_id, timeout=30)
    assert caught.value.error.startswith(f"ValueError: cannot handle {SECRET}")


@encrypted_settings
def test_a_workflow_wait_opens_its_encrypted_steps_results():
    result = _diamond().enqueue()
    with running(make_worker()):
        assert result.wait(30) == {"a": {"charged": SECRET}, "b": ["packed"], "c": "mailed", "d": None}


def test_a_wait_on_a_result_under_a_key_no_longer_configured_raises_decryption_error():
    with encrypted_settings:
        job_id = enqueue("tests.encryption.echo", {"secret": SECRET}, encrypted=True)
        run_worker()
    rotated = override_settings(WORKHORSE_ENCRYPTION=encryption_setting(keys={"new": new_key()}, active="new"))
    with rotated, pytest.raises(DecryptionError) as caught:
        wait_for_result(job_id, timeout=5)
    assert (caught.value.key_id, caught.value.reason) == (ACTIVE, DecryptionError.UNKNOWN_KEY)
    assert str(caught.value).startswith(f"cannot decrypt result of job {job_id}: key id '{ACTIVE}'")


# -- eager mode ----------------------------------------------------------------------------------


@encrypted_settings
def test_eager_mode_runs_an_encrypted_job_inline_as_a_worker_would():
    CALLS.clear()
    with eager():
        result = enqueue_with_result("tests.encryption.echo", {"secret": SECRET}, encrypted=True)
        with pytest.raises(ValueError, match=f"cannot handle {SECRET}"):
            enqueue("tests.encryption.fail", {"secret": SECRET}, encrypted=True, max_attempts=1)
    assert CALLS.items() == [{"secret": SECRET}]
    job = _job(result.job_id)
    assert job.status == JobStatus.SUCCEEDED and is_envelope(job.result)
    assert result.wait(5) == {"echo": {"secret": SECRET}, "attempt": 1}
    dead = Job.objects.get(job_type="tests.encryption.fail")
    assert dead.status == JobStatus.DEAD and is_envelope(dead.last_error)
    assert SECRET not in _dump("workhorse_job") + _dump("workhorse_job_event")


# -- redrives and step keys ----------------------------------------------------------------------


@encrypted_settings
def test_a_redriven_encrypted_job_keeps_its_salt_and_its_payload_opens():
    CALLS.clear()
    job_id = enqueue("tests.encryption.fail", {"secret": SECRET}, encrypted=True, max_attempts=1)
    run_worker()
    copy = redrive(job_id, request_id="again")
    assert bytes(_job(copy).cipher_salt) == bytes(_job(job_id).cipher_salt)
    run_worker()
    job = _job(copy)
    error = open_value(job.last_error, field=LAST_ERROR, salt=bytes(job.cipher_salt), job_id=copy)
    assert error.startswith(f"ValueError: cannot handle {SECRET}")  # the handler got the payload opened


@encrypted_settings
def test_an_encrypted_steps_key_is_keyed_and_a_clear_steps_is_not():
    CALLS.clear()
    key = Idempotency("wf-keys", scope="tests.encryption")
    result = _diamond(key=key).enqueue()
    run_worker()
    keys = {call["step"]: call["key"] for call in CALLS.items()}
    hashed = key_hash(key.scope, key.key)
    assert keys["a"] == derived_step_key(hashed, "a", encrypted=True) != derived_step_key(hashed, "a")
    assert keys["b"] == derived_step_key(hashed, "b")
    assert Job.objects.get(pk=result.jobs["d"]).status == JobStatus.SUCCEEDED


@encrypted_settings
def test_logs_show_an_encrypted_jobs_error_only_as_its_size(caplog):
    with caplog.at_level(logging.DEBUG, logger="django_workhorse"):
        job_id = enqueue("tests.encryption.fail", {"secret": SECRET}, encrypted=True, max_attempts=1)
        run_worker()
    dead = [r for r in caplog.records if r.getMessage().startswith(f"Job failed, dead id={job_id} ")]
    assert len(dead) == 1
    assert dead[0].getMessage().endswith(f" error=encrypted ({len(_last_error(job_id).encode())} bytes)")
    assert not any(SECRET in r.getMessage() or SECRET in str(r.__dict__) for r in caplog.records)


def _last_error(job_id: int) -> str:
    job = _job(job_id)
    return open_value(job.last_error, field=LAST_ERROR, salt=bytes(job.cipher_salt), job_id=job_id)
