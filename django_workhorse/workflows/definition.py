"""A workflow's definition: named steps, each an enqueue request, and their dependencies.

Pure Python: ``Workflow.add`` checks each step as it comes, ``Workflow.plan`` checks the graph and
every request and returns the steps in the order enqueue writes them; ``Workflow.enqueue`` hands the
plan to ``workflows.enqueue``. Nothing else here touches the database, so a definition refused here
has written nothing and the caller's transaction stays usable.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django_workhorse import conf
from django_workhorse.conf import app_settings
from django_workhorse.enqueueing.entries import prepare_entry
from django_workhorse.enqueueing.prepared import PreparedJob
from django_workhorse.enqueueing.storable import check_text
from django_workhorse.enqueueing.validation import (
    MODE_OPTIONS,
    RESERVED_SCOPE_PREFIX,
    CheckedOptions,
    check_duration,
    check_key_text,
)
from django_workhorse.exceptions import EnqueueValidationError, WorkflowDefinitionError
from django_workhorse.types import EnqueueOptions, EnqueueRequest, Idempotency

if TYPE_CHECKING:
    from django_workhorse.workflows.result import WorkflowResult

_KEYED_STEP_BOUND = "omitted: a step has no key of its own (the workflow's idempotency= deduplicates its steps)"


@dataclass(frozen=True)
class Step:
    """A handle on a step, returned by :meth:`Workflow.add`; ``after=`` takes it or the step's name."""

    name: str


@dataclass(frozen=True)
class PlannedStep:
    """One step of a checked workflow: its request, its storable form and the names of its parents."""

    name: str
    request: EnqueueRequest
    prepared: PreparedJob
    parents: tuple[str, ...]
    allow_failure: bool


@dataclass(frozen=True)
class Plan:
    """A checked workflow, its steps in topological order (ties in the order they were added).

    The first step is the workflow's anchor: the job its idempotency binding names.
    """

    name: str
    idempotency: Idempotency | None
    steps: tuple[PlannedStep, ...]

    def edges(self) -> tuple[tuple[int, int, bool], ...]:
        """Every dependency as ``(child ordinal, parent ordinal, allow_failure)``, ordinals into ``steps``."""
        ordinal = {step.name: index for index, step in enumerate(self.steps)}
        return tuple(
            (index, ordinal[parent], step.allow_failure)
            for index, step in enumerate(self.steps)
            for parent in step.parents
        )


@dataclass(frozen=True)
class _Added:
    request: EnqueueRequest
    after: tuple[str, ...]
    allow_failure: bool


