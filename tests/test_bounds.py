"""Every enqueue bound at its exact edge, through the public API: the edge passes, one past it writes nothing."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.test import override_settings

import django_workhorse
from django_workhorse import (
    Debounce,
    EnqueueOptions,
    EnqueueOutcome,
    EnqueueRequest,
    EnqueueValidationError,
    Idempotency,
    Throttle,
    Unique,
)
from django_workhorse.enqueueing.fingerprints import canonical_json, key_hash
from django_workhorse.models import IdempotencyBinding, Job
from tests.conftest import count_rows

pytestmark = pytest.mark.django_db

MiB = 1024 * 1024
MS = timedelta(milliseconds=1)
YEAR = timedelta(days=365)
# A key distinctive enough that finding it in an error means the error leaked it.
KEY = "RAWKEY-zq7x-leak-canary"
AWARE = datetime(2030, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=2)))
NAIVE = datetime(2030, 5, 6, 7, 8, 9)


def _expected_counts(before: dict[str, int], *, jobs: int, bindings: int) -> dict[str, int]:
    return {
        "workhorse_job": before["workhorse_job"] + jobs,
        "workhorse_binding": before["workhorse_binding"] + bindings,
        "workhorse_job_event": before["workhorse_job_event"],  # an enqueue writes no event (decision 0013)
    }


def accept(job_type: str = "tests.noop", payload: Any = None, **options: Any) -> Job:
    """Enqueue and assert one job, its event and (if keyed) its binding were written."""
    before = count_rows()
    job_id = django_workhorse.enqueue(job_type, payload, **options)
    bindings = 1 if options.get("idempotency") is not None else 0
    assert count_rows() == _expected_counts(before, jobs=1, bindings=bindings)
    return Job.objects.get(pk=job_id)


def reject(field: str, bound: str, call: Any) -> EnqueueValidationError:
    """Run ``call`` and assert it raised a validation error naming ``field`` and ``bound``, writing nothing."""
    before = count_rows()
    with pytest.raises(EnqueueValidationError) as info:
        call()
    error = info.value
    assert isinstance(error, ValueError)
    assert (error.field, error.bound) == (field, bound)
    assert str(error).startswith(f"{field} must be {bound}")
    assert count_rows() == before
    return error


def assert_no_raw_key(error: EnqueueValidationError, key: str = KEY) -> None:
    for text in (str(error), repr(error), repr(error.value), repr(error.args)):
        assert key not in text


KEY_BYTES = "1..512 UTF-8 bytes"
SCOPE_BYTES = "1..256 UTF-8 bytes"
LIFETIME = "a timedelta in 1 ms..365 days"


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"idempotency": Idempotency("k")}, id="key-1-byte"),
        pytest.param({"idempotency": Idempotency("k" * 512)}, id="key-512-bytes"),
        pytest.param({"idempotency": Idempotency("é" * 256)}, id="key-256-two-byte-chars"),
        pytest.param({"idempotency": Idempotency(KEY, scope="s")}, id="scope-1-byte"),
        pytest.param({"idempotency": Idempotency(KEY, scope="s" * 256)}, id="scope-256-bytes"),
        pytest.param({"idempotency": Idempotency(KEY, scope="é" * 128)}, id="scope-128-two-byte-chars"),
        pytest.param({"idempotency": Idempotency(KEY, ttl=MS)}, id="ttl-1ms"),
        pytest.param({"idempotency": Idempotency(KEY, ttl=YEAR)}, id="ttl-365-days"),
    ],
)
def test_enqueue_accepts_key_scope_ttl_at_edge(options):
    job = accept(**options)
    mode = options["idempotency"]
    binding = IdempotencyBinding.objects.get(job=job)
    assert (binding.scope, bytes(binding.key_hash)) == (mode.scope, key_hash(mode.scope, mode.key))
    assert binding.expires_at - binding.created_at == mode.ttl


@pytest.mark.parametrize(
    ("options", "field", "bound"),
    [
        pytest.param({"idempotency": Idempotency("")}, "idempotency.key", KEY_BYTES, id="key-empty"),
        pytest.param({"idempotency": Idempotency(KEY + "k" * (513 - len(KEY)))}, "idempotency.key", KEY_BYTES, id="key-513-bytes"),
        pytest.param({"idempotency": Idempotency("€" * 171)}, "idempotency.key", KEY_BYTES, id="key-171-euro-signs"),
        pytest.param({"idempotency": Idempotency("é" * 256 + "a")}, "idempotency.key", KEY_BYTES, id="key-257-chars-513-bytes"),
        pytest.param({"idempotency": Idempotency(KEY, scope="")}, "idempotency.scope", SCOPE_BYTES, id="scope-empty"),
        pytest.param({"idempotency": Idempotency(KEY, scope="s" * 257)}, "idempotency.scope", SCOPE_BYTES, id="scope-257-bytes"),
        pytest.param({"idempotency": Idempotency(KEY, scope="é" * 128 + "a")}, "idempotency.scope", SCOPE_BYTES, id="scope-129-chars-257-bytes"),
        pytest.param({"idempotency": Idempotency(KEY, scope="€" * 86)}, "idempotency.scope", SCOPE_BYTES, id="scope-86-euro-signs"),
        pytest.param({"idempotency": Idempotency(KEY, ttl=timedelta(0))}, "idempotency.ttl", LIFETIME, id="ttl-0"),
        pytest.param({"idempotency": Idempotency(KEY, ttl=timedelta(microseconds=999))}, "idempotency.ttl", LIFETIME, id="ttl-999us"),
        pytest.param({"idempotency": Idempotency(KEY, ttl=YEAR + MS)}, "idempotency.ttl", LIFETIME, id="ttl-365-days-1ms"),
        pytest.param({"idempotency": Idempotency(KEY + "\ud800")}, "idempotency.key", "text without NUL characters or lone surrogates", id="key-lone-surrogate"),
    ],
)  # fmt: skip
def test_enqueue_rejects_key_scope_ttl_past_edge_without_raw_key(options, field, bound):
    error = reject(field, bound, lambda: django_workhorse.enqueue("tests.noop", **options))
    assert_no_raw_key(error)


@pytest.mark.parametrize(
    ("options", "column", "stored"),
    [
        pytest.param({"priority": 0}, "priority", 0, id="priority-0"),
        pytest.param({"priority": 100}, "priority", 100, id="priority-100"),
        pytest.param({"max_attempts": 1}, "max_attempts", 1, id="max-attempts-1"),
        pytest.param({"max_attempts": 100}, "max_attempts", 100, id="max-attempts-100"),
        pytest.param({"tags": [f"t{i:02}" for i in range(20)]}, "tags", [f"t{i:02}" for i in range(20)], id="tags-20"),
        pytest.param({"tags": ["b", "t" * 100]}, "tags", ["b", "t" * 100], id="tag-100-chars"),
        pytest.param({"concurrency_key": "c" * 256}, "concurrency_key", "c" * 256, id="concurrency-key-256-bytes"),
        pytest.param(
            {"concurrency_key": "é" * 128}, "concurrency_key", "é" * 128, id="concurrency-key-128-two-byte-chars"
        ),
        pytest.param({"timeout": MS}, "timeout", MS, id="timeout-1ms"),
        pytest.param({"timeout": YEAR}, "timeout", YEAR, id="timeout-365-days"),
        pytest.param({"run_at": AWARE}, "run_at", AWARE, id="run-at-aware"),
        pytest.param({"deadline": AWARE}, "deadline", AWARE, id="deadline-aware"),
        pytest.param({"queue": "q" * 100}, "queue", "q" * 100, id="queue-100-chars"),
    ],
)
def test_enqueue_accepts_option_at_edge(options, column, stored):
    assert getattr(accept(**options), column) == stored


@pytest.mark.parametrize("delay", [timedelta(0), YEAR], ids=["delay-0", "delay-365-days"])
def test_enqueue_accepts_delay_at_edge(delay):
    job = accept(delay=delay)
    assert job.run_at - job.created_at == delay


def test_enqueue_accepts_job_type_of_255_chars():
    assert accept("j" * 255).job_type == "j" * 255


PRIORITY = "an integer in 0..100"
ATTEMPTS = "an integer in 1..100"
TAG_CHARS = "1..100 characters"
TIMEOUT = "a timedelta in 1 ms..365 days"
DELAY = "a timedelta in 0..365 days"
AWARE_BOUND = "an aware datetime (with a time zone)"
QUEUE_CHARS = "1..100 characters"


@pytest.mark.parametrize(
    ("options", "field", "bound"),
    [
        pytest.param({"priority": -1}, "priority", PRIORITY, id="priority-minus-1"),
        pytest.param({"priority": 101}, "priority", PRIORITY, id="priority-101"),
        pytest.param({"priority": True}, "priority", PRIORITY, id="priority-bool"),
        pytest.param({"max_attempts": 0}, "max_attempts", ATTEMPTS, id="max-attempts-0"),
        pytest.param({"max_attempts": 101}, "max_attempts", ATTEMPTS, id="max-attempts-101"),
        pytest.param({"tags": [f"t{i:02}" for i in range(21)]}, "tags", "at most 20 tags", id="tags-21"),
        pytest.param({"tags": ["t" * 101]}, "tags", TAG_CHARS, id="tag-101-chars"),
        pytest.param({"tags": [""]}, "tags", TAG_CHARS, id="tag-empty"),
        pytest.param({"tags": ["a", "b", "a"]}, "tags", "distinct", id="tags-duplicate"),
        pytest.param({"concurrency_key": "c" * 257}, "concurrency_key", "1..256 UTF-8 bytes", id="concurrency-key-257-bytes"),
        pytest.param({"concurrency_key": "é" * 128 + "a"}, "concurrency_key", "1..256 UTF-8 bytes", id="concurrency-key-129-chars-257-bytes"),
        pytest.param({"timeout": timedelta(0)}, "timeout", TIMEOUT, id="timeout-0"),
        pytest.param({"timeout": YEAR + MS}, "timeout", TIMEOUT, id="timeout-365-days-1ms"),
        pytest.param({"delay": timedelta(microseconds=-1)}, "delay", DELAY, id="delay-negative"),
        pytest.param({"delay": YEAR + MS}, "delay", DELAY, id="delay-365-days-1ms"),
        pytest.param({"run_at": NAIVE}, "run_at", AWARE_BOUND, id="run-at-naive"),
        pytest.param({"deadline": NAIVE}, "deadline", AWARE_BOUND, id="deadline-naive"),
        pytest.param({"run_at": AWARE, "delay": timedelta(0)}, "delay", "omitted when run_at is given", id="run-at-with-delay"),
        pytest.param({"queue": ""}, "queue", QUEUE_CHARS, id="queue-empty"),
        pytest.param({"queue": "q" * 101}, "queue", QUEUE_CHARS, id="queue-101-chars"),
    ],
)  # fmt: skip
def test_enqueue_rejects_option_past_edge(options, field, bound):
    reject(field, bound, lambda: django_workhorse.enqueue("tests.noop", **options))


@pytest.mark.parametrize("job_type", ["", "j" * 256], ids=["empty", "256-chars"])
def test_enqueue_rejects_job_type_past_edge(job_type):
    reject("job_type", "1..255 characters", lambda: django_workhorse.enqueue(job_type))


def test_enqueue_rejects_out_of_bounds_options_value():
    reject("priority", PRIORITY, lambda: django_workhorse.enqueue("tests.noop", None, EnqueueOptions(priority=101)))


def test_enqueue_rejects_unknown_option_by_name():
    bound = f"a known option ({', '.join(EnqueueOptions.names())})"
    reject("qeue", bound, lambda: django_workhorse.enqueue("tests.noop", qeue="x"))


def test_enqueue_rejects_two_keyed_modes_naming_both():
    options = {"idempotency": Idempotency(KEY), "unique": Unique(KEY)}
    error = reject(
        "idempotency, unique",
        "at most one keyed mode per request",
        lambda: django_workhorse.enqueue("tests.noop", **options),
    )
    assert_no_raw_key(error)


def test_enqueue_rejects_debounce_with_run_at():
    options = {"debounce": Debounce(KEY, window=MS), "run_at": AWARE}
    bound = "omitted with debounce (the window schedules the job)"
    reject("run_at", bound, lambda: django_workhorse.enqueue("tests.noop", **options))


@pytest.mark.parametrize(
    ("options", "field", "bound"),
    [
        pytest.param({"unique": Unique("")}, "unique.key", KEY_BYTES, id="unique-empty-key"),
        pytest.param({"unique": Unique(KEY), "priority": 101}, "priority", PRIORITY, id="unique-bad-priority"),
        pytest.param({"debounce": Debounce(KEY, window=timedelta(0))}, "debounce.window", LIFETIME, id="debounce-window-0"),
        pytest.param({"throttle": Throttle(KEY, window=YEAR + MS)}, "throttle.window", LIFETIME, id="throttle-window-too-long"),
        pytest.param({"throttle": Throttle(KEY, window=MS, scope="s" * 257)}, "throttle.scope", SCOPE_BYTES, id="throttle-scope-257"),
    ],
)  # fmt: skip
def test_enqueue_validates_keyed_modes_before_any_sql(options, field, bound):
    assert_no_raw_key(reject(field, bound, lambda: django_workhorse.enqueue("tests.noop", **options)))


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param({"unique": Unique("k" * 512, scope="s" * 256)}, id="unique"),
        pytest.param({"debounce": Debounce("k" * 512, window=YEAR, scope="s" * 256)}, id="debounce-year"),
        pytest.param({"debounce": Debounce(KEY, window=MS, schedule="preserve")}, id="debounce-1ms"),
        pytest.param({"throttle": Throttle("k" * 512, window=MS, scope="s" * 256)}, id="throttle-1ms"),
        pytest.param({"throttle": Throttle(KEY, window=YEAR)}, id="throttle-year"),
    ],
)
def test_enqueue_accepts_every_mode_at_its_largest_bounds(mode):
    result = django_workhorse.enqueue_with_result("tests.noop", **mode)
    assert result.outcome is EnqueueOutcome.ACCEPTED


def test_enqueue_rejects_debounce_with_delay():
    options = {"debounce": Debounce(KEY, window=MS), "delay": MS}
    bound = "omitted with debounce (the window schedules the job)"
    reject("delay", bound, lambda: django_workhorse.enqueue("tests.noop", **options))


def test_enqueue_rejects_unknown_debounce_schedule():
    options = {"debounce": Debounce(KEY, window=MS, schedule="later")}  # type: ignore[arg-type]
    reject("debounce.schedule", "'reset' or 'preserve'", lambda: django_workhorse.enqueue("tests.noop", **options))


@pytest.mark.parametrize(
    ("options", "ok"),
    [
        pytest.param({"concurrency_key": "k", "concurrency_limit": 1}, True, id="1"),
        pytest.param({"concurrency_key": "k", "concurrency_limit": 1000}, True, id="1000"),
        pytest.param({"concurrency_key": "k", "concurrency_limit": 0}, False, id="0"),
        pytest.param({"concurrency_key": "k", "concurrency_limit": 1001}, False, id="1001"),
        pytest.param({"concurrency_key": "k", "concurrency_limit": True}, False, id="bool"),
    ],
)
def test_enqueue_bounds_concurrency_limit_exactly(options, ok):
    call = lambda: django_workhorse.enqueue("tests.noop", **options)  # noqa: E731
    if ok:
        assert Job.objects.get(pk=call()).concurrency_limit == options["concurrency_limit"]
    else:
        reject("concurrency_limit", "an integer in 1..1000", call)


def test_enqueue_rejects_concurrency_limit_without_key():
    reject(
        "concurrency_limit",
        "given only with a concurrency_key",
        lambda: django_workhorse.enqueue("tests.noop", concurrency_limit=2),
    )


def test_enqueue_rejects_plain_string_mode_without_raw_key():
    with pytest.raises(EnqueueValidationError) as info:
        django_workhorse.enqueue("tests.noop", idempotency=KEY)
    assert info.value.field == "idempotency"
    assert_no_raw_key(info.value)


@pytest.mark.parametrize(
    ("field", "job_type", "payload", "options"),
    [
        pytest.param("payload['text']", "tests.noop", {"text": "\ud800"}, {}, id="payload"),
        pytest.param("job_type", "tests.\ud800", None, {}, id="job-type"),
        pytest.param("queue", "tests.noop", None, {"queue": "q\ud800"}, id="queue"),
        pytest.param("tags", "tests.noop", None, {"tags": ["t\ud800"]}, id="tags"),
    ],
)
def test_enqueue_rejects_lone_surrogate_before_sql(field, job_type, payload, options):
    before = count_rows()
    with pytest.raises(EnqueueValidationError) as info:
        django_workhorse.enqueue(job_type, payload, **options)
    assert info.value.field == field
    assert count_rows() == before


# Canonical JSON of a str is the string between two quotes: this one serializes to exactly 1 MiB.
EDGE_STRING = "p" * (MiB - 2)
PAYLOAD_BOUND = f"at most {MiB} bytes serialized"


def test_enqueue_accepts_payload_of_exactly_default_limit():
    assert len(canonical_json(EDGE_STRING).encode()) == MiB
    assert accept(payload=EDGE_STRING).payload == EDGE_STRING


def test_enqueue_accepts_multibyte_payload_of_exactly_default_limit():
    payload = "é" * (MiB // 2 - 1)
    assert len(canonical_json(payload).encode()) == MiB
    assert accept(payload=payload).payload == payload


@pytest.mark.parametrize("payload", [EDGE_STRING + "p", "é" * (MiB // 2 - 1) + "p"], ids=["ascii", "multibyte"])
def test_enqueue_rejects_payload_one_byte_over_default_limit(payload):
    error = reject("payload", PAYLOAD_BOUND, lambda: django_workhorse.enqueue("tests.noop", payload))
    assert error.value == f"{MiB + 1} bytes"


@override_settings(WORKHORSE_MAX_PAYLOAD_BYTES=MiB + 1)
def test_enqueue_accepts_larger_payload_when_setting_raises_limit():
    assert accept(payload=EDGE_STRING + "p").payload == EDGE_STRING + "p"


@override_settings(WORKHORSE_MAX_PAYLOAD_BYTES=MiB + 1)
def test_enqueue_rejects_payload_over_raised_limit():
    reject(
        "payload",
        f"at most {MiB + 1} bytes serialized",
        lambda: django_workhorse.enqueue("tests.noop", EDGE_STRING + "pp"),
    )


@pytest.mark.parametrize(
    "payload", [object(), {1, 2}, {"x": float("nan")}, {"at": object()}], ids=["object", "set", "nan", "nested-object"]
)
def test_enqueue_rejects_unserializable_payload(payload):
    reject("payload", "JSON-serializable (no NaN or infinity)", lambda: django_workhorse.enqueue("tests.noop", payload))


@pytest.mark.parametrize(
    ("payload", "where"),
    [("a\x00b", "payload"), ({"k\x00": 1}, "payload['k\\x00']"), ([1, "\\\x00"], "payload[1]")],
    ids=["in-string", "in-key", "after-backslash"],
)
def test_enqueue_rejects_payload_with_nul_character_naming_where(payload, where):
    bound = "text without NUL characters or lone surrogates"
    reject(where, bound, lambda: django_workhorse.enqueue("tests.noop", payload))


def test_enqueue_accepts_payload_with_literal_backslash_u0000_text():
    assert accept(payload={"text": "\\u0000"}).payload == {"text": "\\u0000"}


def _requests(count: int) -> list[EnqueueRequest]:
    return [EnqueueRequest("tests.noop", {"n": n}) for n in range(count)]


def test_enqueue_many_accepts_batch_of_1000():
    before = count_rows()
    results = django_workhorse.enqueue_many(_requests(1000))
    assert [result.outcome for result in results] == [EnqueueOutcome.ACCEPTED] * 1000
    assert count_rows() == _expected_counts(before, jobs=1000, bindings=0)


def test_enqueue_many_rejects_batch_of_1001():
    error = reject("requests", "at most 1000 requests", lambda: django_workhorse.enqueue_many(_requests(1001)))
    assert error.ordinal is None


def test_enqueue_many_rejects_bad_entry_naming_its_ordinal_writing_nothing():
    batch = _requests(4)
    batch[2] = EnqueueRequest("tests.noop", options=EnqueueOptions(priority=101))
    error = reject("priority", PRIORITY, lambda: django_workhorse.enqueue_many(batch))
    assert error.ordinal == 2
    assert str(error).endswith("(batch ordinal 2)")


def test_enqueue_many_rejects_bad_key_naming_its_ordinal_without_raw_key():
    batch = [EnqueueRequest("tests.noop", options=EnqueueOptions(idempotency=Idempotency(f"ok-{n}"))) for n in range(3)]
    batch[1] = EnqueueRequest("tests.noop", options=EnqueueOptions(idempotency=Idempotency(KEY * 30)))
    error = reject("idempotency.key", KEY_BYTES, lambda: django_workhorse.enqueue_many(batch))
    assert error.ordinal == 1
    assert_no_raw_key(error)


def test_enqueue_many_rejects_entry_that_is_not_a_request():
    batch: list[Any] = [*_requests(2), ("tests.noop", None)]
    error = reject("requests", "EnqueueRequest values", lambda: django_workhorse.enqueue_many(batch))
    assert error.ordinal == 2
