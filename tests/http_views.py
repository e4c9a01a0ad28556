"""Views for tests/test_http_idempotency.py, served by a real HTTP server (the live server).

``create_order`` writes a shop order and enqueues its confirmation job keyed from the request's
idempotency key. Tests steer it through ``CONTROL``: a gate the view waits on (to keep a request
in flight), how many calls answer 503 first.
"""

from __future__ import annotations

import functools
import json
import threading
import uuid
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework import viewsets
from rest_framework.authentication import BasicAuthentication
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_workhorse import enqueue
from django_workhorse.http import idempotent
from example_project.shop.models import Order


class Control:
    """What the tests set for the next requests."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.failures = 0
        self.runs = 0
        self.lock = threading.Lock()
        self.statuses: list[int] = []


CONTROL = Control()


def _place(request: Any, data: dict[str, Any]) -> dict[str, Any]:
    with CONTROL.lock:
        CONTROL.runs += 1
    CONTROL.entered.set()
    if CONTROL.gate is not None:
        assert CONTROL.gate.wait(30), "the test never opened the gate"
    order = Order.objects.create(
        product=str(data.get("product", "book")), quantity=int(data.get("quantity", 1)), placement_token=uuid.uuid4()
    )
    # The payload comes from the request, not the new row: a run of the view for the same client
    # request (its record released) enqueues the same request under the same derived key.
    payload = {"product": order.product, "quantity": order.quantity}
    job_id = enqueue("tests.record", payload, idempotency=request.idempotency.job_idempotency("confirm"))
    return {"order": order.pk, "job": job_id, "key_digest": request.idempotency.key_digest}


def _fail_first() -> bool:
    with CONTROL.lock:
        if CONTROL.failures > 0:
            CONTROL.failures -= 1
            return True
    return False


@idempotent("tests.orders", anonymous=True)
def create_order(request: HttpRequest, shop: int | None = None) -> HttpResponse:
    data = json.loads(request.body or b"{}")
    placed = _place(request, data)
    if _fail_first():
        return JsonResponse({"error": "the provider is down"}, status=503)
    if data.get("status"):
        return JsonResponse({"refused": True}, status=int(data["status"]))
    response = JsonResponse(placed, status=201)
    response["Location"] = f"/orders/{placed['order']}/"
    response["Set-Cookie"] = "never-replayed=1"
    response["X-Request-Only"] = "not replayed"
    return response


@idempotent("tests.orders", wait=timedelta(seconds=30), anonymous=True)
def create_order_waiting(request: HttpRequest) -> HttpResponse:
    placed = _place(request, json.loads(request.body or b"{}"))
    if _fail_first():
        return JsonResponse({"error": "the provider is down"}, status=503)
    return JsonResponse(placed, status=201)


@idempotent("tests.orders", required=False, anonymous=True)
def create_order_key_optional(request: HttpRequest) -> HttpResponse:
    placed = _place(request, {}) if request.idempotency is not None else {"keyed": False}
    return JsonResponse(placed, status=201)


def tenant(request: HttpRequest) -> str:
    return "tenant:" + request.headers.get("X-Tenant", "none")


@idempotent("tests.orders", owner=tenant)
def create_order_per_tenant(request: HttpRequest) -> HttpResponse:
    return JsonResponse(_place(request, json.loads(request.body or b"{}")), status=201)


@idempotent("tests.orders")
def create_order_for_user(request: HttpRequest) -> HttpResponse:
    return JsonResponse(_place(request, json.loads(request.body or b"{}")), status=201)


@idempotent("tests.orders", anonymous=True)
def raise_after_writing(request: HttpRequest) -> HttpResponse:
    _place(request, {})
    raise RuntimeError("the view failed after writing")


@idempotent("tests.orders", anonymous=True)
def stream(request: HttpRequest) -> StreamingHttpResponse:
    _place(request, {})
    return StreamingHttpResponse(iter([b"a", b"b"]))


@idempotent("tests.orders", anonymous=True)
def large(request: HttpRequest) -> HttpResponse:
    _place(request, {})
    return HttpResponse(b"x" * int(request.GET["size"]), content_type="application/octet-stream")


def parse_form_first(view: Any) -> Any:
    """Read ``request.POST`` before the view, as CsrfViewMiddleware does (a multipart body is then parsed)."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        assert request.POST is not None
        return view(request, *args, **kwargs)

    return wrapped


@parse_form_first
@idempotent("tests.uploads", anonymous=True)
def upload(request: HttpRequest) -> HttpResponse:
    _place(request, {})
    uploaded = request.FILES["file"]
    return JsonResponse({"name": uploaded.name, "size": uploaded.size, "note": request.POST["note"]}, status=201)


