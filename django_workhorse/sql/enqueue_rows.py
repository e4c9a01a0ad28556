"""How enqueue requests travel to the statements of ``sql.enqueue``: the request columns in the
order the statements unpack them, one request as scalar parameters, a batch (or a keyed request
for ``workhorse_enqueue_one``) as one JSON text of arrays."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django_workhorse.enqueueing.prepared import PreparedJob

# The request columns and their types, in the order the statements unpack them.
REQUEST_COLUMNS = (
    ("ordinal", "int"), ("job_type", "text"), ("queue", "text"), ("payload", "jsonb"),
    ("priority", "int"), ("run_at", "timestamptz"), ("delay", "interval"), ("tags", "jsonb"),
    ("max_attempts", "int"), ("retry_policy", "jsonb"), ("deadline", "timestamptz"),
    ("timeout", "interval"), ("concurrency_key", "text"), ("concurrency_limit", "int"), ("scope", "text"),
    ("key_hash", "bytea"),
    ("key_preview", "text"), ("mode", "text"), ("request_digest", "bytea"),
    ("field_digests", "jsonb"), ("lifetime", "interval"), ("scheduled_for", "timestamptz"),
    ("trace_context", "jsonb"), ("breaker_key", "text"), ("rate_limit", "text"), ("rate_partition", "text"),
    ("partition_key", "text"), ("cipher_salt", "bytea"),
)  # fmt: skip
COLUMNS = tuple(name for name, _ in REQUEST_COLUMNS)
KINDS = dict(REQUEST_COLUMNS)
MICROSECOND = timedelta(microseconds=1)


def request_values(ordinal: int, job: PreparedJob) -> tuple[Any, ...]:
    """Return one request's values in REQUEST_COLUMNS order (jsonb columns as JSON text)."""
    binding = job.binding
    return (
        ordinal, job.job_type, job.queue, job.payload_json, job.priority, job.run_at, job.delay,
        json.dumps(job.tags), job.max_attempts, job.retry_policy_json, job.deadline, job.timeout,
        job.concurrency_key, job.concurrency_limit, binding and binding.scope, binding and binding.key_hash,
        binding and binding.key_preview, binding and binding.mode.value, binding and binding.request_digest,
        binding and _json_digests(binding.field_digests), binding and binding.lifetime,
        job.scheduled_for, job.trace_context_json, job.breaker_key, job.rate_limit, job.rate_partition,
        job.partition_key, job.cipher_salt,
    )  # fmt: skip


def function_params(ordinal: int, job: PreparedJob, channel: str) -> dict[str, Any]:
    """Return one keyed request's parameters for ENQUEUE_ONE: its key, and the request as a batch row."""
    binding = job.binding
    assert binding is not None
    return {
        "ordinal": ordinal,
        "scope": binding.scope,
        "key_hash": binding.key_hash,
        "request": json_row(ordinal, job),
        "channel": channel,
    }


def one_request_params(row: tuple[int, PreparedJob], channel: str) -> dict[str, Any]:
    return {**dict(zip(COLUMNS, request_values(*row), strict=True)), "channel": channel}


def request_params(rows: Sequence[tuple[int, PreparedJob]], channel: str, keyed: bool = True) -> dict[str, Any]:
    """Encode a batch as one JSON array of arrays, read back by sql.enqueue._MANY_REQUESTS_CTE (or, for a batch
    without keys, _MANY_UNKEYED_REQUESTS_CTE)."""
    row = json_row if keyed else json_unkeyed_row
    return {"rows": "[" + ",".join([row(ordinal, job) for ordinal, job in rows]) + "]", "channel": channel}


def json_unkeyed_row(ordinal: int, job: PreparedJob) -> str:
    """Return one request without a key as a JSON array in the order of sql.enqueue.UNKEYED_REQUEST_COLUMNS."""
    quote = _quote
    return (
        f"[{ordinal},{quote(job.job_type)},{quote(job.queue)},{job.payload_json},{job.priority},"
        f"{_json_time(job.run_at)},{_json_micros(job.delay)},{_json_tags(job.tags)},"
        f"{job.max_attempts},{job.retry_policy_json},{_json_time(job.deadline)},{_json_micros(job.timeout)},"
        f"{'null' if job.concurrency_key is None else quote(job.concurrency_key)},"
        f"{'null' if job.concurrency_limit is None else job.concurrency_limit},{_json_time(job.scheduled_for)},"
        f"{job.trace_context_json or 'null'},{_admission_texts(job)},{_json_salt(job.cipher_salt)}]"
    )


def _json_tags(tags: list[str]) -> str:
    return f"[{','.join(map(_quote, tags))}]" if tags else "[]"


def json_row(ordinal: int, job: PreparedJob) -> str:
    """Return one request as a JSON array in REQUEST_COLUMNS order (hot path: no per-value dispatch)."""
    quote, binding = _quote, job.binding
    head = (
        f"[{ordinal},{quote(job.job_type)},{quote(job.queue)},{job.payload_json},{job.priority},"
        f"{_json_time(job.run_at)},{_json_micros(job.delay)},{_json_tags(job.tags)},"
        f"{job.max_attempts},{job.retry_policy_json},{_json_time(job.deadline)},{_json_micros(job.timeout)},"
        f"{'null' if job.concurrency_key is None else quote(job.concurrency_key)},"
        f"{'null' if job.concurrency_limit is None else job.concurrency_limit},"
    )
    tail = (
        f",{_json_time(job.scheduled_for)},{job.trace_context_json or 'null'},{_admission_texts(job)},"
        f"{_json_salt(job.cipher_salt)}]"
    )
    if binding is None:
        return head + "null,null,null,null,null,null,null" + tail
    return (
        head
        + (
            f'{quote(binding.scope)},"{binding.key_hash.hex()}",{quote(binding.key_preview)},"{binding.mode.value}",'
            f'"{binding.request_digest.hex()}",{_json_digests(binding.field_digests)},{_json_micros(binding.lifetime)}'
        )
        + tail
    )


def _json_digests(digests: dict[str, str]) -> str:
    # Field names are ours and digests are hex: nothing needs escaping.
    return "{" + ",".join(f'"{name}":"{digest}"' for name, digest in digests.items()) + "}"


# JSON string quoting without json.dumps' per-call set-up (the C function json.dumps itself uses).
_quote: Callable[[str], str] = json.encoder.encode_basestring


def _admission_texts(job: PreparedJob) -> str:
    # Admission columns, in REQUEST_COLUMNS order; all NULL for most jobs (one string for them).
    if job.breaker_key is None and job.rate_limit is None and job.rate_partition is None and job.partition_key is None:
        return "null,null,null,null"
    texts = (job.breaker_key, job.rate_limit, job.rate_partition, job.partition_key)
    return ",".join(_json_text(text) for text in texts)


def _json_text(value: str | None) -> str:
    return "null" if value is None else _quote(value)


def _json_salt(salt: bytes | None) -> str:
    return "null" if salt is None else f'"{salt.hex()}"'


def _json_time(value: datetime | None) -> str:
    return "null" if value is None else f'"{value.isoformat()}"'


def _json_micros(value: timedelta | None) -> str:
    return "null" if value is None else str(value // MICROSECOND)