class Workflow:
    """A graph of jobs enqueued together: each step runs once all the steps it comes ``after`` succeeded.

    ``idempotency=Idempotency(key, scope=, ttl=)`` makes one enqueue of the whole workflow per key;
    no other keyed mode means anything for a graph. Raise ``WorkflowDefinitionError`` for a name
    that is not 1..200 characters of storable text, or any other ``idempotency``.
    """

    def __init__(self, name: str, *, idempotency: Idempotency | None = None) -> None:
        check_text(name, "name", max_chars=conf.MAX_WORKFLOW_NAME_CHARS, error=WorkflowDefinitionError)
        if idempotency is not None:
            _check_idempotency(idempotency)
        self.name = name
        self.idempotency = idempotency
        self._steps: dict[str, _Added] = {}

    def __repr__(self) -> str:
        return f"<Workflow {self.name!r}: {len(self._steps)} steps>"

    def __len__(self) -> int:
        return len(self._steps)

    def add(
        self,
        step_name: str,
        request: EnqueueRequest,
        *,
        after: Step | str | Iterable[Step | str] = (),
        allow_failure: bool = False,
    ) -> Step:
        """Add a step running ``request`` (``task.s(...)``) once every step of ``after`` succeeded.

        ``after`` takes :class:`Step` handles or step names, of steps added before or after this
        one (a name is resolved by :meth:`plan`). ``allow_failure=True``: a dead parent satisfies
        the step's dependency on it. Raise ``WorkflowDefinitionError`` naming the step for a name
        that is not 1..200 characters of storable text or is taken, a request that is not an
        ``EnqueueRequest`` or has a keyed mode, a malformed ``after``, or one step too many.
        """
        check_text(step_name, "step_name", max_chars=conf.MAX_STEP_NAME_CHARS, error=WorkflowDefinitionError)
        if step_name in self._steps:
            raise WorkflowDefinitionError(step=step_name, field="step_name", bound="unique in the workflow")
        _check_request(step_name, request)
        parents = _parent_names(step_name, after)
        _check_flag(step_name, "allow_failure", allow_failure)
        _check_step_count(len(self._steps) + 1, step_name)
        self._steps[step_name] = _Added(request, parents, allow_failure)
        return Step(step_name)

    def enqueue(self, *, using: str | None = None) -> WorkflowResult:
        """Write the workflow, its steps (jobs) and their edges in one statement, in the caller's
        transaction: steps without parents are ready at once, the others wait for their parents.

        Unkeyed, every call makes a new workflow. With ``idempotency=``, the same graph under a live
        key returns the original ids (``REPLAYED``), writing nothing; a different one raises
        ``WorkflowConflictError`` naming the differing steps. Raise ``WorkflowDefinitionError`` as
        :meth:`plan` does. Nothing is written on an error: the caller's transaction stays usable.
        """
        from django_workhorse.workflows.enqueue import enqueue  # touches the database: not at import

        return enqueue(self, using=using)

    async def aenqueue(self, *, using: str | None = None) -> WorkflowResult:
        """Async :meth:`enqueue`, for async views: runs it on Django's thread for database work.

        It commits on its own (Django has no async transactions): to enqueue a workflow in a
        transaction with other writes, call :meth:`enqueue` in the same ``sync_to_async`` function.
        """
        from asgiref.sync import sync_to_async  # noqa: PLC0415 (as enqueue: only when called)

        return await sync_to_async(functools.partial(self.enqueue, using=using), thread_sensitive=True)()

    def plan(self) -> Plan:
        """Check the whole workflow and return its :class:`Plan`, steps in topological order.

        Raise ``WorkflowDefinitionError`` for no step, more than ``WORKHORSE_WORKFLOW_MAX_STEPS``,
        a dependency on no step of the workflow, a cycle (naming the steps on it), or a step whose
        request enqueue would refuse (naming the step, with the field and bound of the enqueue error).
        """
        check_has_steps(len(self._steps))
        _check_step_count(len(self._steps), None)
        for name, added in self._steps.items():
            for parent in added.after:
                if parent not in self._steps:
                    bound = "names of steps of this workflow"
                    raise WorkflowDefinitionError(step=name, field="after", bound=bound, value=parent)
        order = self._topological_order()
        checked: dict[Any, CheckedOptions] = {}  # steps of one task check their options once
        resolved: dict[tuple[int, str], EnqueueOptions] = {}
        limit = app_settings.MAX_PAYLOAD_BYTES
        steps = []
        for name in order:
            added = self._steps[name]
            try:
                prepared = prepare_entry(added.request, checked, resolved, limit)
            except EnqueueValidationError as exc:
                raise exc.for_step(name) from exc
            steps.append(PlannedStep(name, added.request, prepared, added.after, added.allow_failure))
        return Plan(self.name, self.idempotency, tuple(steps))

    def _topological_order(self) -> list[str]:
        """Kahn's algorithm; of the steps ready at once, the one added first comes first."""
        names = list(self._steps)
        position = {name: index for index, name in enumerate(names)}
        waiting = {name: len(added.after) for name, added in self._steps.items()}
        children: dict[str, list[str]] = {name: [] for name in names}
        for name, added in self._steps.items():
            for parent in added.after:
                children[parent].append(name)
        ready = [position[name] for name in names if not waiting[name]]  # ascending: already a heap
        order: list[str] = []
        while ready:
            name = names[heapq.heappop(ready)]
            order.append(name)
            for child in children[name]:
                waiting[child] -= 1
                if not waiting[child]:
                    heapq.heappush(ready, position[child])
        if len(order) < len(names):
            cycle = self._a_cycle({name for name, count in waiting.items() if count})
            raise WorkflowDefinitionError(step=cycle[0], field="after", bound="free of cycles", value=cycle)
        return order

    def _a_cycle(self, left: set[str]) -> tuple[str, ...]:
        """One cycle among the steps Kahn's algorithm left, in run order, from its first-added step.

        Every step left waits on a parent that is left too, so walking from parent to parent
        repeats a step: the walk from that repeat is a cycle.
        """
        position = {name: index for index, name in enumerate(self._steps)}
        seen: dict[str, int] = {}
        walk: list[str] = []
        name = min(left, key=position.__getitem__)
        while name not in seen:
            seen[name] = len(walk)
            walk.append(name)
            name = next(parent for parent in self._steps[name].after if parent in left)
        cycle = walk[seen[name] :][::-1]  # a walk of parents runs backwards
        first = min(range(len(cycle)), key=lambda index: position[cycle[index]])
        return tuple(cycle[first:] + cycle[:first])


