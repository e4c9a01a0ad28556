"""The views ``benchmarks/http_idempotency.py`` measures: the same work with and without ``@idempotent``.

The work is what an order endpoint does: read a JSON body and the request's user, create a row (an
auth group named from them, standing in for the order) and enqueue a job, in one transaction.
"""

from __future__ import annotations

import json
import uuid

from django.contrib.auth.models import Group
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_workhorse import enqueue, register
from django_workhorse.http import idempotent

register("bench.confirm", lambda payload: None)


def _place(request: HttpRequest) -> JsonResponse:
    data = json.loads(request.body)
    user = getattr(request, "user", None)  # with the project stack, the session's user, as a real view reads it
    owner = user.pk if user is not None and user.is_authenticated else "anonymous"
    group = Group.objects.create(name=f"{data['product']}-{owner}-{uuid.uuid4().hex}")
    job_id = enqueue("bench.confirm", {"group": group.pk})
    return JsonResponse({"order": group.pk, "job": job_id}, status=201)


@csrf_exempt
def plain(request: HttpRequest) -> JsonResponse:
    with transaction.atomic():
        return _place(request)


@csrf_exempt
@idempotent("bench.orders")
def keyed(request: HttpRequest) -> JsonResponse:
    return _place(request)


urlpatterns = [path("plain/", plain), path("keyed/", keyed)]
