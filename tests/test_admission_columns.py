"""The admission options of issue 26 travel from every enqueue path to the job row, bounded.

What they mean at claim time (rate budgets, fair share) is tested with the claim; here only that
they are stored as given, refused past their bounds with nothing written, and left out of the
fingerprint (a replay with other admission options replays).
"""

from __future__ import annotations

import pytest
from django.db import transaction

from django_workhorse import (
    EnqueueOptions,
    EnqueueRequest,
    EnqueueValidationError,
    Idempotency,
    RateLimit,
    Unique,
    conf,
    enqueue,
    enqueue_many,
)
from django_workhorse.models import Job

OPTIONS = {"rate_limit": "stripe", "rate_partition": "acct_42", "partition_key": "tenant-7"}
COLUMNS = tuple(OPTIONS)
LIMITS = {
    "stripe": RateLimit(100, partitioned=True),
    "a": RateLimit(10),
    "b": RateLimit(10, partitioned=True),
    "r" * conf.MAX_RATE_LIMIT_NAME_CHARS: RateLimit(10),
}


@pytest.fixture(autouse=True)
def _rate_limits(settings):
    settings.WORKHORSE_RATE_LIMITS = LIMITS


def _stored(job_id: int) -> dict[str, str | None]:
    return dict(zip(COLUMNS, Job.objects.values_list(*COLUMNS).get(pk=job_id), strict=True))


@pytest.mark.django_db
@pytest.mark.parametrize(
    "keyed",
    [{}, {"unique": Unique("u-1")}, {"idempotency": Idempotency("i-1")}],
    ids=["unkeyed", "unique", "idempotency"],
)
def test_one_enqueue_stores_the_admission_options(keyed):
    job_id = enqueue("tests.record", {}, **OPTIONS, **keyed)
    assert _stored(job_id) == OPTIONS


@pytest.mark.django_db
def test_a_batch_stores_the_admission_options_per_request():
    results = enqueue_many(
        [
            EnqueueRequest("tests.record", {"n": 1}, EnqueueOptions(rate_limit="a", partition_key="t1")),
            EnqueueRequest("tests.record", {"n": 2}),
            EnqueueRequest(
                "tests.record", {"n": 3}, EnqueueOptions(rate_limit="b", rate_partition="p", unique=Unique("u-2"))
            ),
        ]
    )
    stored = [_stored(result.job_id) for result in results]
    assert stored == [
        {"rate_limit": "a", "rate_partition": None, "partition_key": "t1"},
        {"rate_limit": None, "rate_partition": None, "partition_key": None},
        {"rate_limit": "b", "rate_partition": "p", "partition_key": None},
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "largest", "bound"),
    [
        ("rate_limit", "r" * conf.MAX_RATE_LIMIT_NAME_CHARS, "chars"),
        ("rate_partition", "é" * (conf.MAX_RATE_PARTITION_BYTES // 2), "bytes"),
        ("partition_key", "é" * (conf.MAX_PARTITION_KEY_BYTES // 2), "bytes"),
    ],
)
def test_admission_options_are_bounded_exactly(field, largest, bound):
    joined = {"rate_limit": "b"} if field == "rate_partition" else {}
    assert _stored(enqueue("tests.record", {}, **joined, **{field: largest}))[field] == largest
    one_past = largest + ("r" if bound == "chars" else "x")
    with transaction.atomic():
        for bad in (one_past, "", "a\x00b", "\ud800", 7):
            with pytest.raises(EnqueueValidationError) as caught:
                enqueue("tests.record", {"bad": True}, **joined, **{field: bad})
            assert caught.value.field == field
        assert Job.objects.filter(payload__bad=True).count() == 0  # nothing written, transaction usable


@pytest.mark.django_db
def test_admission_options_are_not_part_of_the_fingerprint():
    key = Idempotency("fp-1")
    first = enqueue("tests.record", {"n": 1}, idempotency=key, rate_limit="a", partition_key="t1")
    assert enqueue("tests.record", {"n": 1}, idempotency=key, rate_limit="b", rate_partition="p") == first
