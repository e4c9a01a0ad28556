"""Every error django-workhorse raises on purpose."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ObjectDoesNotExist


class WorkhorseError(Exception):
    """Base class of django-workhorse errors; do not raise directly."""


class InvalidArgumentError(WorkhorseError, ValueError):
    """An argument is out of its bounds; nothing was written.

    ``field`` names the argument (``payload["items"][3]`` inside a JSON value), ``bound`` what it
    must be; ``value`` is what was given, or a description of it (never a key).
    """

    def __init__(self, *, field: str, bound: str, value: Any = None) -> None:
        self.field = field
        self.bound = bound
        self.value = value
        super().__init__(self._message())

    def _message(self) -> str:
        shown = "" if self.value is None else f", got {_short_repr(self.value)}"
        return f"{self.field} must be {self.bound}{shown}"


class EnqueueValidationError(InvalidArgumentError):
    """An enqueue argument is out of its bounds; nothing was written."""

    def __init__(self, *, field: str, bound: str, value: Any = None, ordinal: int | None = None) -> None:
        self.ordinal = ordinal
        super().__init__(field=field, bound=bound, value=value)

    def _message(self) -> str:
        where = f" (batch ordinal {self.ordinal})" if self.ordinal is not None else ""
        return super()._message() + where

    def for_ordinal(self, ordinal: int) -> EnqueueValidationError:
        """Return a copy of this error that names its position in a batch."""
        return EnqueueValidationError(field=self.field, bound=self.bound, value=self.value, ordinal=ordinal)

    def for_step(self, step: str) -> WorkflowDefinitionError:
        """Return this error as a workflow's, naming the step whose request it refuses."""
        return WorkflowDefinitionError(step=step, field=self.field, bound=self.bound, value=self.value)


class WorkflowDefinitionError(InvalidArgumentError):
    """A workflow's definition is out of its bounds; nothing was written.

    ``step`` names the step at fault (None for the workflow itself: its name, its key, its number
    of steps), ``field`` the argument (``after``, ``step_name``, or an enqueue option of the step's
    request), ``bound`` what it must be and ``value`` what was given (never a key).
    """

    def __init__(self, *, field: str, bound: str, value: Any = None, step: str | None = None) -> None:
        self.step = step
        super().__init__(field=field, bound=bound, value=value)

    def _message(self) -> str:
        where = "workflow" if self.step is None else f"workflow step {_short_repr(self.step)}"
        return f"{where}: {super()._message()}"


class EnqueueIdempotencyConflictError(WorkhorseError):
    """A live key was reused for a materially different request.

    The error names the job that owns the key and the fields that differ; it never carries the raw
    key or payload. Nothing was written: catching it leaves the caller's transaction usable.
    """

    def __init__(
        self,
        *,
        job_id: int,
        mode: str,
        scope: str,
        conflicting_fields: Sequence[str],
        key_preview: str,
        key_digest: str,
        stored_request_digest: str,
        rejected_request_digest: str,
        ordinal: int | None = None,
    ) -> None:
        self.job_id = job_id
        self.mode = mode
        self.scope = scope
        self.conflicting_fields = tuple(conflicting_fields)
        self.key_preview = key_preview
        self.key_digest = key_digest
        self.stored_request_digest = stored_request_digest
        self.rejected_request_digest = rejected_request_digest
        self.ordinal = ordinal
        where = f" (batch ordinal {ordinal})" if ordinal is not None else ""
        super().__init__(
            f"{mode} key {key_preview} [{key_digest}] in scope {scope!r} is owned by job {job_id}; "
            f"this request differs in {', '.join(self.conflicting_fields)}{where}"
        )


class WorkflowConflictError(EnqueueIdempotencyConflictError):
    """A live workflow key was reused for a different graph; nothing was written.

    ``steps`` names the steps added, removed, or changed in request or dependencies;
    ``conflicting_fields`` carries the differing fingerprint fields (``name``, ``step:<name>``, or
    ``workflow`` when a plain job owns the key); ``job_id`` is the owner's anchor job.
    """

    def __init__(self, *, steps: Sequence[str], workflow_id: int | None, **conflict: Any) -> None:
        super().__init__(**conflict)
        self.steps = tuple(steps)
        self.workflow_id = workflow_id
        owner = f"workflow {workflow_id}" if workflow_id is not None else f"job {self.job_id} (not a workflow)"
        differs = f"steps {', '.join(map(repr, self.steps))}" if self.steps else ", ".join(self.conflicting_fields)
        self.args = (
            f"{self.mode} key {self.key_preview} [{self.key_digest}] in scope {self.scope!r} is owned by {owner}; "
            f"this workflow differs in {differs}",
        )


