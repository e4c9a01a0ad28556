"""Shorthands for common workflow shapes, after Celery's canvas (decision 0022 §6): ``chain``,
``group`` and ``chord`` each build a :class:`Workflow`, so ``.enqueue()`` and everything else of a
workflow work on them.

Steps are named ``"<index>.<job_type>"`` (cut to 200 characters), the index counting the requests
in the order given, so the same calls build the same graph and the same fingerprint: a keyed chord
enqueued twice replays. Payloads are bound when the request is built, so a step's result is not
passed to the next step as an argument, as Celery does: a handler reads ``ctx.parent_results``.
"""

from __future__ import annotations

from collections.abc import Sequence

from django_workhorse import conf
from django_workhorse.exceptions import WorkflowDefinitionError
from django_workhorse.types import EnqueueRequest, Idempotency
from django_workhorse.workflows.definition import Step, Workflow, check_has_steps


def chain(*requests: EnqueueRequest, name: str = "chain", idempotency: Idempotency | None = None) -> Workflow:
    """Return a workflow running ``requests`` one after another, each once the one before succeeded.

    Raise ``WorkflowDefinitionError`` for no request, or as :class:`Workflow` and
    :meth:`Workflow.add` do (a step names its index and job type).
    """
    check_has_steps(len(requests))
    workflow = Workflow(name, idempotency=idempotency)
    previous: tuple[Step, ...] = ()
    for index, request in enumerate(requests):
        previous = (workflow.add(step_name(index, request), request, after=previous),)
    return workflow


def group(*requests: EnqueueRequest, name: str = "group", idempotency: Idempotency | None = None) -> Workflow:
    """Return a workflow running ``requests`` side by side, none waiting for another.

    Raise ``WorkflowDefinitionError`` as :func:`chain` does.
    """
    check_has_steps(len(requests))
    workflow = Workflow(name, idempotency=idempotency)
    for index, request in enumerate(requests):
        workflow.add(step_name(index, request), request)
    return workflow


def chord(
    header: Workflow | Sequence[EnqueueRequest],
    callback: EnqueueRequest,
    *,
    name: str = "chord",
    idempotency: Idempotency | None = None,
) -> Workflow:
    """Return a workflow running ``header`` (a :func:`group`, or a list of requests), then ``callback``
    once every step of it succeeded; the callback reads their results in ``ctx.parent_results``.

    A ``header`` workflow keeps its steps and their dependencies, and the callback comes after its
    last steps (those no other step comes after); its name and key are not used: pass ``name=`` and
    ``idempotency=`` here. ``chord(group(a, b), c)`` and ``chord([a, b], c)`` build the same graph.
    Raise ``WorkflowDefinitionError`` for an empty header, a header workflow with a key of its own,
    or as :func:`chain` does.
    """
    if isinstance(header, Workflow):
        if header.idempotency is not None:
            bound = "a header without idempotency= (give the key to chord: the header is not enqueued itself)"
            raise WorkflowDefinitionError(field="header.idempotency", bound=bound, value="set")
        workflow = Workflow(name, idempotency=idempotency)
        steps = header.plan().steps  # checks the header; raises for an empty one
        for planned in steps:
            workflow.add(planned.name, planned.request, after=planned.parents, allow_failure=planned.allow_failure)
        parents = {parent for planned in steps for parent in planned.parents}
        last = [planned.name for planned in steps if planned.name not in parents]
    elif isinstance(header, (list, tuple)):
        workflow = group(*header, name=name, idempotency=idempotency)
        last = [step_name(index, request) for index, request in enumerate(header)]
    else:
        bound = "a Workflow (group(...)) or a list of EnqueueRequests"
        raise WorkflowDefinitionError(field="header", bound=bound, value=type(header).__name__)
    workflow.add(step_name(len(workflow), callback), callback, after=last)
    return workflow


def step_name(index: int, request: object) -> str:
    """The step name of the ``index``-th request of a shorthand: ``"<index>.<job_type>"``, at most
    200 characters (the index keeps cut names distinct)."""
    if not isinstance(request, EnqueueRequest):
        return str(index)  # Workflow.add refuses the request, naming this step
    return f"{index}.{request.job_type}"[: conf.MAX_STEP_NAME_CHARS]
