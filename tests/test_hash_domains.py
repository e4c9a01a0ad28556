"""HTTP records and ``once()`` effects share the ledger's table: no key of one may hash as the other's.

The forgeries of the review: a ``once()`` key spelled as an HTTP record's hashed text, in the
view's scope, before and after the user's request (through the live server, a real session).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_workhorse import once
from django_workhorse.enqueueing.fingerprints import http_key_hash, key_hash
from tests.http_views import CONTROL
from tests.test_http_idempotency import BOOK, Client, client_, new_key, session_cookie

__all__ = ["client_"]  # the live-server client fixture, shared with tests/test_http_idempotency.py

pytestmark = pytest.mark.django_db(transaction=True)

PATH, SCOPE = "/http/orders-for-user/", "tests.orders"


def legacy_http_text(owner: str, key: str) -> str:
    """What the HTTP hash used to be over (after the scope): a once() key could spell it."""
    return f"http\x1f{len(owner)}:{owner}\x1f{key}"


def test_a_once_key_cannot_take_a_users_http_key_before_the_request(client_: Client, django_user_model):
    user = django_user_model.objects.create_user("victim", password="pw")
    key = new_key()
    once(legacy_http_text(f"user:{user.pk}", key), lambda: "forged", scope=SCOPE)

    reply = client_.send(PATH, BOOK, key=key, headers={"Cookie": session_cookie(user)})

    assert (reply.status, reply.replayed) == (201, False)  # not 409 "in flight" until the effect expires
    assert CONTROL.runs == 1


def test_a_users_http_record_does_not_answer_a_once_key_spelled_like_it(client_: Client, django_user_model):
    user = django_user_model.objects.create_user("victim", password="pw")
    key = new_key()
    assert client_.send(PATH, BOOK, key=key, headers={"Cookie": session_cookie(user)}).status == 201
    runs: list[str] = []

    result = once(legacy_http_text(f"user:{user.pk}", key), lambda: runs.append("ran") or "mine", scope=SCOPE)

    assert (runs, result) == (["ran"], "mine")


text = st.lists(st.sampled_from(["a", "1", ":", "\x1f", "\x00", "http", "é", "\uffff"]), max_size=6).map("".join)


@given(st.tuples(text, text, text), st.tuples(text, text, text))
def test_different_scope_owner_and_key_never_share_an_http_hash(one, other):
    if one != other:
        assert http_key_hash(*one) != http_key_hash(*other)


@given(text, text, text, text)
def test_no_once_key_hashes_as_an_http_record(scope, owner, key, once_key):
    assert http_key_hash(scope, owner, key) != key_hash(scope, once_key)
    assert http_key_hash(scope, owner, key) != key_hash(scope, legacy_http_text(owner, key))
