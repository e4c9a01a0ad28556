"""The value objects: keyed modes never show their key."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_workhorse import Debounce, Idempotency, Throttle, Unique

SECRET = "SECRET-key-4711"
WINDOW = timedelta(seconds=5)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (Idempotency(SECRET, scope="s"), "Idempotency(key=<15 chars>, scope='s', ttl=datetime.timedelta(days=1))"),
        (Unique(SECRET), "Unique(key=<15 chars>, scope='default')"),
        (
            Debounce(SECRET, WINDOW),
            "Debounce(key=<15 chars>, window=datetime.timedelta(seconds=5), schedule='reset', scope='default')",
        ),
        (
            Throttle(SECRET, WINDOW, scope="t"),
            "Throttle(key=<15 chars>, window=datetime.timedelta(seconds=5), scope='t')",
        ),
    ],
    ids=["idempotency", "unique", "debounce", "throttle"],
)
def test_a_keyed_mode_shows_its_key_length_and_other_fields_never_the_key(mode, expected):
    assert repr(mode) == expected
    assert SECRET not in repr(mode) and SECRET not in str(mode)


def test_keyed_modes_stay_frozen_and_comparable():
    assert Unique("k") == Unique("k") and hash(Unique("k")) == hash(Unique("k"))
    with pytest.raises(AttributeError):
        Unique("k").key = "other"  # type: ignore[misc]
