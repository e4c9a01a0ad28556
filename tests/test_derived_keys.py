"""Auto-derived keys of ``@task(idempotent=True)``: the public recipe, precedence of the per-call keys, batches.

Expected keys are computed here with the standard library only, from the recipe in docs/derived-keys.md,
so a change of the serializer or of the hashing shows up as a failure instead of moving both sides.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

import django_workhorse
from django_workhorse import (
    Debounce,
    EnqueueIdempotencyConflictError,
    EnqueueOutcome,
    EnqueueResult,
    EnqueueValidationError,
    Idempotency,
    Throttle,
    Unique,
    task,
)
from django_workhorse.enqueueing.fingerprints import derived_key as library_derived_key
from django_workhorse.models import IdempotencyBinding, Job, JobStatus
from tests.conftest import count_rows
from tests.worker_tasks import run_worker

pytestmark = pytest.mark.django_db(transaction=True)

NOTHING_WRITTEN = {"workhorse_job": 0, "workhorse_binding": 0, "workhorse_job_event": 0}


@task(name="tests.derived.charge", idempotent=True)
def charge(ctx: object, customer_id: int, amount_cents: int = 1000) -> None:
    """The idempotent task of the FlexiQ example, with a default and a handler context."""


@task(name="tests.derived.plain")
def plain(customer_id: int, amount_cents: int = 1000) -> None:
    """The same signature without ``idempotent=True`` and without a context."""


@task(name="tests.derived.profile", idempotent=True)
def profile(ctx: object, name: str, address: dict[str, Any], labels: list[str] | None = None) -> None:
    """Takes text and nested objects, for the UTF-8 and key-sorting rules."""


@task(name="tests.derived.café", idempotent=True)
def cafe(order_id: int) -> None:
    """A task whose name itself is not ASCII."""


@task(name="tests.derived.spread", idempotent=True)
def spread(first: int, *rest: int, **extra: Any) -> None:
    """``*args`` and ``**kwargs`` appear in the derived arguments under their names."""


@task(name="tests.derived.stamp", idempotent=True)
def stamp(ctx: object, customer_id: int, requested_at: datetime) -> None:
    """Takes a moving value, the pitfall the docs warn about."""


def recipe_key(task_name: str, arguments: dict[str, Any]) -> str:
    """The documented recipe, with nothing from django_workhorse."""
    payload = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(task_name.encode("utf-8") + b"\x00" + payload.encode("utf-8")).hexdigest()
    return "auto:" + digest[:32]


def stored_hash(key: str, scope: str = "default") -> bytes:
    """What the binding table stores for a key: SHA-256 of ``scope + "\\x1f" + key``."""
    return hashlib.sha256((scope + "\x1f" + key).encode("utf-8")).digest()


def binding_of(job_id: int) -> IdempotencyBinding:
    return IdempotencyBinding.objects.get(job_id=job_id)


def binding_facts(job_id: int) -> tuple[str, str, bytes]:
    binding = binding_of(job_id)
    return binding.scope, binding.mode, bytes(binding.key_hash)


# -- the recipe ---------------------------------------------------------------------------------------------------


def test_derived_key_equals_the_documented_recipe_and_is_stored_hashed_in_the_default_scope_in_unique_mode():
    expected = recipe_key("tests.derived.charge", {"customer_id": 42, "amount_cents": 1000})

    result = charge.enqueue_with_result(42, 1000)

    assert charge.derived_key(42, 1000) == expected
    assert result.outcome is EnqueueOutcome.ACCEPTED
    assert binding_facts(result.job_id) == ("default", "unique", stored_hash(expected))


def test_derived_key_of_a_simple_call_matches_a_fixed_vector():
    # sha256(b'tests.derived.charge\x00{"amount_cents":1000,"customer_id":42}'), checked with sha256sum.
    assert charge.derived_key(42, 1000) == "auto:b607b2d2f514a2e8faedd6cc0796e0ed"
    assert recipe_key("tests.derived.charge", {"customer_id": 42, "amount_cents": 1000}) == (
        "auto:b607b2d2f514a2e8faedd6cc0796e0ed"
    )


def test_the_test_vector_published_in_the_docs_holds():
    arguments = {"customer_id": 42, "amount_cents": 1000, "currency": "eur"}

    assert library_derived_key("billing.charge", arguments) == "auto:5ed04059ea49c0a3d1395ddf6b11d798"
    assert recipe_key("billing.charge", arguments) == "auto:5ed04059ea49c0a3d1395ddf6b11d798"


def test_non_ascii_text_and_nested_objects_hash_as_unescaped_utf8_with_keys_sorted_at_every_level():
    address = {"zip": "100-0001", "city": "東京", "geo": {"lon": 139.69, "lat": 35.68}}
    arguments = {"name": "Zoë", "address": address, "labels": ["café", "ß"]}
    expected = recipe_key("tests.derived.profile", arguments)
    escaped = (
        "auto:"
        + hashlib.sha256(
            b"tests.derived.profile\x00" + json.dumps(arguments, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()[:32]
    )

    result = profile.enqueue_with_result("Zoë", address, ["café", "ß"])

    assert profile.derived_key("Zoë", address, labels=["café", "ß"]) == expected != escaped
    assert binding_facts(result.job_id) == ("default", "unique", stored_hash(expected))


def test_nested_objects_given_in_another_key_order_coalesce_onto_the_same_job():
    first = profile.enqueue_with_result("Zoë", {"city": "東京", "geo": {"lat": 35.68, "lon": 139.69}})
    again = profile.enqueue_with_result(address={"geo": {"lon": 139.69, "lat": 35.68}, "city": "東京"}, name="Zoë")

    assert again == EnqueueResult(first.job_id, EnqueueOutcome.COALESCED)
    assert Job.objects.count() == 1


def test_a_non_ascii_task_name_is_hashed_as_utf8():
    expected = recipe_key("tests.derived.café", {"order_id": 7})

    result = cafe.enqueue_with_result(7)

    assert cafe.derived_key(7) == expected
    assert binding_facts(result.job_id) == ("default", "unique", stored_hash(expected))


def test_the_derived_arguments_are_the_stored_payload_without_the_context():
    job_id = charge.enqueue(42)

    assert Job.objects.get(pk=job_id).payload == {"customer_id": 42, "amount_cents": 1000}
    assert bytes(binding_of(job_id).key_hash) == stored_hash(
        recipe_key("tests.derived.charge", {"customer_id": 42, "amount_cents": 1000})
    )


def test_star_args_and_star_kwargs_are_derived_under_their_parameter_names():
    expected = recipe_key("tests.derived.spread", {"first": 1, "rest": [2, 3], "extra": {"color": "red"}})

    assert spread.derived_key(1, 2, 3, color="red") == expected


def test_the_same_arguments_under_another_task_name_derive_another_key():
    assert plain.apply_async(args=(42, 1000), idempotent=True).outcome is EnqueueOutcome.ACCEPTED
    assert charge.enqueue_with_result(42, 1000).outcome is EnqueueOutcome.ACCEPTED
    assert Job.objects.count() == 2


# -- keyword order and defaults -----------------------------------------------------------------------------------


def test_positional_keyword_reordered_and_defaulted_calls_derive_one_key():
    keys = {
        charge.derived_key(42, 1000),
        charge.derived_key(customer_id=42, amount_cents=1000),
        charge.derived_key(amount_cents=1000, customer_id=42),
        charge.derived_key(42),
    }

    assert keys == {recipe_key("tests.derived.charge", {"customer_id": 42, "amount_cents": 1000})}


def test_the_same_call_spelled_four_ways_coalesces_onto_the_first_job_and_writes_nothing_more():
    first = charge.enqueue_with_result(42, 1000)
    rows_after_first = count_rows()

    repeats = [
        charge.enqueue_with_result(customer_id=42, amount_cents=1000),
        charge.apply_async(kwargs={"amount_cents": 1000, "customer_id": 42}),
        charge.enqueue_with_result(42),
    ]

    assert first.outcome is EnqueueOutcome.ACCEPTED
    assert repeats == [EnqueueResult(first.job_id, EnqueueOutcome.COALESCED)] * 3
    assert count_rows() == rows_after_first == {"workhorse_job": 1, "workhorse_binding": 1, "workhorse_job_event": 0}


def test_delay_and_enqueue_return_the_live_job_id_for_a_repeated_call():
    job_id = charge.delay(42, 1000)

    assert charge.enqueue(amount_cents=1000, customer_id=42) == job_id
    assert Job.objects.count() == 1


@pytest.mark.parametrize("other_call", [((43, 1000), {}), ((42, 1001), {}), ((42,), {"amount_cents": 999})])
def test_different_argument_values_derive_a_different_key_and_a_second_job(other_call):
    args, kwargs = other_call
    first = charge.enqueue_with_result(42, 1000)

    second = charge.enqueue_with_result(*args, **kwargs)

    assert charge.derived_key(*args, **kwargs) != charge.derived_key(42, 1000)
    assert second.outcome is EnqueueOutcome.ACCEPTED and second.job_id != first.job_id
    assert count_rows()["workhorse_job"] == count_rows()["workhorse_binding"] == 2


# -- precedence ---------------------------------------------------------------------------------------------------


def test_unique_key_wins_over_idempotency_key_and_derivation():
    result = charge.apply_async(args=(42, 1000), unique_key="charge:order-1", idempotency_key="charge:order-2")

    assert binding_facts(result.job_id) == ("default", "unique", stored_hash("charge:order-1"))
    assert charge.apply_async(args=(42, 1000), unique_key="charge:order-1").outcome is EnqueueOutcome.COALESCED
    # Neither the ignored idempotency key nor the derived key is bound: both take a new job.
    assert charge.apply_async(args=(42, 1000), idempotency_key="charge:order-2").outcome is EnqueueOutcome.ACCEPTED
    assert charge.enqueue_with_result(42, 1000).outcome is EnqueueOutcome.ACCEPTED
    assert Job.objects.count() == 3


def test_idempotency_key_wins_over_derivation_and_means_unique_mode():
    result = charge.apply_async(args=(42, 1000), idempotency_key="charge:order-3")

    assert binding_facts(result.job_id) == ("default", "unique", stored_hash("charge:order-3"))
    again = charge.apply_async(args=(42,), kwargs={"amount_cents": 1000}, idempotency_key="charge:order-3")
    assert again == EnqueueResult(result.job_id, EnqueueOutcome.COALESCED)
    assert charge.enqueue_with_result(42, 1000).outcome is EnqueueOutcome.ACCEPTED
    assert Job.objects.count() == 2


@pytest.mark.parametrize("shortcut", ["unique_key", "idempotency_key"])
def test_key_shortcuts_work_on_a_plain_task_and_ignore_idempotent_false(shortcut):
    first = plain.apply_async(args=(42,), idempotent=False, **{shortcut: "plain:42"})
    again = plain.apply_async(args=(42,), idempotent=False, **{shortcut: "plain:42"})

    assert again == EnqueueResult(first.job_id, EnqueueOutcome.COALESCED)
    assert binding_facts(first.job_id) == ("default", "unique", stored_hash("plain:42"))


def test_idempotent_false_on_an_idempotent_task_enqueues_without_a_key():
    first = charge.apply_async(args=(42, 1000), idempotent=False)
    second = charge.apply_async(args=(42, 1000), idempotent=False)

    assert (first.outcome, second.outcome) == (EnqueueOutcome.ACCEPTED, EnqueueOutcome.ACCEPTED)
    assert first.job_id != second.job_id
    assert count_rows()["workhorse_job"] == 2 and count_rows()["workhorse_binding"] == 0


def test_idempotent_true_on_a_plain_task_derives_the_key():
    expected = recipe_key("tests.derived.plain", {"customer_id": 42, "amount_cents": 1000})

    first = plain.apply_async(args=(42,), idempotent=True)
    again = plain.apply_async(kwargs={"amount_cents": 1000, "customer_id": 42}, idempotent=True)
    unkeyed = plain.enqueue_with_result(42)

    assert binding_facts(first.job_id) == ("default", "unique", stored_hash(expected))
    assert again == EnqueueResult(first.job_id, EnqueueOutcome.COALESCED)
    assert unkeyed.outcome is EnqueueOutcome.ACCEPTED and unkeyed.job_id != first.job_id
    assert count_rows()["workhorse_binding"] == 1


def test_an_explicit_idempotency_option_on_an_idempotent_task_replays_and_derives_no_key():
    first = charge.apply_async(args=(42, 1000), idempotency=Idempotency("charge:order-9"))
    again = charge.apply_async(args=(42, 1000), idempotency=Idempotency("charge:order-9"))

    assert first.outcome is EnqueueOutcome.ACCEPTED
    assert again == EnqueueResult(first.job_id, EnqueueOutcome.REPLAYED)
    assert binding_facts(first.job_id) == ("default", "idempotency", stored_hash("charge:order-9"))
    assert not IdempotencyBinding.objects.filter(key_hash=stored_hash(charge.derived_key(42, 1000))).exists()
    assert charge.enqueue_with_result(42, 1000).outcome is EnqueueOutcome.ACCEPTED  # the derived key was free


def test_an_explicit_idempotency_key_still_replays_after_its_job_is_cancelled():
    keyed = charge.apply_async(args=(42, 1000), idempotency=Idempotency("charge:order-10"))
    django_workhorse.cancel(keyed.job_id)

    again = charge.apply_async(args=(42, 1000), idempotency=Idempotency("charge:order-10"))

    assert again == EnqueueResult(keyed.job_id, EnqueueOutcome.REPLAYED)


def test_an_explicit_debounce_on_an_idempotent_task_uses_only_the_debounce_key():
    window = timedelta(minutes=5)

    first = charge.apply_async(args=(42, 1000), debounce=Debounce("charge:debounced", window=window))
    again = charge.apply_async(args=(42, 1001), debounce=Debounce("charge:debounced", window=window))

    assert first.outcome is EnqueueOutcome.ACCEPTED
    assert again == EnqueueResult(first.job_id, EnqueueOutcome.REPLACED)
    assert binding_facts(first.job_id) == ("default", "debounce", stored_hash("charge:debounced"))
    assert Job.objects.get(pk=first.job_id).payload == {"customer_id": 42, "amount_cents": 1001}
    assert count_rows()["workhorse_binding"] == 1


def test_an_explicit_unique_option_on_an_idempotent_task_keeps_its_own_scope_and_key():
    result = charge.apply_async(args=(42, 1000), unique=Unique("charge:42", scope="billing"))

    assert binding_facts(result.job_id) == ("billing", "unique", stored_hash("charge:42", scope="billing"))


@pytest.mark.parametrize(
    ("target", "shortcut", "mode", "field"),
    [
        (
            "charge",
            {"unique_key": "k-1"},
            {"debounce": Debounce("k-2", window=timedelta(minutes=1))},
            "unique_key, debounce",
        ),
        ("charge", {"idempotency_key": "k-1"}, {"idempotency": Idempotency("k-2")}, "idempotency_key, idempotency"),
        ("charge", {"unique_key": "k-1"}, {"unique": Unique("k-2")}, "unique_key, unique"),
        (
            "charge",
            {"idempotent": True},
            {"throttle": Throttle("k-2", window=timedelta(minutes=1))},
            "idempotent, throttle",
        ),
        ("plain", {"idempotent": True}, {"idempotency": Idempotency("k-2")}, "idempotent, idempotency"),
        ("plain", {"unique_key": "k-1", "idempotency_key": "k-3"}, {"unique": Unique("k-2")}, "unique_key, unique"),
    ],
)
def test_a_key_shortcut_combined_with_an_explicit_mode_is_refused_and_writes_nothing(target, shortcut, mode, field):
    chosen = {"charge": charge, "plain": plain}[target]

    with pytest.raises(EnqueueValidationError) as caught:
        chosen.apply_async(args=(42, 1000), **shortcut, **mode)

    assert caught.value.field == field
    assert count_rows() == NOTHING_WRITTEN


def test_a_key_shortcut_combined_with_an_explicit_mode_is_refused_by_as_request_too():
    with pytest.raises(EnqueueValidationError) as caught:
        charge.as_request((42, 1000), idempotency_key="k-1", debounce=Debounce("k-2", window=timedelta(minutes=1)))

    assert caught.value.field == "idempotency_key, debounce"


@pytest.mark.parametrize(
    ("shortcut", "secret"),
    [("unique_key", 918273645), ("idempotency_key", b"secret-bytes-key"), ("unique_key", ["secret-list-key"])],
)
def test_a_non_string_key_shortcut_is_refused_by_name_without_echoing_it(shortcut, secret):
    with pytest.raises(EnqueueValidationError) as caught:
        charge.apply_async(args=(42, 1000), **{shortcut: secret})

    assert caught.value.field == shortcut
    assert caught.value.value != secret
    assert str(secret) not in str(caught.value) and "secret" not in str(caught.value)
    assert count_rows() == NOTHING_WRITTEN


# -- unique semantics: one live job per key -----------------------------------------------------------------------


@pytest.mark.parametrize("call_options", [{}, {"unique_key": "charge:42"}, {"idempotency_key": "charge:42"}])
def test_the_key_frees_when_its_job_is_cancelled(call_options):
    first = charge.apply_async(args=(42, 1000), **call_options)
    assert django_workhorse.cancel(first.job_id) == JobStatus.QUEUED

    second = charge.apply_async(args=(42, 1000), **call_options)
    third = charge.apply_async(args=(42, 1000), **call_options)

    assert second.outcome is EnqueueOutcome.ACCEPTED and second.job_id != first.job_id
    assert third == EnqueueResult(second.job_id, EnqueueOutcome.COALESCED)
    assert Job.objects.get(pk=first.job_id).status == JobStatus.CANCELLED
    assert binding_of(second.job_id).mode == "unique"


def test_the_derived_key_frees_when_its_job_succeeds():
    first = charge.enqueue_with_result(42, 1000)

    run_worker()

    assert Job.objects.get(pk=first.job_id).status == JobStatus.SUCCEEDED
    second = charge.enqueue_with_result(42, 1000)
    assert second.outcome is EnqueueOutcome.ACCEPTED and second.job_id != first.job_id


def test_a_changed_request_under_a_live_derived_key_conflicts_and_names_the_field():
    first = charge.enqueue_with_result(42, 1000)

    with pytest.raises(EnqueueIdempotencyConflictError) as caught:
        charge.apply_async(args=(42, 1000), priority=90)

    assert (caught.value.job_id, caught.value.mode, caught.value.conflicting_fields) == (
        first.job_id,
        "unique",
        ("priority",),
    )
    assert count_rows()["workhorse_job"] == 1


# -- as_request and enqueue_many ----------------------------------------------------------------------------------


def test_enqueue_many_coalesces_a_repeated_derived_key_and_answers_in_input_order():
    results = django_workhorse.enqueue_many(
        [
            charge.as_request((42, 1000)),
            charge.as_request(kwargs={"customer_id": 42, "amount_cents": 1000}),
            charge.as_request((43, 1)),
        ]
    )

    assert results[0].outcome is EnqueueOutcome.ACCEPTED
    assert results[1] == EnqueueResult(results[0].job_id, EnqueueOutcome.COALESCED)
    assert results[2].outcome is EnqueueOutcome.ACCEPTED and results[2].job_id != results[0].job_id
    assert Job.objects.get(pk=results[0].job_id).payload == {"customer_id": 42, "amount_cents": 1000}
    assert Job.objects.get(pk=results[2].job_id).payload == {"customer_id": 43, "amount_cents": 1}
    assert count_rows()["workhorse_job"] == count_rows()["workhorse_binding"] == 2


def test_enqueue_many_coalesces_onto_a_job_enqueued_before_the_batch():
    live = charge.enqueue(42)

    results = django_workhorse.enqueue_many([charge.as_request((44,)), charge.as_request(kwargs={"customer_id": 42})])

    assert results[0].outcome is EnqueueOutcome.ACCEPTED
    assert results[1] == EnqueueResult(live, EnqueueOutcome.COALESCED)


def test_as_request_resolves_keys_as_apply_async_does():
    derived = charge.as_request((42, 1000))
    explicit = charge.as_request((42, 1000), unique_key="charge:x", idempotency_key="charge:y")
    unkeyed = charge.as_request((42, 1000), idempotent=False)
    forced = plain.as_request((42,), idempotent=True)

    assert derived.job_type == "tests.derived.charge"
    assert derived.payload == {"customer_id": 42, "amount_cents": 1000}
    assert derived.options.unique == Unique(recipe_key("tests.derived.charge", derived.payload))
    assert explicit.options.unique == Unique("charge:x")
    assert unkeyed.options.unique is None
    assert forced.options.unique == Unique(recipe_key("tests.derived.plain", {"customer_id": 42, "amount_cents": 1000}))


# -- pitfalls -----------------------------------------------------------------------------------------------------


def test_a_moving_datetime_argument_derives_a_new_key_every_call():
    first = stamp.enqueue_with_result(42, datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC))
    second = stamp.enqueue_with_result(42, datetime(2025, 3, 1, 12, 0, 1, tzinfo=UTC))

    assert stamp.derived_key(42, datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)) == recipe_key(
        "tests.derived.stamp", {"customer_id": 42, "requested_at": "2025-03-01T12:00:00Z"}
    )
    assert (first.outcome, second.outcome) == (EnqueueOutcome.ACCEPTED, EnqueueOutcome.ACCEPTED)
    assert first.job_id != second.job_id


def test_an_integer_and_an_equal_float_derive_different_keys_and_two_jobs():
    as_int = charge.enqueue_with_result(42, 1)
    as_float = charge.enqueue_with_result(42, 1.0)

    assert charge.derived_key(42, 1) == recipe_key("tests.derived.charge", {"customer_id": 42, "amount_cents": 1})
    assert charge.derived_key(42, 1.0) == recipe_key("tests.derived.charge", {"customer_id": 42, "amount_cents": 1.0})
    assert charge.derived_key(42, 1) != charge.derived_key(42, 1.0)
    assert as_float.outcome is EnqueueOutcome.ACCEPTED and as_float.job_id != as_int.job_id


@pytest.mark.parametrize(("one", "other"), [(1, True), (Decimal("1.1"), Decimal("1.10")), (0, False)])
def test_values_equal_in_python_but_serialized_differently_derive_different_keys(one, other):
    assert one == other
    assert charge.derived_key(42, one) != charge.derived_key(42, other)


@pytest.mark.parametrize("value", [object(), float("nan"), float("inf")])
def test_an_unserializable_argument_of_an_idempotent_task_is_an_enqueue_validation_error(value):
    for call in (lambda: charge.enqueue(42, value), lambda: plain.enqueue(42, value)):
        with pytest.raises(EnqueueValidationError) as caught:
            call()
        assert caught.value.field == "payload"
    assert count_rows() == NOTHING_WRITTEN


@pytest.mark.parametrize("shortcut", ["unique_key", "idempotency_key"])
def test_a_key_shortcut_is_bounded_by_name_at_512_utf8_bytes(shortcut):
    largest = "é" * 256  # 512 UTF-8 bytes
    assert charge.apply_async(args=(1,), **{shortcut: largest}).outcome is EnqueueOutcome.ACCEPTED
    for too_big_or_empty, size in (("é" * 256 + "x", 513), ("", 0)):
        with pytest.raises(EnqueueValidationError) as info:
            charge.apply_async(args=(2,), **{shortcut: too_big_or_empty})
        assert (info.value.field, info.value.bound, info.value.value) == (
            shortcut,
            "1..512 UTF-8 bytes",
            f"{size} bytes",
        )
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    ("value", "where"), [("bad\udc80", "payload['amount_cents']"), ({"n\x00": 1}, "payload['amount_cents']['n\\x00']")]
)
def test_unstorable_text_in_an_idempotent_tasks_arguments_is_refused_naming_where(value, where):
    # The derived key is computed from the arguments: they are checked as the payload first.
    for call in (lambda: charge.enqueue(42, value), lambda: plain.enqueue(42, value)):
        with pytest.raises(EnqueueValidationError) as caught:
            call()
        assert (caught.value.field, caught.value.bound) == (where, "text without NUL characters or lone surrogates")
    assert count_rows() == NOTHING_WRITTEN