class JobDoesNotExist(WorkhorseError, ObjectDoesNotExist):  # noqa: N818 (Django naming)
    """No job has the given id."""


class WorkflowDoesNotExist(WorkhorseError, ObjectDoesNotExist):  # noqa: N818 (Django naming)
    """No workflow has the given id."""


class StepNotSucceededError(WorkhorseError):
    """A workflow step's current job (its latest redrive, if any) has not succeeded: no result to read.

    ``step`` names the step, ``status`` its current job's status and ``job_id`` that job.
    """

    def __init__(self, *, step: str, status: str, job_id: int) -> None:
        self.step = step
        self.status = status
        self.job_id = job_id
        super().__init__(f"step {step!r} has not succeeded: its current job {job_id} is {status}")


def _short_repr(value: Any, limit: int = 80) -> str:
    try:
        text = repr(value)
    except Exception:  # a value whose repr fails must not hide the error about it
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


class HandlerNotRegisteredError(WorkhorseError, LookupError):
    """No handler is registered for a job type."""

    def __init__(self, job_type: str) -> None:
        self.job_type = job_type
        super().__init__(f"no handler is registered for job type {job_type!r}")


class LeaseLostError(WorkhorseError):
    """This worker's lease on the job expired and another worker may own it; stop working on it."""


class JobCancelledError(WorkhorseError):
    """A job was cancelled: the handler's own job (``ctx.raise_if_cancelled``), or one waited on.

    ``job_id`` names the cancelled job (None when a handler raises it bare for its own job). The
    worker ends the running job cancelled only for its own id or None: a handler whose awaited job
    was cancelled fails (and retries) as with any error.
    """

    def __init__(self, message: str = "", *, job_id: int | None = None) -> None:
        self.job_id = job_id
        super().__init__(message or (f"job {job_id} was cancelled" if job_id is not None else "cancelled"))


class JobFailedError(WorkhorseError):
    """A job waited on is dead: its attempts failed (or it was failed at once).

    ``job_id`` names the job, ``step`` its workflow step (None for a plain job) and ``error`` its
    ``last_error``; the message shows the error's first line.
    """

    def __init__(self, *, job_id: int, error: str, step: str | None = None) -> None:
        self.job_id = job_id
        self.step = step
        self.error = error
        lines = error.strip().splitlines()
        where = f"job {job_id}" if step is None else f"workflow step {step!r} (job {job_id})"
        super().__init__(f"{where} failed: {lines[0] if lines else 'no error recorded'}")


class WaitTimeoutError(WorkhorseError, TimeoutError):
    """A wait for a job's (or a workflow's) result ran out of time; the job goes on.

    ``job_id`` or ``workflow_id`` names what was waited on, ``timeout`` the seconds waited.
    """

    def __init__(self, *, timeout: float, job_id: int | None = None, workflow_id: int | None = None) -> None:
        self.job_id = job_id
        self.workflow_id = workflow_id
        self.timeout = timeout
        what = f"job {job_id}" if workflow_id is None else f"workflow {workflow_id}"
        super().__init__(f"{what} did not finish within {timeout:g} s")


class WaitNotAllowedError(WorkhorseError, RuntimeError):
    """A wait here could never end, or would hold back what it waits for; nothing was waited on.

    Raised for a wait inside a handler, on a job of a queue its worker serves, when the worker runs
    one job at a time (the job could only run after the waiting handler ends), and for a wait inside
    ``atomic()`` on the alias it reads (the transaction would hide a job it enqueued from the
    workers, and the wait's row lock would hold the job's outcome back).
    """


class JobNotDeadError(WorkhorseError):
    """Only a dead job (a dead letter) can be redriven."""

    def __init__(self, job_id: int, status: str) -> None:
        self.job_id = job_id
        self.status = status
        super().__init__(f"job {job_id} is {status}, not dead: only dead jobs can be redriven")


class RedriveConflictError(WorkhorseError):
    """A redrive request id was reused with a different requester or reason."""

    def __init__(self, *, source_id: int, request_id: str, new_job_id: int, conflicting_fields: list[str]) -> None:
        self.source_id = source_id
        self.request_id = request_id
        self.new_job_id = new_job_id
        self.conflicting_fields = tuple(conflicting_fields)
        super().__init__(
            f"redrive {request_id!r} of job {source_id} already created job {new_job_id}; "
            f"this request differs in {', '.join(self.conflicting_fields)}"
        )


