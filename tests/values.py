"""Values for the bound and property tests: nesting to a depth, and JSON as PostgreSQL gives it back."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django_workhorse.enqueueing.fingerprints import canonical_json


def nested(depth: int, leaf: Any = 1) -> Any:
    """Return ``leaf`` inside ``depth`` lists: ``nested(2)`` is ``[[1]]``, nested 2 deep."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def as_stored(value: Any) -> Any:
    """What jsonb gives back for ``value``: its canonical JSON, every number as a Decimal.

    PostgreSQL keeps JSON numbers as numeric, so a float written with an exponent (1e16) comes
    back as the integer it denotes: equal as a number, not always as a Python float.
    """
    return json.loads(canonical_json(value), parse_float=Decimal, parse_int=Decimal)


def read_back(value: Any) -> Any:
    """A value read from jsonb, every number as a Decimal, to compare with :func:`as_stored`."""
    return json.loads(json.dumps(value), parse_float=Decimal, parse_int=Decimal)
