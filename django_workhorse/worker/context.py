"""HandlerContext: what a handler may know and do about the job it runs."""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TypeVar

from django_workhorse import conf, sql
from django_workhorse.admission import recording as breakers
from django_workhorse.admission.breakers import check_open_until
from django_workhorse.conf import app_settings
from django_workhorse.encryption.jobs import CHECKPOINT_PREFIX, opened_json, seal_value
from django_workhorse.enqueueing.fingerprints import derived_step_key
from django_workhorse.enqueueing.storable import check_json, check_text
from django_workhorse.exceptions import (
    AttemptTimeoutError,
    BreakerValidationError,
    CheckpointNotStorableError,
    EffectValidationError,
    InvalidArgumentError,
    JobCancelledError,
    LeaseLostError,
    StepNotSucceededError,
)

T = TypeVar("T")
MAX_STEP_CHARS = 200
MAX_CHECKPOINT_NAME_CHARS = 200
OPENED_BY_HANDLER = "opened by the handler"
_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")
logger = logging.getLogger("django_workhorse.handlers")


class HandlerContext:
    """Passed to handlers that declare it (a first parameter named ``ctx`` or annotated so).

    ``idempotency_key`` is stable for the job: the same on every attempt, fit for a provider's
    ``Idempotency-Key`` header; ``idempotency_headers(step)`` builds that header for one outbound
    call. ``checkpoint(name, fn)`` runs ``fn`` once per job and stores its JSON result; later
    attempts get the stored result without running ``fn`` again.
    """

    def __init__(self, job: sql.claims.ClaimedJob, *, alias: str, on_heartbeat: Callable[[], None]) -> None:
        self._job = job
        self._alias = alias
        self._on_heartbeat = on_heartbeat
        self._cancel = threading.Event()
        self._cancel_requested = False
        self._timed_out = False
        self.opened_breaker = False  # this attempt opened its breaker: its outcome is no verdict
        self.logger = logging.LoggerAdapter(logger, {"job_id": job.id, "attempt": job.attempt})

    @property
    def job_id(self) -> int:
        return self._job.id

    @property
    def job_type(self) -> str:
        return self._job.job_type

    @property
    def scheduled_for(self) -> datetime | None:
        """The schedule tick this job runs for (aware UTC); ``None`` for a job no schedule enqueued."""
        return self._job.scheduled_for

    @property
    def attempt(self) -> int:
        """1 on the first attempt, 2 after one retry or a reclaimed lease, and so on."""
        return self._job.attempt

    @property
    def idempotency_key(self) -> str:
        """A key every attempt of this job shares, and its redrives too: ``workhorse-job-<id>``.

        A redriven job keeps the key of the job it was redriven from, since it recovers the
        same effect. A step of a keyed workflow has its step's key instead, derived from the
        workflow's key and the step name (``"wf:<32 hex>"``, docs/handlers.md): the same for
        every attempt, replay and redrive of the step, and for a later workflow under that key.
        """
        identity = self._step_identity
        if identity is not None and identity.key_hash is not None:
            return derived_step_key(identity.key_hash, identity.step_name, encrypted=self._job.cipher_salt is not None)
        return f"workhorse-job-{self._job.root_id}"

    def idempotency_key_for(self, step: str = "") -> str:
        """Return the key of one outbound operation of this job: ``<idempotency_key>:<step>``.

        Stable over attempts and redrives, like ``idempotency_key`` (which an empty ``step``
        returns). Give each distinct call of the job its own step (``"charge"``, ``"refund"``): a
        provider answers a repeated key with the first call's response. ``step`` is 1..200 visible
        ASCII characters, so the key is at most 234 characters and fits a header value and the
        usual 255-character provider limit. Raise ``EffectValidationError`` otherwise.
        """
        if step == "":
            return self.idempotency_key
        if not _is_step(step):
            raise EffectValidationError(
                field="step", bound=f"1..{MAX_STEP_CHARS} visible ASCII characters (no spaces)", value=step
            )
        return f"{self.idempotency_key}:{step}"

    def idempotency_headers(self, step: str = "", *, header: str = "Idempotency-Key") -> dict[str, str]:
        """Return ``{header: idempotency_key_for(step)}`` for an outbound HTTP request.

        Only useful with a provider that documents the header: an API that ignores it gives no
        protection. See docs/effects.md.
        """
        return {header: self.idempotency_key_for(step)}

    @property
    def workflow_id(self) -> int | None:
        """The workflow this job is a step of; ``None`` for a plain job."""
        return self._job.workflow_id

    @property
    def step_name(self) -> str | None:
        """This job's step in its workflow (a redrive's copy keeps it); ``None`` for a plain job."""
        identity = self._step_identity
        return None if identity is None else identity.step_name

    def result_of(self, step: str) -> Any:
        """Return the result of step ``step`` of this job's workflow (any step, not only a parent).

        Read from the step's current job (its latest redrive, if any) at each call. Raise
        ``StepNotSucceededError`` if that job has not succeeded, and ``InvalidArgumentError``
        naming ``step`` if this job's workflow has no such step, or this job is no workflow step.
        """
        workflow_id = self._job.workflow_id
        if workflow_id is None:
            raise InvalidArgumentError(
                field="step", bound="a step of this job's workflow (this job is none)", value=step
            )
        check_text(step, "step", max_chars=conf.MAX_STEP_NAME_CHARS)
        found = sql.steps.step_result(self._alias, workflow_id, step)
        if found is None:
            raise InvalidArgumentError(field="step", bound=f"the name of a step of workflow {workflow_id}", value=step)
        if not found.succeeded:
            raise StepNotSucceededError(step=step, status=found.status, job_id=found.job_id)
        return found.result

    @property
    def parent_results(self) -> dict[str, Any]:
        """``{step: result}`` of this step's parents that succeeded (``{}`` for a plain job).

        A parent that died on an ``allow_failure`` edge is left out and named by
        ``failed_parents``. Read once per attempt, with ``failed_parents``.
        """
        return dict(self._parents[0])

    @property
    def failed_parents(self) -> tuple[str, ...]:
        """The names of this step's parents that died on an ``allow_failure`` edge, sorted."""
        return self._parents[1]

    @functools.cached_property
    def _step_identity(self) -> sql.steps.StepIdentity | None:
        # One query, on first use, and only for a job whose claim carried a workflow.
        if self._job.workflow_id is None:
            return None
        return sql.steps.step_identity(self._alias, self._job.id)

    @functools.cached_property
    def _parents(self) -> tuple[dict[str, Any], tuple[str, ...]]:
        if self._job.workflow_id is None:
            return {}, ()
        parents = sql.steps.parent_results(self._alias, self._job.id)
        succeeded = {parent.step_name: parent.result for parent in parents if parent.succeeded}
        failed = tuple(parent.step_name for parent in parents if not parent.succeeded and parent.tolerated_death)
        return succeeded, failed

    @property
    def deadline(self) -> datetime | None:
        return self._job.deadline

    @property
    def cancelled(self) -> bool:
        """Whether the worker wants this handler to stop (shutdown, lost lease)."""
        return self._cancel.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise ``JobCancelledError`` (cancel requested) or ``LeaseLostError`` if the handler should stop."""
        if not self._cancel.is_set():
            return
        if self._timed_out:
            raise AttemptTimeoutError(f"job {self.job_id}: the attempt ran past its timeout of {self._job.timeout}")
        if self._cancel_requested:
            raise JobCancelledError(f"job {self.job_id}: cancellation was requested")
        raise LeaseLostError(f"job {self.job_id}: this worker no longer holds its lease")

    def heartbeat(self) -> None:
        """Extend this job's lease now (the worker also does so every lease / 3 on its own).

        Raise ``LeaseLostError``, ``JobCancelledError`` or ``AttemptTimeoutError`` if the handler
        should stop.
        """
        self._on_heartbeat()
        self.raise_if_cancelled()

    def checkpoint(self, name: str, fn: Callable[[], T]) -> T:
        """Return the stored result of stage ``name``, or run ``fn``, store and return its result.

        The store is fenced by the lease: raise ``LeaseLostError`` if another worker may own the
        job now. A crash after ``fn``'s effect and before the store runs ``fn`` again next attempt.
        Raise ``CheckpointNotStorableError`` if ``name`` or the value cannot be stored (not JSON,
        NUL or lone surrogates in its text, over ``WORKHORSE_MAX_RESULT_BYTES``, nested too deep).
        """
        check_text(name, "checkpoint name", max_chars=MAX_CHECKPOINT_NAME_CHARS, error=CheckpointNotStorableError)
        found, value = sql.claims.load_checkpoint(self._alias, self.job_id, name)
        if found:
            return self._opened_checkpoint(name, value)  # type: ignore[no-any-return]
        self.raise_if_cancelled()  # never start a stage's effect on a job this worker should drop
        where, limit = f"checkpoint[{name!r}]", app_settings.MAX_RESULT_BYTES
        text = check_json(fn(), where, max_bytes=limit, error=CheckpointNotStorableError)
        stored = text if self._job.cipher_salt is None else self._sealed_checkpoint(name, text, where, limit)
        if not sql.claims.save_checkpoint(self._alias, self._job, name, stored):
            self.cancel()
            self.raise_if_cancelled()
        # Every attempt gets the stored (JSON) form, not the first attempt's Python objects.
        return json.loads(text)  # type: ignore[no-any-return]

    def _opened_checkpoint(self, name: str, value: Any) -> Any:
        """A stored checkpoint as the handler sees it: an encrypted job's opened (``DecryptionError`` if it does not)."""
        return opened_json(value, field=CHECKPOINT_PREFIX + name, salt=self._job.cipher_salt, job_id=self.job_id)

    def _sealed_checkpoint(self, name: str, text: str, where: str, limit: int) -> str:
        """The JSON string of a checkpoint's envelope, checked against the result bound (what is stored)."""
        assert self._job.cipher_salt is not None
        stored = f'"{seal_value(text, field=CHECKPOINT_PREFIX + name, salt=self._job.cipher_salt)}"'
        if len(stored) > limit:
            bound = f"at most {limit} bytes serialized"
            raise CheckpointNotStorableError(field=where, bound=bound, value=f"{len(stored)} bytes once encrypted")
        return stored

    @property
    def breaker_key(self) -> str | None:
        """The circuit breaker this job runs behind (its per-call key, or its job type), if any."""
        return self._job.breaker_key

    def open_breaker(self, *, until: datetime) -> None:
        """Open this job's circuit breaker until ``until`` (a provider's quota reset, say).

        Every worker then holds the breaker's jobs until that instant (an open breaker already
        holding longer keeps its later instant); then canaries run as after a cooldown. This
        attempt's own outcome does not count for the breaker. Raise ``BreakerValidationError`` if
        the job runs behind no breaker, or ``until`` is not an aware instant in the future, at most
        year 9999.
        """
        key = self._job.breaker_key
        if key is None:
            raise BreakerValidationError(field="breaker_key", bound="set: this job runs behind no circuit breaker")
        until = check_open_until(until, datetime.now(timezone.utc))
        policy = breakers.policy_for(self._job.job_type).to_json()
        before = sql.breakers.open_breaker(self._alias, key=key, until=until, policy=policy, reason=OPENED_BY_HANDLER)
        self.opened_breaker = True
        if before != "open":
            breakers.report([sql.breakers.Transition(key, before, "open", OPENED_BY_HANDLER)])

    def cancel(self, *, requested: bool = False, timed_out: bool = False) -> None:
        """Ask the handler to stop (used by the worker): ``requested`` by an operator, ``timed_out``,
        or else because the lease is lost."""
        self._cancel_requested = self._cancel_requested or requested
        self._timed_out = self._timed_out or timed_out
        self._cancel.set()

    def __repr__(self) -> str:
        return f"<HandlerContext job={self.job_id} attempt={self.attempt}>"


def _is_step(value: object) -> bool:
    return isinstance(value, str) and len(value) <= MAX_STEP_CHARS and _VISIBLE_ASCII.fullmatch(value) is not None