class KeyNotSettledError(WorkhorseError):
    """A key (of enqueue or of the effect ledger) changed hands between every one of our statements.

    Each round re-reads the key after another transaction expired, pruned or took it over; needing
    more than a few rounds means something keeps deleting or replacing it. Nothing was written.
    """


class EffectValidationError(InvalidArgumentError):
    """An argument of the effect ledger is out of its bounds; nothing was written or run."""


class EffectAlreadyDoneError(WorkhorseError):
    """A ``once_block`` tried to record a result for an operation that is already done.

    The block ran the effect again instead of checking ``op.done``; raising rolls back what it
    wrote, and the stored result stays as it was.
    """


class EffectInFlightError(WorkhorseError):
    """``once()`` was nested with its own key: the operation is in flight in this very transaction."""


class AttemptTimeoutError(WorkhorseError, TimeoutError):
    """The attempt ran past the job's ``timeout``; the handler was asked to stop."""


class ResultNotStorableError(InvalidArgumentError):
    """A handler's return value cannot be stored (not JSON, unstorable text, too large or too deep).

    The attempt fails with this error (retried or dead like any failure); ``field`` names where in
    the result the problem is (``result['items'][3]``).
    """


class OutcomeValidationError(InvalidArgumentError):
    """A handler outcome (``Snooze``, ``Retry``, ``Cancel``, ``Fail``) was built with a value out of its
    bounds; ``field`` names the argument and ``bound`` what it must be.

    Raised where the outcome is built, so inside a handler the attempt fails with it like with any
    exception (retried or dead), and the worker goes on.
    """


class TaskDefinitionError(InvalidArgumentError):
    """A ``@task`` option is out of its bounds (``fail_on``/``retry_on`` that are not exception classes)."""


class CheckpointNotStorableError(InvalidArgumentError):
    """A checkpoint's name or value cannot be stored; raised by ``ctx.checkpoint`` in the handler."""


class WorkerThreadError(WorkhorseError):
    """A worker thread died of an unexpected error; the worker stopped and released its jobs.

    Raised by ``Worker.run`` after the shutdown; ``threads`` names the threads that died.
    """

    def __init__(self, threads: Sequence[str]) -> None:
        self.threads = tuple(threads)
        super().__init__(f"worker thread(s) died: {', '.join(self.threads)}; see the log for the traceback")


class DatabaseUnavailableError(WorkhorseError):
    """The database did not answer for longer than a worker's ``max_db_wait``; it gave up waiting.

    Raised by ``Worker.run`` (after stopping and releasing what it could) and by ``workhorse_scheduler``;
    ``alias`` names the database, ``waited`` the seconds waited and ``max_wait`` the bound.
    """

    def __init__(self, *, alias: str, waited: float, max_wait: float, error: str) -> None:
        self.alias, self.waited, self.max_wait = alias, waited, max_wait
        super().__init__(
            f"database {alias!r} did not answer for {waited:.1f} s (max_db_wait {max_wait:g} s); giving up: {error}"
        )


class DjangoTaskNotFoundError(WorkhorseError):
    """A django.tasks job's type (a task's module path) no longer names a django.tasks ``Task``.

    The task was moved, renamed or removed after the job was enqueued; the attempt fails.
    """

    def __init__(self, job_type: str) -> None:
        self.job_type = job_type
        super().__init__(f"{job_type!r} no longer names a django.tasks task")


class WorkhorseBackendNotConfiguredError(WorkhorseError):
    """A django.tasks job needs a ``WorkhorseBackend`` in ``settings.TASKS`` to run with, and there is none."""

    def __init__(self, job_type: str) -> None:
        self.job_type = job_type
        super().__init__(f"no WorkhorseBackend in settings.TASKS to run {job_type!r} with")


class ScheduleDefinitionError(InvalidArgumentError):
    """A schedule's definition is out of its bounds (``field`` names the value, ``bound`` what it must be)."""


class BreakerValidationError(InvalidArgumentError):
    """A circuit breaker's setting, key or instant is out of its bounds; nothing was written."""


class ScheduleNotFoundError(WorkhorseError, LookupError):
    """No schedule of that name can run here: not declared in this process's code, or inactive.

    ``reason`` says which.
    """

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"schedule {name!r} {reason}")


