"""Where ``@idempotent`` may sit: a stored response is only ever replayed to the client whose it is.

Every placement docs/http-idempotency.md shows, and the ones it warns about, through the live
server with real DRF authentication (BasicAuthentication + IsAuthenticated) and Django sessions.
The warned placements see the request before authentication: they are refused, never served.
"""

from __future__ import annotations

import logging

import pytest
from django.utils.decorators import method_decorator
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from django_workhorse.exceptions import IdempotentViewError
from django_workhorse.http import idempotent
from example_project.shop.models import Order
from tests.http_views import CONTROL, PlacedOnHandler
from tests.test_http_idempotency import BOOK, Client, basic, client_, http_records, new_key, session_cookie

__all__ = ["client_"]  # the live-server client fixture, shared with tests/test_http_idempotency.py

pytestmark = pytest.mark.django_db(transaction=True)

DRF_PLACEMENTS = [
    "/http/placed/below-api-view/",
    "/http/placed/handler/",
    "/http/placed/method-decorator/",
    "/http/placed/viewset/",
]
DJANGO_PLACEMENTS = ["/http/placed/django-function/", "/http/placed/django-class/"]
REFUSED_PLACEMENTS = ["/http/placed/dispatch/", "/http/placed/dispatch-in-class-body/"]


@pytest.fixture
def users(django_user_model):
    return {name: django_user_model.objects.create_user(name, password="pw") for name in ("alice", "bob")}


@pytest.mark.parametrize("path", DRF_PLACEMENTS)
def test_a_drf_placement_the_docs_show_replays_only_to_the_same_user(client_: Client, users, path):
    key = "guessable-order-1"
    alice = client_.send(path, BOOK, key=key, headers=basic("alice"))
    alice_again = client_.send(path, BOOK, key=key, headers=basic("alice"))
    bob = client_.send(path, BOOK, key=key, headers=basic("bob"))
    nobody = client_.send(path, BOOK, key=key)

    assert (alice.status, alice.json["user"], alice_again.replayed, alice_again.body) == (
        201,
        "alice",
        True,
        alice.body,
    )
    assert (bob.status, bob.replayed, bob.json["user"]) == (201, False, "bob")
    assert nobody.status in (401, 403) and not nobody.replayed and b"alice" not in nobody.body
    assert Order.objects.count() == 2
    assert sorted(record.owner for record in http_records()) == sorted(f"user:{u.pk}" for u in users.values())


@pytest.mark.parametrize("path", DJANGO_PLACEMENTS)
def test_a_django_placement_replays_only_to_the_same_session_user(client_: Client, users, path):
    key = "guessable-order-1"
    alice = client_.send(path, BOOK, key=key, headers={"Cookie": session_cookie(users["alice"])})
    alice_again = client_.send(path, BOOK, key=key, headers={"Cookie": session_cookie(users["alice"])})
    bob = client_.send(path, BOOK, key=key, headers={"Cookie": session_cookie(users["bob"])})
    nobody = client_.send(path, BOOK, key=key)
    basic_alice = client_.send(path, BOOK, key=key, headers=basic("alice"))  # Django does not read Basic

    assert (alice.json["user"], alice_again.replayed, alice_again.body) == ("alice", True, alice.body)
    assert (bob.status, bob.replayed, bob.json["user"]) == (201, False, "bob")
    assert (nobody.status, nobody.json["code"]) == (403, "idempotency-owner-anonymous")
    assert (basic_alice.status, basic_alice.json["code"]) == (403, "idempotency-owner-unauthenticated")
    assert Order.objects.count() == 2 and CONTROL.runs == 2


@pytest.mark.parametrize("path", REFUSED_PLACEMENTS)
def test_a_placement_before_drf_authentication_is_refused_and_replays_nothing(client_: Client, users, path, caplog):
    key = "guessable-order-1"
    with caplog.at_level(logging.ERROR, logger="django.request"):
        replies = [
            client_.send(path, BOOK, key=key, headers=basic("alice")),
            client_.send(path, BOOK, key=key, headers=basic("bob")),
            client_.send(path, BOOK, key=key),
        ]

    assert [reply.status for reply in replies] == [500, 500, 500]
    assert not any(reply.replayed for reply in replies)
    assert (Order.objects.count(), http_records(), CONTROL.runs) == (0, [], 0)
    assert any("IdempotentViewError" in repr(record.exc_info) for record in caplog.records)


def test_decorating_a_drf_view_above_api_view_is_refused_at_decoration():
    def place(request):
        return Response(status=201)

    with pytest.raises(IdempotentViewError) as raised:
        idempotent("orders")(api_view(["POST"])(place))
    assert raised.value.field == "view" and "below @api_view" in str(raised.value)


def test_decorating_a_drf_view_class_or_its_as_view_is_refused_at_decoration():
    with pytest.raises(IdempotentViewError, match="DRF view"):
        idempotent("orders")(PlacedOnHandler.as_view())
    with pytest.raises(IdempotentViewError, match="method_decorator"):
        idempotent("orders")(PlacedOnHandler)


def test_method_decorator_on_dispatch_is_refused_before_the_view_runs():
    @method_decorator(idempotent("orders"), name="dispatch")
    class Keyed(APIView):
        def post(self, request):
            raise AssertionError("never reached")

    from django.test import RequestFactory

    with pytest.raises(IdempotentViewError, match="Keyed.dispatch"):
        Keyed.as_view()(RequestFactory().post("/", b"{}", content_type="application/json"))


# -- the anonymous owner ----------------------------------------------------------------------------------


def test_an_anonymous_record_is_never_replayed_to_a_request_with_credentials(client_: Client, users):
    key = new_key()  # /http/orders/ opted in to anonymous owners (anonymous=True)
    first = client_.send("/http/orders/", BOOK, key=key)
    again = client_.send("/http/orders/", BOOK, key=key)
    with_credentials = client_.send("/http/orders/", BOOK, key=key, headers=basic("alice"))
    bearer = client_.send("/http/orders/", BOOK, key=key, headers={"Authorization": "Bearer guess"})

    assert (first.status, again.replayed) == (201, True)
    for reply in (with_credentials, bearer):
        assert (reply.status, reply.replayed, reply.json["code"]) == (403, False, "idempotency-owner-unauthenticated")
    assert Order.objects.count() == 1


def test_without_the_opt_in_an_anonymous_keyed_request_is_refused_and_the_view_does_not_run(client_: Client):
    reply = client_.send("/http/orders-for-user/", BOOK, key=new_key())

    assert (reply.status, reply.json["code"], reply.replayed) == (403, "idempotency-owner-anonymous", False)
    assert (CONTROL.runs, http_records()) == (0, [])


@pytest.mark.parametrize(
    ("arguments", "field"), [({"anonymous": 1}, "anonymous"), ({"anonymous": True, "owner": str}, "anonymous")]
)
def test_the_anonymous_opt_in_is_held_to_its_bounds(arguments, field):
    with pytest.raises(IdempotentViewError) as raised:
        idempotent("orders", **arguments)
    assert raised.value.field == field
    assert callable(idempotent("orders", anonymous=True)(lambda request: None))