@method_decorator(idempotent("tests.orders", anonymous=True), name="post")
class OrderView(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse({"orders": Order.objects.count()})

    def post(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse(_place(request, json.loads(request.body or b"{}")), status=201)


@api_view(["POST"])
@authentication_classes([BasicAuthentication])
@idempotent("tests.drf", anonymous=True)
def drf_create_order(request: Request) -> Response:
    return Response(_place(request, request.data), status=201)


@api_view(["POST"])
@idempotent("tests.drf", anonymous=True)
def drf_refuse(request: Request) -> Response:
    _place(request, request.data)
    raise ValidationError({"product": ["out of stock"]})  # DRF answers 400; the decorator sees the raise


class OrderViewSet(viewsets.ViewSet):
    authentication_classes = [BasicAuthentication]

    def list(self, request: Request) -> Response:
        return Response({"orders": Order.objects.count()})

    @idempotent("tests.drf")
    def create(self, request: Request) -> Response:
        placed = _place(request, request.data)
        return Response({**placed, "user": request.user.get_username()}, status=201)


# -- sealed responses (tests/test_encrypted_http.py) ---------------------------------------------------------

SEALED = "tests.sealed-orders"


def _sealed_reply(request: HttpRequest) -> HttpResponse:
    """An order whose response repeats the request's ``note`` in its body and in a replayed header."""
    data = json.loads(request.body or b"{}")
    placed = _place(request, data)
    if data.get("size"):
        return HttpResponse(b"x" * int(data["size"]), content_type="application/octet-stream")
    response = JsonResponse({**placed, "note": data.get("note")}, status=201)
    response["Location"] = f"/orders/{placed['order']}/"
    response["Link"] = f'</notes/{data.get("note")}>; rel="note"'
    response["Set-Cookie"] = "never-replayed=1"
    return response


@idempotent(SEALED, anonymous=True)
def sealed_by_setting(request: HttpRequest) -> HttpResponse:
    """Sealed when the setting lists its scope (or encrypts all)."""
    return _sealed_reply(request)


@functools.cache
def _sealed_by_argument() -> Any:
    # Decorated at the first request: encrypted=True needs WORKHORSE_ENCRYPTION when decorating,
    # and tests/settings.py leaves it unset.
    return idempotent(SEALED, anonymous=True, encrypted=True)(_sealed_reply)


def sealed_by_argument(request: HttpRequest) -> HttpResponse:
    return _sealed_by_argument()(request)  # type: ignore[no-any-return]


@idempotent(SEALED, anonymous=True, encrypted=False)
def never_sealed(request: HttpRequest) -> HttpResponse:
    return _sealed_reply(request)


# -- placements (tests/test_http_placement.py): BasicAuthentication + IsAuthenticated everywhere ------------

PLACEMENT = "tests.placement"


def _placed_for(request: Any) -> dict[str, Any]:
    return {**_place(request, dict(request.data)), "user": request.user.get_username()}


@api_view(["POST"])
@authentication_classes([BasicAuthentication])
@permission_classes([IsAuthenticated])
@idempotent(PLACEMENT)
def placed_below_api_view(request: Request) -> Response:
    return Response(_placed_for(request), status=201)


class PlacedOnHandler(APIView):
    authentication_classes = [BasicAuthentication]
    permission_classes = [IsAuthenticated]

    @idempotent(PLACEMENT)
    def post(self, request: Request) -> Response:
        return Response(_placed_for(request), status=201)


@method_decorator(idempotent(PLACEMENT), name="post")
class PlacedByMethodDecorator(APIView):
    authentication_classes = [BasicAuthentication]
    permission_classes = [IsAuthenticated]

    def post(self, request: Request) -> Response:
        return Response(_placed_for(request), status=201)


class PlacedOnViewSetAction(viewsets.ViewSet):
    authentication_classes = [BasicAuthentication]
    permission_classes = [IsAuthenticated]

    @idempotent(PLACEMENT)
    def create(self, request: Request) -> Response:
        return Response(_placed_for(request), status=201)


@method_decorator(idempotent(PLACEMENT), name="dispatch")
class PlacedOnDispatch(APIView):
    """The placement of the report: Django's request, before DRF authenticates (refused)."""

    authentication_classes = [BasicAuthentication]
    permission_classes = [IsAuthenticated]

    def post(self, request: Request) -> Response:
        return Response(_placed_for(request), status=201)


class PlacedOnDispatchInClassBody(APIView):
    authentication_classes = [BasicAuthentication]
    permission_classes = [IsAuthenticated]

    @idempotent(PLACEMENT)
    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return super().dispatch(request, *args, **kwargs)

    def post(self, request: Request) -> Response:
        return Response(_placed_for(request), status=201)


@method_decorator(idempotent(PLACEMENT), name="post")
class SessionOrderView(View):
    """A Django class-based view: the user is the session's (AuthenticationMiddleware)."""

    def post(self, request: HttpRequest) -> HttpResponse:
        placed = _place(request, json.loads(request.body or b"{}"))
        return JsonResponse({**placed, "user": request.user.get_username()}, status=201)


@idempotent(PLACEMENT)
def session_order(request: HttpRequest) -> HttpResponse:
    placed = _place(request, json.loads(request.body or b"{}"))
    return JsonResponse({**placed, "user": request.user.get_username()}, status=201)
