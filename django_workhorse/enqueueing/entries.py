"""Many requests checked as one: a task's defaults resolved once per options object and job type,
options checked once per shape, then ``prepare``. ``enqueue_many`` and workflows prepare their
entries here; nothing here touches the database.
"""

from __future__ import annotations

from typing import Any

from django_workhorse.enqueueing.prepared import PreparedJob
from django_workhorse.enqueueing.validation import (
    CheckedOptions,
    check_caller_scope,
    check_options,
    prepare,
    resolve_options,
)
from django_workhorse.tasks.registry import task_defaults
from django_workhorse.types import EnqueueOptions, EnqueueRequest


def prepare_entry(
    entry: EnqueueRequest,
    checked: dict[Any, CheckedOptions],
    resolved: dict[tuple[int, str], EnqueueOptions],
    limit: int,
) -> PreparedJob:
    """Validate one request of many and return its storable form.

    ``checked`` and ``resolved`` are the caller's memos for the whole call (see
    :func:`check_options_once`); ``limit`` is the payload bound. Raise ``EnqueueValidationError``
    naming the field and its bound.
    """
    options = resolved_options(entry, resolved)
    done = checked.get(id(options))
    if done is None:
        checked[id(options)] = done = check_options_once(options, checked)
    return prepare(entry.job_type, entry.payload, options, checked=done, max_payload_bytes=limit)


def resolved_options(entry: EnqueueRequest, resolved: dict[tuple[int, str], EnqueueOptions]) -> EnqueueOptions:
    """The options of one entry, with its task's defaults; once per options object and job type."""
    job_type: object = entry.job_type
    if not isinstance(job_type, str):  # refused by ``prepare``, naming the field
        return check_caller_scope(resolve_options(entry.options, {}))
    slot = (id(entry.options), job_type)
    options = resolved.get(slot)
    if options is None:
        options = check_caller_scope(resolve_options(entry.options, {}, task_defaults(job_type)))
        resolved[slot] = options
    return options


def check_options_once(options: EnqueueOptions, checked: dict[Any, CheckedOptions]) -> CheckedOptions:
    """``check_options``, once per call for options that differ only in their keyed mode.

    A batch of new keys builds one ``EnqueueOptions`` per row, all alike but for the key: they are
    checked once by value. The value key carries every checked value with its type (``True`` is not
    ``1`` here, nor ``2.0`` ``2``) and the retry policy by identity (its JSON text depends on its
    field types); the requests hold their options for the whole call, so identities stay unique.
    Only a successful check is remembered; anything unhashable is simply checked.
    """
    values = (
        options.queue, options.priority, options.run_at, options.delay, options.max_attempts, options.deadline,
        options.timeout, options.concurrency_key, options.concurrency_limit, options.breaker_key,
        options.rate_limit, options.rate_partition, options.partition_key,
    )  # fmt: skip
    try:
        tags = tuple(options.tags)
        key = ("by value", values, tuple(map(type, values)), type(options.tags), tags, tuple(map(type, tags)),
               id(options.retry_policy))  # fmt: skip
        done = checked.get(key)
    except TypeError:
        return check_options(options)
    if done is None:
        checked[key] = done = check_options(options)
    return done
