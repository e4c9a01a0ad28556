"""What PostgreSQL can store and Python can read back: the one check for text, time, JSON and ids.

Every entry point checks its values here before any SQL runs (enqueue and batches, tasks, the
``django.tasks`` backend, the effect ledger, operator actions, admin filters, the worker's
outcomes), so a value PostgreSQL would refuse is a typed error naming the field, nothing is
half-written and the caller's transaction stays usable. Each check takes the entry point's
error class (``error=``), called with the keywords ``field``, ``bound`` and ``value``.

The rules:

- text: a ``str`` without NUL (PostgreSQL text and jsonb cannot hold U+0000) and without lone
  surrogates (not UTF-8 at all);
- time: an aware ``datetime`` whose UTC instant lies in years 1..9999 (PostgreSQL stores more, but
  Python cannot read the rest back); the same bound is a CHECK on the stored columns;
- JSON: canonical JSON (``DjangoJSONEncoder``) of text as above, nested at most
  ``MAX_JSON_DEPTH`` deep and within a byte bound;
- ids: a sequence (never a string) of ints in PostgreSQL's bigint range.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

from django_workhorse import conf
from django_workhorse.enqueueing.fingerprints import canonical_json
from django_workhorse.exceptions import InvalidArgumentError

# How a bound is reported: the entry point's error class, called with field=, bound= and value=.
BoundError = Callable[..., Exception]

TEXT_BOUND = "text without NUL characters or lone surrogates"
DATETIME_BOUND = "an instant in UTC years 1..9999"
# JSON escapes U+0000 as \u0000, which PostgreSQL's jsonb rejects; an escaped backslash before it is fine.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def utf8_size(value: str, field: str, *, error: BoundError = InvalidArgumentError) -> int:
    """Return the UTF-8 size of ``value``; raise ``error`` if PostgreSQL cannot store it as text."""
    if "\x00" in value:
        raise error(field=field, bound=TEXT_BOUND, value="a NUL character")
    if value.isascii():  # the common case, without encoding (a str knows whether it is ASCII)
        return len(value)
    try:
        return len(value.encode())
    except UnicodeEncodeError:
        raise error(field=field, bound=TEXT_BOUND, value="a lone surrogate") from None


def check_text(
    value: Any,
    field: str,
    *,
    max_chars: int | None = None,
    max_bytes: int | None = None,
    secret: bool = False,
    allow_empty: bool = False,
    error: BoundError = InvalidArgumentError,
) -> str:
    """Check a storable string of 1 (0 with ``allow_empty``) to ``max_chars`` characters or ``max_bytes`` bytes.

    ``secret`` values (keys) are never echoed in the error.
    """
    if not isinstance(value, str):
        raise error(field=field, bound="a string", value=type(value).__name__)
    size = utf8_size(value, field, error=error)
    low = 0 if allow_empty else 1
    if max_chars is not None and not low <= len(value) <= max_chars:
        raise error(field=field, bound=f"{low}..{max_chars} characters", value=None if secret else value)
    if max_bytes is not None and not low <= size <= max_bytes:
        raise error(field=field, bound=f"{low}..{max_bytes} UTF-8 bytes", value=f"{size} bytes")
    return value


def check_datetime(value: Any, field: str, *, error: BoundError = InvalidArgumentError) -> datetime:
    """Check an aware datetime whose UTC instant is in years 1..9999; return it unchanged."""
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise error(field=field, bound="an aware datetime (with a time zone)", value=value)
    try:
        value.astimezone(timezone.utc)
    except OverflowError:
        raise error(field=field, bound=DATETIME_BOUND, value=value) from None
    return value


def check_json(value: Any, field: str, *, max_bytes: int, error: BoundError = InvalidArgumentError) -> str:
    """Return the canonical JSON text of ``value``, checked to be storable as jsonb and readable back.

    The error names where in ``value`` the problem is (``payload["items"][3]``), never the value.
    """
    try:
        text = canonical_json(value)
    except RecursionError:
        raise error(field=field, bound=f"JSON nested at most {conf.MAX_JSON_DEPTH} deep") from None
    except (TypeError, ValueError) as exc:
        raise error(field=field, bound="JSON-serializable (no NaN or infinity)", value=str(exc)) from exc
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise error(field=_where(value, field), bound=TEXT_BOUND, value="a lone surrogate") from None
    if size > max_bytes:
        raise error(field=field, bound=f"at most {max_bytes} bytes serialized", value=f"{size} bytes")
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise error(field=_where(value, field), bound=TEXT_BOUND, value="a NUL character")
    # Only a text with more brackets than the bound can be nested deeper than it.
    if text.count("[") + text.count("{") > conf.MAX_JSON_DEPTH and json_depth(value) > conf.MAX_JSON_DEPTH:
        raise error(field=field, bound=f"JSON nested at most {conf.MAX_JSON_DEPTH} deep")
    return text


def json_depth(value: Any) -> int:
    """Return how deeply lists and dicts nest in ``value`` (a scalar is 0, ``[]`` is 1)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _where(value: Any, field: str) -> str:
    """Name the first place in ``value`` whose text (a key or a string) PostgreSQL cannot store."""
    for path, text in _texts(value, field):
        if _UNSTORABLE.search(text):
            return path
    return field


def _texts(value: Any, path: str) -> Iterator[tuple[str, str]]:
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            for key, child in item.items():
                inner = f"{where}[{key!r}]" if isinstance(key, str) else f"{where}[{key}]"
                if isinstance(key, str):
                    yield inner, key
                stack.append((child, inner))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))


def check_ids(value: Any, field: str, *, error: BoundError = InvalidArgumentError) -> list[int]:
    """Check a sequence (not a string) of ints in 1..2**63-1, PostgreSQL's positive bigints."""
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, (Sequence, set, frozenset)):
        raise error(field=field, bound="a sequence of ints", value=type(value).__name__)
    ids = list(value)
    for item in ids:
        check_id(item, field, error=error)
    return ids


def check_id(value: Any, field: str, *, error: BoundError = InvalidArgumentError) -> int:
    """Check one id: an int (not a bool) in 1..2**63-1."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= conf.MAX_ID:
        raise error(field=field, bound=f"ints in 1..{conf.MAX_ID}", value=value)
    return value


def storable_text(text: str, max_chars: int | None = None) -> str:
    """Return ``text`` in a form PostgreSQL can store: NUL and lone surrogates become escapes.

    For what the worker writes about a failure (an exception's message may hold anything).
    """
    if _UNSTORABLE.search(text):
        text = _UNSTORABLE.sub(lambda match: match.group().encode("unicode_escape").decode(), text)
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return text
