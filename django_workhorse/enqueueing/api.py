"""Enqueue: validate, fingerprint, insert in one statement, translate what PostgreSQL decided.

The unique constraint on ``(scope, key_hash)`` arbitrates racing producers; Python only reads the
outcome. A replay writes nothing, so a conflict raised here leaves the caller's transaction usable.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.db import router, transaction

from django_workhorse import conf, sql
from django_workhorse.conf import app_settings
from django_workhorse.enqueueing.after_write import after_write
from django_workhorse.enqueueing.entries import prepare_entry
from django_workhorse.enqueueing.fingerprints import (
    ENCRYPTED_FIELD,
    WORKFLOW_FIELD,
    differing_fields,
    differs_in_encryption,
    is_workflow_fingerprint,
)
from django_workhorse.enqueueing.prepared import PreparedJob
from django_workhorse.enqueueing.validation import CheckedOptions, check_caller_scope, prepare, resolve_options
from django_workhorse.exceptions import (
    EnqueueIdempotencyConflictError,
    EnqueueValidationError,
    InvalidArgumentError,
    KeyNotSettledError,
)
from django_workhorse.models import Job
from django_workhorse.observability import instruments, tracing
from django_workhorse.observability.log_fields import enqueued_fields
from django_workhorse.tasks.registry import task_defaults
from django_workhorse.types import EnqueueOptions, EnqueueOutcome, EnqueueRequest, EnqueueResult, JobId, KeyMode
from django_workhorse.types import NonReplaceableReason as Reason

logger = logging.getLogger(__name__)
# A key can change hands between our statements (expired and taken over, pruned, purged); each
# round re-reads it. Needing more than a few rounds means something is badly wrong.
MAX_ROUNDS = 8


def enqueue(
    job_type: str,
    payload: Any = None,
    options: EnqueueOptions | None = None,
    *,
    using: str | None = None,
    **option_kwargs: Any,
) -> JobId:
    """Enqueue a job and return its id, or the id of the job that already owns this request's key.

    Options are keyword arguments (``queue``, ``priority``, ``run_at``, ``delay``, ``tags``,
    ``max_attempts``, ``retry_policy``, ``deadline``, ``timeout``, ``concurrency_key``, ``breaker_key``,
    ``encrypted`` and at most one keyed mode such as ``idempotency=Idempotency(key, scope)``) or one
    ``EnqueueOptions`` value; keywords override it. The job joins the caller's transaction and vanishes
    if it rolls back. ``encrypted=True`` seals the payload (and later the result, errors and
    checkpoints) under ``WORKHORSE_ENCRYPTION``; None (the default) follows its ``encrypt_all``.

    Raise ``EnqueueValidationError`` for an argument out of bounds,
    ``EncryptionNotConfiguredError`` for ``encrypted=True`` without ``WORKHORSE_ENCRYPTION``, and
    ``EnqueueIdempotencyConflictError`` when a live key was accepted for a different request.
    """
    return enqueue_with_result(job_type, payload, options, using=using, **option_kwargs).job_id


def enqueue_with_result(
    job_type: str,
    payload: Any = None,
    options: EnqueueOptions | None = None,
    *,
    using: str | None = None,
    _on_written: Callable[[EnqueueResult], None] | None = None,
    **option_kwargs: Any,
) -> EnqueueResult:
    """Enqueue a job like :func:`enqueue`, returning the job id and the outcome (accepted, replayed…).

    ``_on_written`` (internal) is called with the outcome once the job is written, before eager
    mode runs it: the django.tasks backend sends ``task_enqueued`` there, as before a worker's run.
    """
    try:
        resolved = resolve_options(options, option_kwargs, task_defaults(job_type))
        request = prepare(job_type, payload, check_caller_scope(resolved))
    except InvalidArgumentError:  # EnqueueValidationError, EncryptionNotConfiguredError
        instruments.enqueue_refused("invalid", None)
        raise
    alias = _alias(using)
    results = _submit([request], alias, batch=False)
    if _on_written is not None:
        _on_written(results[0])
    after_write(alias, results)
    return results[0]


def enqueue_many(requests: Iterable[EnqueueRequest], *, using: str | None = None) -> list[EnqueueResult]:
    """Enqueue up to 1,000 requests (any iterable) in one round trip where possible; results follow input order.

    Keyed rows are resolved one by one in every mode: a key repeated inside the batch, or one a
    live job owns, maps to that job (replayed, coalesced, replaced). Only a material conflict
    fails the batch: everything rolls back and the error names the offending ordinal (its 0-based
    position in ``requests``).
    """
    try:
        requests = _bounded_list(requests)
        checked: dict[Any, CheckedOptions] = {}  # by id() of each distinct options object, and by value
        # The options each (options object, job type) resolves to, held for the whole call so that
        # the id() keys of ``checked`` stay unique.
        resolved: dict[tuple[int, str], EnqueueOptions] = {}
        limit = app_settings.MAX_PAYLOAD_BYTES
        prepared = [_prepare_entry(ordinal, entry, checked, resolved, limit) for ordinal, entry in enumerate(requests)]
    except InvalidArgumentError:  # EnqueueValidationError, EncryptionNotConfiguredError
        instruments.enqueue_refused("invalid", None)
        raise
    alias = _alias(using)
    results = _submit(prepared, alias, batch=True)
    after_write(alias, results)
    return results


def enqueue_prepared(requests: list[PreparedJob], *, using: str) -> list[EnqueueResult]:
    """Enqueue requests ``prepare`` already checked, as one batch (no eager run: the caller's to do)."""
    return _submit(requests, using, batch=True)


def _bounded_list(requests: Any) -> list[Any]:
    """Take at most one request past the bound from any iterable (a generator is not run to its end)."""
    if isinstance(requests, (str, bytes, Mapping)) or not isinstance(requests, Iterable):
        bound = "an iterable of EnqueueRequest values"
        raise EnqueueValidationError(field="requests", bound=bound, value=type(requests).__name__)
    taken = list(itertools.islice(requests, conf.MAX_BATCH_SIZE + 1))
    if len(taken) > conf.MAX_BATCH_SIZE:
        bound = f"at most {conf.MAX_BATCH_SIZE} requests"
        raise EnqueueValidationError(field="requests", bound=bound, value=f"{len(taken)}+ requests")
    return taken


def _prepare_entry(
    ordinal: int,
    entry: Any,
    checked: dict[Any, CheckedOptions],
    resolved: dict[tuple[int, str], EnqueueOptions],
    limit: int,
) -> PreparedJob:
    if not isinstance(entry, EnqueueRequest):
        raise EnqueueValidationError(
            field="requests", bound="EnqueueRequest values", value=type(entry).__name__, ordinal=ordinal
        )
    try:
        return prepare_entry(entry, checked, resolved, limit)
    except EnqueueValidationError as exc:
        raise exc.for_ordinal(ordinal) from exc


def _alias(using: str | None) -> str:
    return using or router.db_for_write(Job)


def _submit(requests: list[PreparedJob], alias: str, *, batch: bool) -> list[EnqueueResult]:
    started = instruments.clock()
    with tracing.producing(requests) as span:
        try:
            results = _submit_all(requests, alias, batch=batch)
        except EnqueueIdempotencyConflictError as exc:
            instruments.enqueue_refused("conflict", requests[exc.ordinal or 0] if requests else None)
            tracing.refused(span, "conflict")
            raise
        tracing.settled(span, results)
    if results:
        instruments.enqueue_settled(requests, results, started)
        if logger.isEnabledFor(logging.DEBUG):
            for request, result in zip(requests, results, strict=True):
                logger.debug(
                    "Enqueue id=%s type=%s queue=%s outcome=%s",
                    result.job_id,
                    request.job_type,
                    request.queue,
                    result.outcome.value,
                    extra={
                        **enqueued_fields(result.job_id, request.job_type, request.queue),
                        "outcome": result.outcome.value,
                    },
                )
    return results


def _submit_all(requests: list[PreparedJob], alias: str, *, batch: bool) -> list[EnqueueResult]:
    if len(requests) == 1:  # the common case, without the batch's bookkeeping
        single: dict[int, EnqueueResult] = {}
        _settle(alias, {0: requests[0]}, single, batch=batch)
        return [single[0]]
    if not requests:
        return []
    firsts, repeats = _split_repeats(requests)
    results: dict[int, EnqueueResult] = {}
    with _undo_on_error(alias, needed=len(requests) > 1 and any(r.binding for r in requests)):
        _settle(alias, {ordinal: requests[ordinal] for ordinal in firsts}, results, batch=batch)
        # A key repeated inside the batch: resolved against the row that first carried it, in input
        # order; what only PostgreSQL can decide (a debounce replacement, a first row that was
        # refused) goes back to it, one occurrence of each key per pass.
        passes: list[dict[int, PreparedJob]] = []
        seen: dict[tuple[str, bytes], int] = {}
        for ordinal, first in repeats.items():
            request, first_result = requests[ordinal], results.get(first)
            if first_result is not None and _decided_locally(request, first_result):
                results[ordinal] = _repeat_of(ordinal, request, requests[first], first_result)
                continue
            slot = request.binding.slot  # type: ignore[union-attr]
            seen[slot] = depth = seen.get(slot, -1) + 1
            while len(passes) <= depth:
                passes.append({})
            passes[depth][ordinal] = request
        for pending in passes:
            _settle(alias, pending, results, batch=batch)
    return [results[ordinal] for ordinal in range(len(requests))]


def _decided_locally(request: PreparedJob, first_result: EnqueueResult) -> bool:
    # The first row now stands as the key's binding unless it was refused (non-replaceable).
    assert request.binding is not None
    return request.binding.mode is not KeyMode.DEBOUNCE and first_result.outcome is not EnqueueOutcome.NON_REPLACEABLE


@contextlib.contextmanager
def _undo_on_error(alias: str, *, needed: bool) -> Iterator[None]:
    # A keyed batch may accept some rows before a later row conflicts: a savepoint (or, outside
    # a transaction, a transaction) undoes them. A single request writes at most one statement.
    if needed:
        with transaction.atomic(using=alias):
            yield
    else:
        yield


def _split_repeats(requests: list[PreparedJob]) -> tuple[list[int], dict[int, int]]:
    """Return the ordinals to submit and, for each repeat of a key inside the batch, its first ordinal."""
    first_of: dict[tuple[str, bytes], int] = {}
    firsts: list[int] = []
    repeats: dict[int, int] = {}
    for ordinal, request in enumerate(requests):
        if request.binding is None:
            firsts.append(ordinal)
        elif request.binding.slot in first_of:
            repeats[ordinal] = first_of[request.binding.slot]
        else:
            first_of[request.binding.slot] = ordinal
            firsts.append(ordinal)
    return firsts, repeats


def _settle(alias: str, pending: dict[int, PreparedJob], results: dict[int, EnqueueResult], *, batch: bool) -> None:
    """Submit ``pending`` until every request has its outcome or a conflict is raised."""
    channel = app_settings.NOTIFY_CHANNEL
    for _ in range(MAX_ROUNDS):
        rows = sql.enqueue.enqueue_rows(alias, list(pending.items()), channel)
        for ordinal, job_id in rows.accepted.items():
            results[ordinal] = EnqueueResult(job_id, EnqueueOutcome.ACCEPTED)
        existing = rows.existing
        unseen = [(o, r) for o, r in pending.items() if o not in results and o not in existing]
        if unseen:  # taken by a transaction that committed after our statement's snapshot
            existing = {**existing, **sql.enqueue.find_bindings(alias, unseen)}
        retry: dict[int, PreparedJob] = {}
        # Follow-up statements lock keys in (scope, key_hash) order too.
        for ordinal, binding in sorted(existing.items(), key=lambda item: pending[item[0]].binding.slot):  # type: ignore[union-attr]
            result = _resolve(alias, ordinal, pending[ordinal], binding, channel, batch=batch)
            if result is None:
                retry[ordinal] = pending[ordinal]
            else:
                results[ordinal] = result
        retry.update((o, r) for o, r in unseen if o not in existing)  # the binding vanished meanwhile
        if not retry:
            return
        pending = retry
    raise KeyNotSettledError(f"enqueue did not settle after {MAX_ROUNDS} rounds; the keys keep changing hands")


def _resolve(
    alias: str, ordinal: int, request: PreparedJob, existing: sql.enqueue.ExistingBinding, channel: str, *, batch: bool
) -> EnqueueResult | None:
    """Decide a request whose key is bound already; None when the key changed meanwhile (look again)."""
    binding = request.binding
    assert binding is not None
    if existing.free:
        new_id = sql.enqueue.take_over(alias, ordinal, request, existing.job_id, channel)
        return None if new_id is None else EnqueueResult(new_id, EnqueueOutcome.ACCEPTED)
    if binding.mode is KeyMode.DEBOUNCE:
        if existing.mode != KeyMode.DEBOUNCE:
            return EnqueueResult(existing.job_id, EnqueueOutcome.NON_REPLACEABLE, Reason.INCOMPATIBLE_KEY_MODE)
        if existing.job_state == "open":
            replaced = sql.enqueue.replace_debounced(alias, ordinal, request, existing.job_id)
            return EnqueueResult(existing.job_id, EnqueueOutcome.REPLACED) if replaced else None
        reason = Reason.WINDOW_ELAPSED_PENDING if existing.job_state == "due" else Reason.NOT_PENDING
        return EnqueueResult(existing.job_id, EnqueueOutcome.NON_REPLACEABLE, reason)
    return _replay_or_conflict(request, existing, ordinal if batch else None)


def _replay_or_conflict(
    request: PreparedJob, existing: sql.enqueue.ExistingBinding, ordinal: int | None
) -> EnqueueResult:
    """The same request again is a replay (idempotency) or coalesces (unique, throttle); else a conflict."""
    binding = request.binding
    assert binding is not None
    if existing.mode == binding.mode and existing.request_digest == binding.request_digest:
        outcome = EnqueueOutcome.REPLAYED if binding.mode is KeyMode.IDEMPOTENCY else EnqueueOutcome.COALESCED
        return EnqueueResult(existing.job_id, outcome)
    if existing.mode != binding.mode:
        fields = ["mode"]
    elif is_workflow_fingerprint(existing.field_digests):  # a workflow's anchor: not every field of both
        fields = [WORKFLOW_FIELD]
    elif differs_in_encryption(existing.field_digests, binding.field_digests):
        fields = [ENCRYPTED_FIELD]  # digests made two ways (keyed and not) say nothing field by field
    else:
        fields = differing_fields(existing.field_digests, binding.field_digests)
    raise EnqueueIdempotencyConflictError(
        job_id=existing.job_id,
        mode=existing.mode,
        scope=binding.scope,
        conflicting_fields=fields,
        key_preview=binding.key_preview,
        key_digest=binding.key_digest,
        stored_request_digest=existing.request_digest.hex(),
        rejected_request_digest=binding.request_digest.hex(),
        ordinal=ordinal,
    )


def _repeat_of(ordinal: int, request: PreparedJob, first: PreparedJob, first_result: EnqueueResult) -> EnqueueResult:
    """Resolve a key repeated inside one batch against the row that first carried it."""
    assert request.binding is not None and first.binding is not None
    existing = sql.enqueue.ExistingBinding(
        ordinal=ordinal,
        job_id=first_result.job_id,
        mode=first.binding.mode,
        request_digest=first.binding.request_digest,
        stored_field_digests=first.binding.field_digests,
        free=False,
        job_state="started",
    )
    return _replay_or_conflict(request, existing, ordinal)


async def aenqueue(
    job_type: str,
    payload: Any = None,
    options: EnqueueOptions | None = None,
    *,
    using: str | None = None,
    **option_kwargs: Any,
) -> JobId:
    """Async :func:`enqueue`, for async views: runs it on Django's thread for database work.

    It commits on its own (Django has no async transactions). To enqueue inside a transaction with
    other writes, call :func:`enqueue` in the same ``sync_to_async`` function as those writes.
    """
    return (await aenqueue_with_result(job_type, payload, options, using=using, **option_kwargs)).job_id


async def aenqueue_with_result(
    job_type: str,
    payload: Any = None,
    options: EnqueueOptions | None = None,
    *,
    using: str | None = None,
    **option_kwargs: Any,
) -> EnqueueResult:
    """Async :func:`enqueue_with_result`; see :func:`aenqueue` for transactions."""
    call = functools.partial(enqueue_with_result, job_type, payload, options, using=using, **option_kwargs)
    return await sync_to_async(call, thread_sensitive=True)()


async def aenqueue_many(requests: Iterable[EnqueueRequest], *, using: str | None = None) -> list[EnqueueResult]:
    """Async :func:`enqueue_many`; see :func:`aenqueue` for transactions."""
    return await sync_to_async(functools.partial(enqueue_many, requests, using=using), thread_sensitive=True)()