def check_has_steps(count: int) -> None:
    """Raise ``WorkflowDefinitionError`` for a workflow of no step."""
    if not count:
        raise WorkflowDefinitionError(field="steps", bound="at least 1 step", value="0 steps")


def _check_idempotency(mode: Any) -> None:
    """The workflow's key, checked as enqueue checks an ``Idempotency`` (never echoing the key)."""
    if not isinstance(mode, Idempotency):
        bound = "an Idempotency value or None (unique, debounce and throttle mean nothing for a graph)"
        raise WorkflowDefinitionError(field="idempotency", bound=bound, value=type(mode).__name__)
    error = WorkflowDefinitionError
    check_key_text(mode.key, "idempotency.key", conf.MAX_KEY_BYTES, error=error)
    check_text(mode.scope, "idempotency.scope", max_bytes=conf.MAX_SCOPE_BYTES, error=error)
    if mode.scope.startswith(RESERVED_SCOPE_PREFIX):
        bound = f"a scope not starting with {RESERVED_SCOPE_PREFIX!r} (reserved for django_workhorse's own keys)"
        raise WorkflowDefinitionError(field="idempotency.scope", bound=bound, value=mode.scope)
    check_duration(mode.ttl, "idempotency.ttl", conf.MIN_KEY_TTL, conf.MAX_KEY_TTL, error=error)


def _check_request(step: str, request: object) -> None:
    """A step's request is an ``EnqueueRequest`` without a keyed mode: a second binding could
    coalesce it onto a job outside the graph (unique), replace it (debounce) or give it two owners."""
    if not isinstance(request, EnqueueRequest):
        bound = "an EnqueueRequest (task.s(...), task.signature(...))"
        raise WorkflowDefinitionError(step=step, field="request", bound=bound, value=type(request).__name__)
    options: object = request.options
    if not isinstance(options, EnqueueOptions):
        return  # refused by ``plan``, as enqueue refuses it
    for name in MODE_OPTIONS:
        if getattr(options, name) is not None:
            raise WorkflowDefinitionError(step=step, field=name, bound=_KEYED_STEP_BOUND)


def _parent_names(step: str, after: Any) -> tuple[str, ...]:
    items = (after,) if isinstance(after, (Step, str)) else after
    bound = "Step handles or step names"
    if not isinstance(items, Iterable):
        raise WorkflowDefinitionError(step=step, field="after", bound=bound, value=type(after).__name__)
    names: dict[str, None] = {}  # ordered, and a duplicate found in O(1)
    for item in items:
        if isinstance(item, Step):
            item = item.name
        if not isinstance(item, str):
            raise WorkflowDefinitionError(step=step, field="after", bound=bound, value=type(item).__name__)
        if item in names:
            raise WorkflowDefinitionError(step=step, field="after", bound="distinct steps", value=item)
        names[item] = None
    return tuple(names)


def _check_flag(step: str, field: str, value: object) -> None:
    if not isinstance(value, bool):  # a typo'd truthy value would silently change what runs
        raise WorkflowDefinitionError(step=step, field=field, bound="True or False", value=value)


def _check_step_count(count: int, step: str | None) -> None:
    limit = app_settings.WORKFLOW_MAX_STEPS
    if count > limit:
        bound = f"at most {limit} steps (WORKHORSE_WORKFLOW_MAX_STEPS)"
        raise WorkflowDefinitionError(step=step, field="steps", bound=bound, value=f"{count} steps")
