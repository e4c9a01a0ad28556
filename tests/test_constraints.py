"""The schema enforces the bounds itself when code bypasses enqueue (rows written directly)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from django.apps import apps
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from django_workhorse import enqueue, models
from django_workhorse.models import IdempotencyBinding, Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

# "é" is 2 UTF-8 bytes: 128 of them fill a 256-byte column that still has room for 256 characters,
# so these values reach the octet_length checks instead of varchar's own length limit.
BYTES_256 = "é" * 128
BYTES_257 = "é" * 128 + "a"


def violated_constraint(create: Any) -> str:
    """Run ``create`` in a savepoint and return the name of the constraint PostgreSQL reported."""
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        create()
    return info.value.__cause__.diag.constraint_name


def make_binding(**fields: Any) -> IdempotencyBinding:
    values = {
        "scope": "default",
        "key_hash": hashlib.sha256(b"default\x1fk").digest(),
        "key_preview": "•",
        "mode": "idempotency",
        "request_digest": bytes(32),
        "field_digests": {},
        "created_at": timezone.now(),
    }
    return IdempotencyBinding.objects.create(job=fields.pop("job", None) or JobFactory(), **{**values, **fields})


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        pytest.param({"priority": 101}, models.JOB_PRIORITY_CHECK, id="priority-101"),
        pytest.param({"priority": -1}, models.JOB_PRIORITY_CHECK, id="priority-minus-1"),
        pytest.param({"max_attempts": 0}, models.JOB_MAX_ATTEMPTS_CHECK, id="max-attempts-0"),
        pytest.param({"max_attempts": 101}, models.JOB_MAX_ATTEMPTS_CHECK, id="max-attempts-101"),
        pytest.param({"attempt": -1}, models.JOB_ATTEMPT_CHECK, id="attempt-minus-1"),
        pytest.param({"tags": [f"t{i:02}" for i in range(21)]}, models.JOB_TAGS_CHECK, id="tags-21"),
        pytest.param(
            {"concurrency_key": BYTES_257, "concurrency_limit": 1},
            models.JOB_CONCURRENCY_KEY_CHECK,
            id="concurrency-key-257-bytes",
        ),
        pytest.param(
            {"concurrency_key": "k", "concurrency_limit": 0}, models.JOB_CONCURRENCY_LIMIT_CHECK, id="limit-0"
        ),
        pytest.param(
            {"concurrency_key": "k", "concurrency_limit": 1001}, models.JOB_CONCURRENCY_LIMIT_CHECK, id="limit-1001"
        ),
        pytest.param({"concurrency_key": "k"}, models.JOB_CONCURRENCY_LIMIT_CHECK, id="key-without-limit"),
        pytest.param({"concurrency_limit": 2}, models.JOB_CONCURRENCY_LIMIT_CHECK, id="limit-without-key"),
        pytest.param({"queue": ""}, models.JOB_QUEUE_CHECK, id="queue-empty"),
        pytest.param({"job_type": ""}, models.JOB_TYPE_CHECK, id="job-type-empty"),
        pytest.param({"status": "paused"}, models.JOB_STATUS_CHECK, id="status-unknown"),
    ],
)
def test_job_schema_rejects_value_past_edge(fields, constraint):
    assert violated_constraint(lambda: JobFactory(**fields)) == constraint
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"priority": 0}, id="priority-0"),
        pytest.param({"priority": 100}, id="priority-100"),
        pytest.param({"max_attempts": 1}, id="max-attempts-1"),
        pytest.param({"max_attempts": 100}, id="max-attempts-100"),
        pytest.param({"tags": [f"t{i:02}" for i in range(20)]}, id="tags-20"),
        pytest.param({"concurrency_key": BYTES_256, "concurrency_limit": 1}, id="concurrency-key-256-bytes"),
        pytest.param({"concurrency_key": "k", "concurrency_limit": 1000}, id="concurrency-limit-1000"),
        pytest.param({"queue": "q", "job_type": "j"}, id="queue-and-job-type-1-char"),
        pytest.param({"status": "cancelled"}, id="status-cancelled"),
    ],
)
def test_job_schema_accepts_value_at_edge(fields):
    job = JobFactory(**fields)
    job.refresh_from_db()
    assert {name: getattr(job, name) for name in fields} == fields


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        pytest.param({"key_hash": bytes(31)}, models.BINDING_KEY_HASH_CHECK, id="key-hash-31-bytes"),
        pytest.param({"key_hash": bytes(33)}, models.BINDING_KEY_HASH_CHECK, id="key-hash-33-bytes"),
        pytest.param({"scope": BYTES_257}, models.BINDING_SCOPE_CHECK, id="scope-257-bytes"),
        pytest.param({"scope": ""}, models.BINDING_SCOPE_CHECK, id="scope-empty"),
        pytest.param({"mode": "forever"}, models.BINDING_MODE_CHECK, id="mode-unknown"),
    ],
)
def test_binding_schema_rejects_value_past_edge(fields, constraint):
    job = JobFactory()
    assert violated_constraint(lambda: make_binding(job=job, **fields)) == constraint
    assert IdempotencyBinding.objects.count() == 0


def test_binding_schema_accepts_scope_of_256_bytes():
    binding = make_binding(scope=BYTES_256)
    binding.refresh_from_db()
    assert binding.scope == BYTES_256


def test_binding_schema_rejects_duplicate_scope_and_key_hash():
    make_binding()
    assert violated_constraint(make_binding) == models.BINDING_KEY_UNIQ
    assert IdempotencyBinding.objects.count() == 1


def test_binding_schema_accepts_same_key_hash_in_another_scope():
    make_binding()
    make_binding(scope="other")
    assert IdempotencyBinding.objects.count() == 2


def _name_constants() -> dict[str, str]:
    suffixes = ("_CHECK", "_UNIQ", "_IDX")
    return {name: value for name, value in vars(models).items() if name.endswith(suffixes) and isinstance(value, str)}


def test_name_constants_are_the_models_constraint_and_index_names():
    declared = {
        item.name
        for model in apps.get_app_config("workhorse").get_models()
        for item in (*model._meta.constraints, *model._meta.indexes)
    }
    assert set(_name_constants().values()) == declared
    assert {"JOB_READY_IDX", "JOB_PRIORITY_CHECK", "BINDING_KEY_UNIQ"} <= _name_constants().keys()


def test_every_name_constant_exists_in_database():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint JOIN pg_class ON pg_class.oid = conrelid"
            " WHERE relname LIKE %(tables)s"
            " UNION SELECT indexname FROM pg_indexes WHERE tablename LIKE %(tables)s",
            {"tables": "workhorse\\_%"},
        )
        in_database = {row[0] for row in cursor.fetchall()}
    missing = {name: value for name, value in _name_constants().items() if value not in in_database}
    assert missing == {}


def test_job_id_sequence_is_the_identity_sequence_of_workhorse_job():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence('workhorse_job', 'id')")
        assert cursor.fetchone()[0] == "public.workhorse_job_id_seq"
    assert models.JOB_ID_SEQUENCE == "workhorse_job_id_seq"


def test_enqueue_and_direct_inserts_draw_ids_from_one_sequence():
    first = enqueue("tests.noop")
    direct = JobFactory().pk
    last = enqueue("tests.noop")
    assert first < direct < last
