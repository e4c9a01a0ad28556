"""A workflow's fingerprint (decision 0022 §3): one digest per step and one for the name, stored
as its binding's ``field_digests``, and the graph's digest over them. Pure functions."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from django_workhorse.enqueueing.fingerprints import STEP_FIELD_PREFIX, canonical_json, field_digest
from django_workhorse.enqueueing.validation import request_fingerprint

if TYPE_CHECKING:
    from django_workhorse.workflows.definition import Plan


def step_field(step_name: str) -> str:
    """The name of a step's entry in the fingerprint."""
    return STEP_FIELD_PREFIX + step_name


def field_digests(plan: Plan) -> dict[str, str]:
    """``name`` and, per step, ``step:<name>``: the digest of its request as a keyed enqueue
    fingerprints it, with its parents sorted, each with the step's ``allow_failure``."""
    digests = {"name": field_digest(canonical_json(plan.name))}
    for step in plan.steps:
        parents = [[parent, step.allow_failure] for parent in sorted(step.parents)]
        digests[step_field(step.name)] = field_digest(
            canonical_json([request_fingerprint(step.prepared).hex(), parents])
        )
    return digests


def graph_digest(digests: dict[str, str]) -> bytes:
    """The digest of the whole graph: equal digests mean the same workflow.

    Over the canonical JSON of the field digests rather than ``fingerprints.request_digest``'s
    ``name=digest;`` text: step names are the caller's and may hold ``=`` or ``;``."""
    return hashlib.sha256(canonical_json(digests).encode()).digest()


def differing_steps(fields: list[str]) -> list[str]:
    """The step names among differing fingerprint fields, in the order given."""
    return [field[len(STEP_FIELD_PREFIX) :] for field in fields if field.startswith(STEP_FIELD_PREFIX)]
