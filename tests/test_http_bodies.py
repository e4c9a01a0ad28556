"""What a request body is for ``@idempotent``: decoded before it is fingerprinted, and one meaning only.

Through the live server: a gzip body compressed again differently by a retry is the same request;
a JSON object with a key twice is refused (parsers disagree on which one counts); a body that
decodes past Django's upload limit is refused without being decoded further.
"""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from example_project.shop.models import Order
from tests.http_views import CONTROL
from tests.test_http_idempotency import Client, client_, http_records, new_key

__all__ = ["client_"]  # the live-server client fixture, shared with tests/test_http_idempotency.py

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/http/orders-optional/"  # anonymous=True; the view does not read the body
ORDER = json.dumps({"product": "book", "quantity": 2}).encode()


def deflated(data: bytes, level: int) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("first", "retry", "encoding"),
    [
        (gzip.compress(ORDER, compresslevel=1, mtime=0), gzip.compress(ORDER, compresslevel=9, mtime=123), "gzip"),
        (deflated(ORDER, 1), deflated(ORDER, 9), "deflate"),
    ],
    ids=["gzip", "deflate"],
)
def test_a_retry_compressed_differently_is_the_same_request(client_: Client, first, retry, encoding):
    assert first != retry
    key = new_key()
    one = client_.send(PATH, raw_body=first, key=key, headers={"Content-Encoding": encoding})
    two = client_.send(PATH, raw_body=retry, key=key, headers={"Content-Encoding": encoding})
    plain = client_.send(PATH, raw_body=ORDER, key=key)

    assert (one.status, two.status, two.replayed, two.body) == (201, 201, True, one.body)
    assert (plain.status, plain.replayed) == (201, True)  # the same JSON, not compressed
    assert Order.objects.count() == 1


def test_a_compressed_body_that_differs_once_decoded_is_another_request(client_: Client):
    key = new_key()
    client_.send(PATH, raw_body=gzip.compress(ORDER), key=key, headers={"Content-Encoding": "gzip"})
    other = gzip.compress(json.dumps({"product": "pen"}).encode())
    changed = client_.send(PATH, raw_body=other, key=key, headers={"Content-Encoding": "gzip"})

    assert (changed.status, changed.json["differing"]) == (422, ["body"])


def test_a_body_that_does_not_decode_as_it_says_is_fingerprinted_as_sent(client_: Client):
    key = new_key()
    one = client_.send(PATH, raw_body=b"not gzip", key=key, headers={"Content-Encoding": "gzip"})
    two = client_.send(PATH, raw_body=b"not gzip", key=key, headers={"Content-Encoding": "gzip"})

    assert (one.status, two.replayed) == (201, True)


def test_the_decoded_body_may_reach_the_upload_limit_and_not_one_byte_more(client_: Client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    at_limit = client_.send(
        PATH,
        raw_body=gzip.compress(b"x" * 4096),
        key=new_key(),
        headers={"Content-Encoding": "gzip"},
        content_type="application/octet-stream",
    )
    past = client_.send(
        PATH,
        raw_body=gzip.compress(b"x" * 4097),
        key=new_key(),
        headers={"Content-Encoding": "gzip"},
        content_type="application/octet-stream",
    )

    assert at_limit.status == 201
    assert (past.status, past.json["code"]) == (413, "idempotency-body-too-large")
    assert CONTROL.runs == 1 and len(http_records()) == 1


@pytest.mark.parametrize(
    "body",
    [b'{"p": 2, "p": 1}', b'{"order": {"quantity": 2, "quantity": 1}}', b'[{"a": 1}, {"b": 1, "b": 1}]'],
    ids=["top-level", "nested", "in-a-list"],
)
def test_a_json_body_with_a_key_twice_is_a_400_and_the_view_does_not_run(client_: Client, body):
    reply = client_.send(PATH, raw_body=body, key=new_key())

    assert (reply.status, reply.json["code"]) == (400, "idempotency-body-duplicate-keys")
    assert (CONTROL.runs, http_records()) == (0, [])


def test_the_same_key_in_different_objects_is_not_a_duplicate(client_: Client):
    reply = client_.send(PATH, raw_body=b'[{"p": 1}, {"p": 2}]', key=new_key())

    assert reply.status == 201