class IdempotentViewError(InvalidArgumentError):
    """An ``@idempotent`` view is declared or behaves outside its bounds (a server-side error).

    Raised at decoration for a bad argument (scope, ttl, wait, methods, an async view), and while a
    request runs for an owner callable's bad value or a response that cannot be stored (streaming,
    or larger than ``WORKHORSE_IDEMPOTENT_RESPONSE_MAX_BYTES``). In the latter case the view's
    transaction is rolled back and its key stays free.
    """


class IdempotencyKeyError(WorkhorseError, ValueError):
    """An ``Idempotency-Key`` header is not one key; ``reason`` says why, never with the value.

    ``@idempotent`` answers it with a 400 problem; ``django_workhorse.http.keys.parse_key`` raises it.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class DrainTimeoutError(WorkhorseError, TimeoutError):
    """A drained queue still had running jobs when the timeout ran out; the queue stays paused.

    ``queue`` names the queue, ``timeout`` the seconds waited, ``running`` the ids of its jobs still
    running at the last check (``waiting_transactions`` counts the transactions older than the pause
    it was still waiting for).
    """

    def __init__(self, *, queue: str, timeout: float, running: Sequence[int], waiting_transactions: int = 0) -> None:
        self.queue = queue
        self.timeout = timeout
        self.running = tuple(running)
        self.waiting_transactions = waiting_transactions
        jobs = ", ".join(map(str, self.running[:20])) + (" …" if len(self.running) > 20 else "")
        what = f"{len(self.running)} job(s) still running ({jobs})" if self.running else "no job running"
        older = (
            f", {waiting_transactions} transaction(s) older than the pause still open" if waiting_transactions else ""
        )
        super().__init__(f"queue {queue!r} did not drain within {timeout:g} s: {what}{older}; it stays paused")


class RateLimitValidationError(InvalidArgumentError):
    """A rate limit's definition, or an argument naming one, is out of its bounds; nothing was written."""


class RateLimitTimeoutError(WorkhorseError, TimeoutError):
    """``rate_limits.acquire`` found no start available within its timeout; nothing was spent.

    ``name`` and ``partition`` name the budget; ``retry_after`` is how many seconds later its next
    start was due when the wait gave up.
    """

    def __init__(self, name: str, partition: str | None, retry_after: float) -> None:
        self.name = name
        self.partition = partition
        self.retry_after = retry_after
        where = name if partition is None else f"{name}[{partition!r}]"
        super().__init__(f"rate limit {where}: no start available in time (the next in {retry_after:.3f} s)")


class EncryptionNotConfiguredError(InvalidArgumentError):
    """Encryption was asked for while ``WORKHORSE_ENCRYPTION`` is not set; nothing was written.

    Raised by ``enqueue(..., encrypted=True)`` and ``@task(encrypted=True)`` (``field``
    ``encrypted``), and by sealing or fingerprinting a value (``field`` ``WORKHORSE_ENCRYPTION``);
    ``bound`` says what is needed.
    """


class DecryptionError(WorkhorseError):
    """A stored value could not be decrypted; nothing of it is returned, and no key is named.

    ``what`` names the value (``payload of job 17``), ``key_id`` the key id its envelope names (None
    when it is not an envelope), and ``reason`` is one of ``UNKNOWN_KEY`` (no configured key has that
    id), ``WRONG_KEY_OR_TAMPERED`` (the key under that id does not open it: another key, altered
    bytes, or a value copied from another row or field) and ``UNKNOWN_FORMAT`` (not an envelope of
    a format this version reads).
    """

    UNKNOWN_KEY = "unknown key id"
    WRONG_KEY_OR_TAMPERED = "wrong key or tampered"
    UNKNOWN_FORMAT = "not an envelope of a known format"

    def __init__(self, *, what: str, reason: str, key_id: str | None = None) -> None:
        self.what = what
        self.reason = reason
        self.key_id = key_id
        super().__init__(self._message())

    def _message(self) -> str:
        if self.reason == self.UNKNOWN_KEY:
            return f'cannot decrypt {self.what}: key id {self.key_id!r} is not among WORKHORSE_ENCRYPTION["keys"]'
        if self.reason == self.WRONG_KEY_OR_TAMPERED:
            return (
                f"cannot decrypt {self.what}: it does not decrypt under key {self.key_id!r} (a different key under "
                "that id, or the value was altered or copied from another row or field)"
            )
        under = "" if self.key_id is None else f" (key {self.key_id!r})"
        return f"cannot decrypt {self.what}{under}: {self.reason} (wh1:<key id>:<data>)"
