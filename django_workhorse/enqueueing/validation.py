"""Check every enqueue argument against its bound and turn a request into storable values.

Nothing here touches the database: a request that fails here has written nothing.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from django.core.signals import setting_changed

from django_workhorse import conf
from django_workhorse.admission import rate_limits
from django_workhorse.conf import app_settings
from django_workhorse.encryption.jobs import PAYLOAD, is_encrypted, new_salt, seal_value
from django_workhorse.encryption.keys import FingerprintKey, configured_keyring
from django_workhorse.encryption.validation import SETTING as ENCRYPTION_SETTING
from django_workhorse.enqueueing.fingerprints import (
    ENCRYPTED,
    ENCRYPTED_FIELD,
    canonical_json,
    field_digest,
    key_hash,
    key_preview,
    keyed_field_digest,
)
from django_workhorse.enqueueing.prepared import PreparedBinding, PreparedJob
from django_workhorse.enqueueing.storable import BoundError, check_datetime, check_json, check_text
from django_workhorse.exceptions import EnqueueValidationError
from django_workhorse.tasks.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from django_workhorse.types import Debounce, EnqueueOptions, Idempotency, KeyedMode, KeyMode, Throttle, Unique

MODE_OPTIONS: dict[str, type] = {
    "idempotency": Idempotency,
    "unique": Unique,
    "debounce": Debounce,
    "throttle": Throttle,
}
DEBOUNCE_SCHEDULES = ("reset", "preserve")
# The scopes of the library's own keys (a schedule's ticks, its run-now requests): a caller's key
# there would take a tick's place. The library enqueues those through ``prepare``, never checked here.
RESERVED_SCOPE_PREFIX = "workhorse."
_KEY_MODES = {name: KeyMode(name) for name in MODE_OPTIONS}
_MICROSECOND = timedelta(microseconds=1)
_OPTION_NAMES = EnqueueOptions.names()
_DEFAULT_RETRY_POLICY_JSON = canonical_json(DEFAULT_RETRY_POLICY.to_json())


def resolve_options(
    options: EnqueueOptions | None, overrides: Mapping[str, Any], defaults: EnqueueOptions | None = None
) -> EnqueueOptions:
    """Return the options of a request: keyword ``overrides`` over the options ``options`` was built
    with, over ``defaults`` (a ``@task``'s) when there are any, else over the global defaults.

    The one rule of decision 0020, for a task's own calls and for enqueues by its name alike: what
    the caller gives wins, even at the global default's value; the task's defaults fill in the rest.
    Unknown names are an error.
    """
    for name in overrides:
        if name not in _OPTION_NAMES:
            raise EnqueueValidationError(field=name, bound=f"a known option ({', '.join(_OPTION_NAMES)})")
    if options is not None and not isinstance(options, EnqueueOptions):
        raise EnqueueValidationError(field="options", bound="an EnqueueOptions value", value=options)
    if defaults is not None:
        given = {**options.given(), **overrides} if options is not None else overrides
        return replace(defaults, **given) if given else defaults
    if options is None:
        return EnqueueOptions(**overrides)
    return replace(options, **overrides) if overrides else options


def check_caller_scope(options: EnqueueOptions) -> EnqueueOptions:
    """Return ``options`` unless its keyed mode names a scope reserved for the library.

    Raise ``EnqueueValidationError`` naming the mode's ``scope`` if it starts with ``workhorse.``.
    """
    for name in MODE_OPTIONS:
        scope = getattr(getattr(options, name), "scope", None)
        if isinstance(scope, str) and scope.startswith(RESERVED_SCOPE_PREFIX):
            bound = f"a scope not starting with {RESERVED_SCOPE_PREFIX!r} (reserved for django_workhorse's own keys)"
            raise EnqueueValidationError(field=f"{name}.scope", bound=bound, value=scope)
    return options


@dataclass(frozen=True)
class CheckedOptions:
    """The options of a request, checked, with what checking derived from them."""

    tags: list[str]
    retry_policy_json: str


def check_options(options: EnqueueOptions) -> CheckedOptions:
    """Check the options that do not depend on the keyed mode.

    Options are immutable, so a batch checks each distinct ``EnqueueOptions`` object once.
    Raise ``EnqueueValidationError`` naming the field and its bound if anything is out of bounds.
    """
    check_queue(options.queue, error=EnqueueValidationError)
    _integer(options.priority, "priority", conf.MIN_PRIORITY, conf.MAX_PRIORITY)
    _integer(options.max_attempts, "max_attempts", conf.MIN_ATTEMPTS, conf.MAX_ATTEMPTS)
    run_at = _aware(options.run_at, "run_at")
    _aware(options.deadline, "deadline")
    if options.delay is not None:
        _duration(options.delay, "delay", timedelta(0), conf.MAX_DELAY)
        if run_at is not None:
            raise EnqueueValidationError(field="delay", bound="omitted when run_at is given")
    if options.timeout is not None:
        _duration(options.timeout, "timeout", conf.MIN_TIMEOUT, conf.MAX_TIMEOUT)
    if options.concurrency_key is not None:
        check_text(
            options.concurrency_key,
            "concurrency_key",
            max_bytes=conf.MAX_CONCURRENCY_KEY_BYTES,
            error=EnqueueValidationError,
        )
    if options.breaker_key is not None:
        check_text(
            options.breaker_key, "breaker_key", max_bytes=conf.MAX_BREAKER_KEY_BYTES, error=EnqueueValidationError
        )
    _check_admission_texts(options)
    if options.concurrency_limit is not None:
        _integer(options.concurrency_limit, "concurrency_limit", conf.MIN_CONCURRENCY_LIMIT, conf.MAX_CONCURRENCY_LIMIT)
        if options.concurrency_key is None:
            raise EnqueueValidationError(field="concurrency_limit", bound="given only with a concurrency_key")
    return CheckedOptions(tags=_tags(options.tags), retry_policy_json=_retry_policy_json(options.retry_policy))


def check_queue(value: Any, field: str = "queue", *, error: BoundError = EnqueueValidationError) -> str:
    """Check a queue name: storable text of 1..``MAX_QUEUE_CHARS`` characters; return it.

    The one rule for queue names, wherever one is given (enqueue, queue control, purge).
    """
    return check_text(value, field, max_chars=conf.MAX_QUEUE_CHARS, error=error)


def _concurrency_limit(options: EnqueueOptions) -> int | None:
    """The request's limit, else the key's setting, else the default (None without a key)."""
    if options.concurrency_key is None:
        return None
    if options.concurrency_limit is not None:
        return options.concurrency_limit
    return app_settings.CONCURRENCY_LIMITS.get(options.concurrency_key, app_settings.DEFAULT_CONCURRENCY_LIMIT)


def prepare(
    job_type: str,
    payload: Any,
    options: EnqueueOptions,
    *,
    checked: CheckedOptions | None = None,
    max_payload_bytes: int | None = None,
) -> PreparedJob:
    """Validate a request and return its storable form.

    ``checked`` is ``check_options(options)`` when the caller already has it. Raise
    ``EnqueueValidationError`` naming the field and its bound if anything is out of bounds.
    """
    check_text(job_type, "job_type", max_chars=conf.MAX_JOB_TYPE_CHARS, error=EnqueueValidationError)
    checked = checked or check_options(options)
    encrypted = _encrypted(options.encrypted)
    max_bytes = max_payload_bytes or app_settings.MAX_PAYLOAD_BYTES
    payload_json = _payload(payload, max_bytes)
    limit = _concurrency_limit(options)
    binding = _bind(job_type, options, checked.tags, payload_json, checked.retry_policy_json, limit, encrypted)
    salt = plain_payload_json = None
    if encrypted:
        # Fingerprints are taken on the plaintext (above); what is stored is its envelope.
        plain_payload_json = payload_json if binding is None else None
        salt = new_salt()
        payload_json = _sealed_payload(payload_json, salt, max_bytes)
    return PreparedJob(
        job_type=job_type,
        queue=options.queue,
        payload_json=payload_json,
        priority=options.priority,
        run_at=options.run_at,
        # A debounced job first runs one window from now.
        delay=binding.window if binding is not None and binding.window is not None else options.delay,
        tags=checked.tags,
        max_attempts=options.max_attempts,
        retry_policy_json=checked.retry_policy_json,
        deadline=options.deadline,
        timeout=options.timeout,
        concurrency_key=options.concurrency_key,
        concurrency_limit=limit,
        binding=binding,
        breaker_key=options.breaker_key,
        rate_limit=options.rate_limit,
        rate_partition=options.rate_partition,
        partition_key=options.partition_key,
        cipher_salt=salt,
        plain_payload_json=plain_payload_json,
    )


def _encrypted(requested: Any) -> bool:
    """Whether the request is encrypted (None: as ``encrypt_all`` says); raise if it cannot be."""
    if requested is not None and not isinstance(requested, bool):
        raise EnqueueValidationError(field="encrypted", bound="True, False or None", value=type(requested).__name__)
    return is_encrypted(requested)


def _sealed_payload(payload_json: str, salt: bytes, limit: int) -> str:
    """The JSON string of the payload's envelope, checked against the payload bound (what is stored)."""
    stored = f'"{seal_value(payload_json, field=PAYLOAD, salt=salt)}"'  # an envelope needs no escaping
    if len(stored) > limit:
        bound = f"at most {limit} bytes serialized"
        raise EnqueueValidationError(field="payload", bound=bound, value=f"{len(stored)} bytes once encrypted")
    return stored


def _bind(
    job_type: str,
    options: EnqueueOptions,
    tags: list[str],
    payload_json: str,
    policy_json: str,
    concurrency_limit: int | None,
    encrypted: bool = False,
) -> PreparedBinding | None:
    chosen = [name for name in MODE_OPTIONS if getattr(options, name) is not None]
    if len(chosen) > 1:
        raise EnqueueValidationError(field=", ".join(chosen), bound="at most one keyed mode per request")
    if options.debounce is not None:
        for schedule in ("run_at", "delay"):
            if getattr(options, schedule) is not None:
                raise EnqueueValidationError(
                    field=schedule, bound="omitted with debounce (the window schedules the job)"
                )
    if not chosen:
        return None
    name = chosen[0]
    mode: KeyedMode = getattr(options, name)
    if not isinstance(mode, MODE_OPTIONS[name]):
        # Never echo the value: a plain string here is most likely the raw key.
        raise EnqueueValidationError(
            field=name, bound=f"an instance of {MODE_OPTIONS[name].__name__}", value=type(mode).__name__
        )
    check_text(mode.key, f"{name}.key", max_bytes=conf.MAX_KEY_BYTES, secret=True, error=EnqueueValidationError)
    check_text(mode.scope, f"{name}.scope", max_bytes=conf.MAX_SCOPE_BYTES, error=EnqueueValidationError)
    lifetime_name = "ttl" if isinstance(mode, Idempotency) else "window"
    lifetime = getattr(mode, lifetime_name, None)
    if lifetime is not None:
        _duration(lifetime, f"{name}.{lifetime_name}", conf.MIN_KEY_TTL, conf.MAX_KEY_TTL)
    if isinstance(mode, Debounce) and mode.schedule not in DEBOUNCE_SCHEDULES:
        raise EnqueueValidationError(
            field="debounce.schedule", bound=" or ".join(map(repr, DEBOUNCE_SCHEDULES)), value=mode.schedule
        )
    debounce_schedule: str | None = mode.schedule if isinstance(mode, Debounce) else None
    fields = _keyed_fields if encrypted else _constant_fields
    constant = fields(
        _fingerprint_values(job_type, options, tags, lifetime_name, lifetime, concurrency_limit),
        policy_json,
        debounce_schedule,
    )
    payload_digest = keyed_field_digest(payload_json) if encrypted else field_digest(payload_json)
    digests = {**constant.digests, "payload": payload_digest}
    window = mode.window if isinstance(mode, Debounce) else None
    return PreparedBinding(
        mode=_KEY_MODES[name],
        scope=mode.scope,
        key_hash=key_hash(mode.scope, mode.key),
        key_preview=key_preview(mode.key),
        lifetime=2 * window if window is not None else lifetime,
        field_digests=digests,
        request_digest=constant.request_digest(payload_digest),
        window=window,
        reset=not isinstance(mode, Debounce) or mode.schedule == "reset",
    )


def request_fingerprint(job: PreparedJob) -> bytes:
    """The request digest a keyed enqueue of ``job`` would store, without a key's lifetime: the
    fields ``_fingerprint_values`` names, payload and retry policy (what a workflow step contributes
    to its graph's fingerprint). Admission options are left out, as for keyed jobs."""
    values = _fingerprint_values(job.job_type, job, job.tags, "ttl", None, job.concurrency_limit)
    if job.cipher_salt is not None:  # encrypted: keyed digests, of the plaintext payload
        if job.binding is not None:
            payload_digest = job.binding.field_digests["payload"]
        else:
            assert job.plain_payload_json is not None
            payload_digest = keyed_field_digest(job.plain_payload_json)
        return _keyed_fields(values, job.retry_policy_json, None).request_digest(payload_digest)
    return _constant_fields(values, job.retry_policy_json, None).request_digest(field_digest(job.payload_json))


def _fingerprint_values(
    job_type: str,
    options: EnqueueOptions | PreparedJob,
    tags: list[str],
    lifetime_name: str,
    lifetime: timedelta | None,
    concurrency_limit: int | None,
) -> tuple[tuple[str, Any], ...]:
    """Every field that makes two requests the same request, except payload and retry policy, as
    ``(name, value)`` pairs of hashable values (the cache key of ``_constant_fields``)."""
    values: tuple[tuple[str, Any], ...] = (
        ("queue", options.queue),
        ("job_type", job_type),
        ("priority", options.priority),
        ("concurrency_key", options.concurrency_key),
        ("tags", tuple(tags)),
        ("max_attempts", options.max_attempts),
        ("deadline", _utc(options.deadline)),
        ("timeout", _micros(options.timeout)),
    )
    if lifetime is not None:  # unique keys have no ttl or window
        values += ((lifetime_name, _micros(lifetime)),)
    # Only keyed jobs have a limit, so requests without a concurrency key keep their digests.
    if concurrency_limit is not None:
        values += (("concurrency_limit", concurrency_limit),)
    # An omitted run_at (or delay) stays omitted, so a later retry of an immediate job replays.
    if options.run_at is not None:
        values += (("run_at", _utc(options.run_at)),)
    if options.delay is not None:
        values += (("delay", _micros(options.delay)),)
    return values


@dataclass(frozen=True)
class _ConstantFields:
    """The digests of every fingerprinted field but the payload, and the request digest's text
    around the payload's entry (``fingerprint.request_digest`` joins ``name=digest`` in name order)."""

    digests: dict[str, str]
    before_payload: str
    after_payload: str

    def request_digest(self, payload_digest: str) -> bytes:
        return hashlib.sha256(f"{self.before_payload}payload={payload_digest}{self.after_payload}".encode()).digest()


@functools.lru_cache(maxsize=1024)
def _constant_fields(values: tuple[tuple[str, Any], ...], policy_json: str, schedule: str | None) -> _ConstantFields:
    """Digest the fields that requests of one shape share (a batch of new keys repeats them row after row).

    Keyed by value, like ``_cached_value_digest``: the values are normalized (UTC text, microseconds,
    tuples), so equal keys digest equally.
    """
    digests = {name: _cached_value_digest(value) for name, value in values}
    digests["retry_policy"] = _cached_text_digest(policy_json)
    if schedule is not None:
        digests["schedule"] = _cached_value_digest(schedule)
    return _around_payload(digests)


def _keyed_fields(values: tuple[tuple[str, Any], ...], policy_json: str, schedule: str | None) -> _ConstantFields:
    """``_constant_fields`` of an encrypted request: each digest an HMAC under the fingerprint key, and
    the field ``encrypted``."""
    return _keyed_fields_under(configured_keyring().fingerprint, values, policy_json, schedule)


@functools.lru_cache(maxsize=1024)
def _keyed_fields_under(
    key: FingerprintKey, values: tuple[tuple[str, Any], ...], policy_json: str, schedule: str | None
) -> _ConstantFields:
    """``_keyed_fields`` under ``key``, cached as ``_constant_fields`` is (ten HMACs of the fields a
    request shape repeats were 80% of an encrypted keyed enqueue's extra cost). The key object is part
    of the cache key, so a changed setting (a new key object) never meets an old digest, and the cache
    is emptied when the setting changes, so it keeps no old key alive."""
    digests = {name: keyed_field_digest(canonical_json(value), key) for name, value in values}
    digests["retry_policy"] = keyed_field_digest(policy_json, key)
    if schedule is not None:
        digests["schedule"] = keyed_field_digest(canonical_json(schedule), key)
    digests[ENCRYPTED_FIELD] = ENCRYPTED
    return _around_payload(digests)


def _forget_keyed_fields(*, setting: str, **kwargs: Any) -> None:
    if setting == ENCRYPTION_SETTING:
        _keyed_fields_under.cache_clear()


setting_changed.connect(_forget_keyed_fields, dispatch_uid="django_workhorse.enqueueing.keyed_fields")


def _around_payload(digests: dict[str, str]) -> _ConstantFields:
    names = sorted([*digests, "payload"])
    cut = names.index("payload")
    before = "".join(f"{name}={digests[name]};" for name in names[:cut])
    after = "".join(f";{name}={digests[name]}" for name in names[cut + 1 :])
    return _ConstantFields(digests=digests, before_payload=before, after_payload=after)


# Most requests repeat the same option values (default queue, priority, ttl…): digest each once.
@functools.lru_cache(maxsize=4096)
def _cached_value_digest(value: Any) -> str:
    return field_digest(canonical_json(value))


_cached_text_digest = functools.lru_cache(maxsize=256)(field_digest)


def check_key_text(value: Any, field: str, max_bytes: int, *, error: BoundError = EnqueueValidationError) -> None:
    """Check a key or scope: a string of 1..``max_bytes`` UTF-8 bytes. The value is never echoed."""
    check_text(value, field, max_bytes=max_bytes, secret=True, error=error)


def check_duration(
    value: Any, field: str, low: timedelta, high: timedelta, *, error: BoundError = EnqueueValidationError
) -> None:
    """Check a ``timedelta`` within ``low..high``."""
    _duration(value, field, low, high, error=error)


def _integer(value: Any, field: str, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise EnqueueValidationError(field=field, bound=f"an integer in {low}..{high}", value=value)


def _aware(value: Any, field: str) -> datetime | None:
    return None if value is None else check_datetime(value, field, error=EnqueueValidationError)


def _duration(
    value: Any, field: str, low: timedelta, high: timedelta, *, error: BoundError = EnqueueValidationError
) -> None:
    if not isinstance(value, timedelta) or not low <= value <= high:
        raise error(field=field, bound=f"a timedelta in {_human(low)}..{_human(high)}", value=value)


def _tags(tags: Any) -> list[str]:
    if isinstance(tags, str) or not isinstance(tags, (list, tuple, set, frozenset)):
        raise EnqueueValidationError(field="tags", bound="a list of strings", value=tags)
    if len(tags) > conf.MAX_TAGS:
        raise EnqueueValidationError(field="tags", bound=f"at most {conf.MAX_TAGS} tags", value=f"{len(tags)} tags")
    for tag in tags:
        check_text(tag, "tags", max_chars=conf.MAX_TAG_CHARS, error=EnqueueValidationError)
    if len(set(tags)) != len(tags):
        raise EnqueueValidationError(field="tags", bound="distinct", value=sorted(tags))
    return sorted(tags)


def _retry_policy_json(policy: Any) -> str:
    if policy is None:
        return _DEFAULT_RETRY_POLICY_JSON
    if not isinstance(policy, RetryPolicy):
        raise EnqueueValidationError(field="retry_policy", bound="a RetryPolicy value", value=policy)
    if policy.kind not in ("exponential", "fixed"):
        raise EnqueueValidationError(field="retry_policy.kind", bound="'exponential' or 'fixed'", value=policy.kind)
    _duration(policy.base, "retry_policy.base", conf.MIN_TIMEOUT, conf.MAX_DELAY)
    _duration(policy.max_delay, "retry_policy.max_delay", policy.base, conf.MAX_DELAY)
    for name, low, high in (("factor", 1.0, 100.0), ("jitter", 0.0, 1.0)):
        value = getattr(policy, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
            raise EnqueueValidationError(field=f"retry_policy.{name}", bound=f"a number in {low}..{high}", value=value)
    return canonical_json(policy.to_json())


def _payload(payload: Any, limit: int) -> str:
    return check_json(payload, "payload", max_bytes=limit, error=EnqueueValidationError)


def _utc(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(timezone.utc).isoformat()


def _micros(value: timedelta | None) -> int | None:
    return None if value is None else value // _MICROSECOND


def _human(value: timedelta) -> str:
    if value == timedelta(0):
        return "0"
    if value % timedelta(days=1) == timedelta(0):
        return f"{value.days} days"
    if value % timedelta(seconds=1) == timedelta(0):
        return f"{int(value.total_seconds())} s"
    return (
        f"{value // timedelta(milliseconds=1)} ms" if value % timedelta(milliseconds=1) == timedelta(0) else str(value)
    )


def _check_admission_texts(options: EnqueueOptions) -> None:
    """Check the rate-limit and fair-share options as stored text (their meaning is checked elsewhere)."""
    if options.rate_limit is not None:
        check_text(
            options.rate_limit, "rate_limit", max_chars=conf.MAX_RATE_LIMIT_NAME_CHARS, error=EnqueueValidationError
        )
    if options.rate_partition is not None:
        check_text(
            options.rate_partition,
            "rate_partition",
            max_bytes=conf.MAX_RATE_PARTITION_BYTES,
            error=EnqueueValidationError,
        )
    if options.partition_key is not None:
        check_text(
            options.partition_key, "partition_key", max_bytes=conf.MAX_PARTITION_KEY_BYTES, error=EnqueueValidationError
        )
    _check_rate_limit(options.rate_limit, options.rate_partition)


def _check_rate_limit(name: str | None, partition: str | None) -> None:
    """A job's rate_limit names a configured limit; rate_partition is given exactly when it is partitioned."""
    if name is None:
        if partition is not None:
            raise EnqueueValidationError(field="rate_partition", bound="given only with a rate_limit")
        return
    limit = rate_limits.configured().get(name)
    if limit is None:
        raise EnqueueValidationError(field="rate_limit", bound="a name in WORKHORSE_RATE_LIMITS", value=name)
    if limit.partitioned and partition is None:
        raise EnqueueValidationError(field="rate_partition", bound=f"given: rate limit {name!r} is partitioned")
    if not limit.partitioned and partition is not None:
        raise EnqueueValidationError(
            field="rate_partition", bound=f"omitted: rate limit {name!r} is not partitioned", value=partition
        )
