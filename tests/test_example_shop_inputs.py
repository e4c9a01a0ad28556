"""The example shop's webhook receiver against hostile requests: each is a 400 that writes nothing.

The delivery id is matched whole (a trailing newline is another id, and refused), and a body that
is not UTF-8, not a JSON object, holds what PostgreSQL cannot store, nests too deep or is too big
never reaches the database.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from django_workhorse.models import Job
from example_project.shop.models import WebhookDelivery
from example_project.shop.views import MAX_WEBHOOK_BODY_BYTES

pytestmark = [pytest.mark.django_db, pytest.mark.urls("example_project.urls")]


def post_raw(client: Client, raw: bytes | str) -> int:
    response = client.post(reverse("provider-webhook"), raw, content_type="application/json")
    if response.status_code == 400:
        assert "error" in response.json()
    return response.status_code


def nothing_written() -> bool:
    return not Job.objects.exists() and not WebhookDelivery.objects.exists()


def with_id(rest: str) -> str:
    return '{"delivery_id": "evt_1", ' + rest + "}"


BAD_IDS = ["evt_1\n", "evt_1\r\n", "\nevt_1", " evt_1", "evt_1 ", "evt_\x00", "evt_١", "évt", "", "e" * 101, "evt 1"]


@pytest.mark.parametrize("delivery_id", BAD_IDS, ids=repr)
def test_a_delivery_id_must_match_whole(client, delivery_id):
    assert post_raw(client, json.dumps({"delivery_id": delivery_id, "type": "invoice.paid"})) == 400
    assert nothing_written()


@pytest.mark.parametrize("delivery_id", BAD_IDS, ids=repr)
def test_the_demo_form_refuses_a_delivery_id_that_does_not_match_whole(client, delivery_id):
    data = {"delivery_id": delivery_id, "event_type": "invoice.paid", "times": 1}

    assert client.post(reverse("webhooks"), data).status_code == 400
    assert nothing_written()


HOSTILE_BODIES = {
    "invalid UTF-8": b'{"delivery_id": "evt_1", "type": "\xff\xfe"}',
    "a lone surrogate's UTF-8 form": b'{"delivery_id": "evt_1", "type": "\xed\xa0\x80"}',
    "UTF-16": '{"delivery_id": "evt_1"}'.encode("utf-16"),
    "a byte order mark": b'\xef\xbb\xbf{"delivery_id": "evt_1"}',
    "NUL escaped in a value": with_id(r'"type": "a\u0000b"'),
    "NUL escaped in a nested key": with_id(r'"data": {"ok": [{"\u0000": 1}]}'),
    "a raw NUL": b'{"delivery_id": "evt_1", "type": "a\x00b"}',
    "a lone surrogate escape": with_id(r'"type": "\ud800"'),
    "a lone low surrogate in a key": with_id(r'"\udfff": 1'),
    "NaN": with_id('"amount": NaN'),
    "Infinity": with_id('"amount": -Infinity'),
    "a number beyond float": with_id('"amount": 1e400'),
    "an int of 5000 digits": with_id('"amount": ' + "9" * 5000),
    "nested 150 deep": with_id('"data": ' + "[" * 150 + "]" * 150),
    "nested 30000 deep": with_id('"data": ' + "[" * 30_000 + "]" * 30_000),
    "too big": with_id('"data": "' + "x" * MAX_WEBHOOK_BODY_BYTES + '"'),
    "an array": '[{"delivery_id": "evt_1"}]',
    "a string": '"evt_1"',
    "a number": "7",
    "null": "null",
    "true": "true",
    "empty": "",
    "not JSON": "delivery_id=evt_1",
    "truncated": '{"delivery_id": "evt_1"',
}


@pytest.mark.parametrize("raw", list(HOSTILE_BODIES.values()), ids=list(HOSTILE_BODIES))
def test_a_hostile_body_is_a_400_that_writes_nothing(client, raw):
    assert post_raw(client, raw) == 400
    assert nothing_written()


def test_a_body_beyond_what_django_reads_is_a_400_that_writes_nothing(client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * MAX_WEBHOOK_BODY_BYTES

    assert post_raw(client, with_id('"data": "' + "x" * 3 * MAX_WEBHOOK_BODY_BYTES + '"')) == 400
    assert nothing_written()


def test_a_storable_odd_body_is_accepted_and_stored_as_sent(client):
    body = {
        "delivery_id": "evt_odd",
        "type": "<b>invoice.paid</b>",
        "data": {"note": "\u202eRTL 🐎 \x01", "n": [[[1]]]},
    }

    assert post_raw(client, json.dumps(body)) == 202
    assert WebhookDelivery.objects.get().body == body
    assert Job.objects.count() == 1
