"""@idempotent views through a real HTTP server (Django's live server) and a real HTTP client.

Every request goes over a socket to the threaded live server, whose request threads each have their
own database connection; concurrency is real concurrent requests.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import Permission
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection

from django_workhorse import conf
from django_workhorse.exceptions import IdempotentViewError
from django_workhorse.http import RequestIdempotency, idempotency_of, idempotent
from django_workhorse.models import EffectRecord, Job
from django_workhorse.operations.actions import release_effects
from example_project.shop.models import Order
from tests.http_views import CONTROL
from tests.test_admin import action_choices, confirm, post_action
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ORDERS = "/http/orders/"
BOOK = {"product": "book", "quantity": 2}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotent-replayed") == "true"


class Client:
    """A plain HTTP/1.1 client on its own connection per request."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "localhost", parts.port or 80

    def send(
        self,
        path: str,
        body: Any = BOOK,
        *,
        key: str | None = None,
        header: str | None = None,
        method: str = "POST",
        headers: dict[str, str] | None = None,
        raw_body: bytes | None = None,
        content_type: str = "application/json",
    ) -> Reply:
        data = raw_body if raw_body is not None else (json.dumps(body).encode() if body is not None else b"")
        sent = {"Content-Type": content_type, **(headers or {})}
        if header is not None:
            sent["Idempotency-Key"] = header
        elif key is not None:
            sent["Idempotency-Key"] = f'"{key}"'
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request(method, path, body=data, headers=sent)
            response = conn.getresponse()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
        finally:
            conn.close()

    def send_and_drop(self, path: str, body: Any, *, key: str) -> None:
        """Send a request and close the connection without reading the response (a lost response)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        data = json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json", "Idempotency-Key": key})
        conn.close()


@pytest.fixture
def client_(live_server) -> Client:
    CONTROL.reset()
    yield Client(live_server.url)
    if CONTROL.gate is not None:
        CONTROL.gate.set()
    CONTROL.reset()


def new_key() -> str:
    return f"k-{uuid.uuid4()}"


def claim_statements_in_transaction() -> int:
    """Requests that ran the claim and now sit in their transaction (polling for a running request)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle in transaction' AND query LIKE %s",
            ["%workhorse_http_claim%"],
        )
        return int(cursor.fetchone()[0])


def http_records() -> list[EffectRecord]:
    return list(EffectRecord.objects.filter(kind="http").order_by("id"))


# -- one key, one answer -----------------------------------------------------------------------------------


def test_32_concurrent_requests_with_one_key_make_one_order_and_one_job_and_get_one_answer(client_):
    key = new_key()
    CONTROL.gate = threading.Event()
    replies: list[Reply | BaseException] = [None] * 32  # type: ignore[list-item]

    def send(i: int) -> None:
        try:
            replies[i] = client_.send("/http/orders-waiting/", BOOK, key=key)
        except BaseException as exc:  # reported by the assertions below
            replies[i] = exc

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(32)]
    for thread in threads:
        thread.start()
    try:
        # One request runs the view (held at the gate); the 31 others poll for it in their transactions.
        wait_for(CONTROL.entered.is_set, what="the first request to enter the view")
        wait_for(lambda: claim_statements_in_transaction() >= 31, timeout=30, what="31 requests waiting on the key")
    finally:  # a failure must not leave 32 requests in their transactions for the next tests
        CONTROL.gate.set()
        for thread in threads:
            thread.join(60)

    assert all(isinstance(reply, Reply) for reply in replies), replies
    assert {reply.status for reply in replies} == {201}
    assert len({reply.body for reply in replies}) == 1
    assert sum(not reply.replayed for reply in replies) == 1
    assert (Order.objects.count(), Job.objects.count(), CONTROL.runs) == (1, 1, 1)
    assert len(http_records()) == 1


def test_a_retry_after_the_first_response_was_lost_gets_the_stored_response(client_):
    key = new_key()
    client_.send_and_drop(ORDERS, BOOK, key=f'"{key}"')
    wait_for(lambda: EffectRecord.objects.filter(kind="http", completed_at__isnull=False).exists(), what="the record")

    retry = client_.send(ORDERS, BOOK, key=key)

    order = Order.objects.get()
    assert (retry.status, retry.replayed) == (201, True)
    assert retry.json["order"] == order.pk
    assert retry.headers["content-type"] == "application/json"
    assert retry.headers["location"] == f"/orders/{order.pk}/"
    assert "set-cookie" not in retry.headers and "x-request-only" not in retry.headers
    assert (Order.objects.count(), Job.objects.count(), CONTROL.runs) == (1, 1, 1)


def test_the_first_answer_is_not_marked_replayed_and_a_replay_is_byte_identical(client_):
    key = new_key()
    first = client_.send(ORDERS, BOOK, key=key)
    second = client_.send(ORDERS, BOOK, key=key)

    assert (first.status, first.replayed, second.status, second.replayed) == (201, False, 201, True)
    assert first.body == second.body
    assert first.headers["location"] == second.headers["location"]


def test_the_json_body_is_compared_canonically(client_):
    key = new_key()
    first = client_.send(ORDERS, key=key, raw_body=b'{"product": "book", "quantity": 2}')
    second = client_.send(
        ORDERS, key=key, raw_body=b'{"quantity":2,"product":"book"}', content_type="application/json; charset=utf-8"
    )

    assert (first.status, second.status, second.replayed) == (201, 201, True)


# -- the same key for another request ------------------------------------------------------------------------


def test_a_changed_body_is_refused_with_422_naming_the_body_and_not_echoing_it(client_):
    key = new_key()
    client_.send(ORDERS, BOOK, key=key)
    secret = "a-very-distinctive-product-name"

    changed = client_.send(ORDERS, {"product": secret, "quantity": 2}, key=key)

    assert changed.status == 422
    assert changed.headers["content-type"] == "application/problem+json"
    problem = changed.json
    assert (problem["status"], problem["code"], problem["differing"]) == (422, "idempotency-key-reused", ["body"])
    assert problem["title"] == "Unprocessable Content"
    assert secret.encode() not in changed.body and key.encode() not in changed.body
    assert (Order.objects.count(), CONTROL.runs) == (1, 1)


def test_a_changed_path_is_refused_with_422_naming_route_and_arguments(client_):
    key = new_key()
    client_.send(ORDERS, BOOK, key=key)

    other_route = client_.send("/http/orders/7/", BOOK, key=key)

    assert other_route.status == 422 and other_route.json["differing"] == ["route", "arguments"]
    client_.send("/http/orders/8/", BOOK, key=(second := new_key()))
    other_argument = client_.send("/http/orders/9/", BOOK, key=second)
    assert other_argument.status == 422 and other_argument.json["differing"] == ["arguments"]


def test_a_changed_query_or_content_type_is_refused_naming_it(client_):
    key = new_key()
    client_.send(ORDERS + "?b=2&a=1", BOOK, key=key)

    same_query = client_.send(ORDERS + "?a=1&b=2", BOOK, key=key)
    other_query = client_.send(ORDERS + "?a=1&b=3", BOOK, key=key)
    other_type = client_.send(
        ORDERS + "?a=1&b=2", key=key, raw_body=json.dumps(BOOK).encode(), content_type="text/plain"
    )

    assert (same_query.status, same_query.replayed) == (201, True)
    assert other_query.json["differing"] == ["query"]
    assert other_type.json["differing"] == ["content_type", "body"]


def multipart(boundary: str, content: bytes, note: str = "hello") -> tuple[bytes, str]:
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="note"\r\n\r\n{note}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n'
            "Content-Type: text/plain\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


def test_a_multipart_body_is_compared_by_its_fields_and_files_not_its_boundary(client_):
    key = new_key()
    first_body, first_type = multipart("boundary-one", b"file content")
    again_body, again_type = multipart("another-boundary", b"file content")
    changed_body, changed_type = multipart("boundary-one", b"other content")

    first = client_.send("/http/upload/", key=key, raw_body=first_body, content_type=first_type)
    again = client_.send("/http/upload/", key=key, raw_body=again_body, content_type=again_type)
    changed = client_.send("/http/upload/", key=key, raw_body=changed_body, content_type=changed_type)

    assert (first.status, first.json["size"], first.json["note"]) == (201, 12, "hello")
    assert (again.status, again.replayed) == (201, True)
    assert changed.status == 422 and changed.json["differing"] == ["body"]
    assert CONTROL.runs == 1


# -- in flight ------------------------------------------------------------------------------------------------


def test_a_request_while_the_first_still_runs_gets_409_with_retry_after(client_):
    key = new_key()
    CONTROL.gate = threading.Event()
    first: list[Reply] = []
    running = threading.Thread(target=lambda: first.append(client_.send(ORDERS, BOOK, key=key)), daemon=True)
    running.start()
    wait_for(CONTROL.entered.is_set, what="the first request to enter the view")

    busy = client_.send(ORDERS, BOOK, key=key)

    assert busy.status == 409 and busy.headers["retry-after"] == "1"
    assert busy.json["code"] == "idempotency-key-in-flight"
    CONTROL.gate.set()
    running.join(30)
    assert first[0].status == 201
    after = client_.send(ORDERS, BOOK, key=key)
    assert (after.status, after.replayed, after.body) == (201, True, first[0].body)
    assert (Order.objects.count(), CONTROL.runs) == (1, 1)


def first_and_waiting_requests(client_: Client, key: str) -> tuple[Reply, Reply]:
    """Send a first request to the view with ``wait`` (held at the gate), then a second with the same
    key once the first is in the view; open the gate once the second waits on the key."""
    CONTROL.gate = threading.Event()
    replies: dict[str, Reply] = {}

    def send(name: str) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: replies.update({name: client_.send("/http/orders-waiting/", BOOK, key=key)}), daemon=True
        )
        thread.start()
        return thread

    running = send("first")
    wait_for(CONTROL.entered.is_set, what="the first request to enter the view")
    waiting = send("second")
    wait_for(lambda: claim_statements_in_transaction() >= 1, what="the second request to wait on the key")
    CONTROL.gate.set()
    running.join(30)
    waiting.join(30)
    return replies["first"], replies["second"]


def test_with_wait_a_request_while_the_first_runs_gets_its_response(client_):
    first, second = first_and_waiting_requests(client_, new_key())

    assert (first.status, first.replayed) == (201, False)
    assert (second.status, second.replayed, second.body) == (201, True, first.body)
    assert (Order.objects.count(), CONTROL.runs) == (1, 1)


def test_with_wait_a_request_whose_first_rolled_back_runs_the_view_itself(client_):
    CONTROL.failures = 1  # the first request answers 503: nothing of it is stored

    first, second = first_and_waiting_requests(client_, new_key())

    assert first.status == 503
    assert (second.status, second.replayed) == (201, False)
    assert (Order.objects.count(), Job.objects.count(), CONTROL.runs) == (1, 1, 2)


def test_32_concurrent_requests_with_one_key_and_no_wait_run_the_view_once(client_):
    key = new_key()
    CONTROL.gate = threading.Event()
    replies: list[Any] = [None] * 32

    def send(i: int) -> None:
        try:
            replies[i] = client_.send(ORDERS, BOOK, key=key)
        except BaseException as exc:  # reported by the assertions below
            replies[i] = exc

    first = threading.Thread(target=send, args=(0,), daemon=True)
    first.start()
    wait_for(CONTROL.entered.is_set, what="the first request to enter the view")
    others = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(1, 32)]
    for thread in others:
        thread.start()
    for thread in others:
        thread.join(60)
    CONTROL.gate.set()
    first.join(60)

    assert all(isinstance(reply, Reply) for reply in replies), replies
    assert (replies[0].status, replies[0].replayed) == (201, False)
    busy = [reply for reply in replies[1:] if reply.status == 409]
    assert len(busy) == 31 and all(reply.headers["retry-after"] == "1" for reply in busy)
    assert (Order.objects.count(), Job.objects.count(), CONTROL.runs) == (1, 1, 1)


# -- what is not stored ---------------------------------------------------------------------------------------


def test_a_5xx_stores_nothing_rolls_the_view_back_and_the_retry_runs_the_view_again(client_):
    key = new_key()
    CONTROL.failures = 1

    failed = client_.send(ORDERS, BOOK, key=key)

    assert failed.status == 503
    assert (Order.objects.count(), Job.objects.count(), http_records()) == (0, 0, [])
    retried = client_.send(ORDERS, BOOK, key=key)
    assert (retried.status, retried.replayed) == (201, False)
    assert (Order.objects.count(), Job.objects.count(), CONTROL.runs) == (1, 1, 2)


def test_a_view_that_raises_stores_nothing_and_its_writes_roll_back(client_):
    key = new_key()

    failed = client_.send("/http/raises/", None, key=key)
    again = client_.send("/http/raises/", None, key=key)

    assert (failed.status, again.status) == (500, 500)
    assert (Order.objects.count(), http_records(), CONTROL.runs) == (0, [], 2)


@pytest.mark.parametrize("status", [409, 429])
def test_a_409_or_429_from_the_view_is_not_stored(client_, status):
    key = new_key()

    first = client_.send(ORDERS, {**BOOK, "status": status}, key=key)
    second = client_.send(ORDERS, {**BOOK, "status": status}, key=key)

    assert (first.status, second.status, second.replayed) == (status, status, False)
    assert (Order.objects.count(), http_records(), CONTROL.runs) == (0, [], 2)


@pytest.mark.parametrize("status", [200, 302, 400, 404, 422])
def test_2xx_3xx_and_other_4xx_are_stored_and_replayed(client_, status):
    key = new_key()

    first = client_.send(ORDERS, {**BOOK, "status": status}, key=key)
    second = client_.send(ORDERS, {**BOOK, "status": status}, key=key)

    assert (first.status, second.status, second.replayed) == (status, status, True)
    assert (Order.objects.count(), CONTROL.runs, len(http_records())) == (1, 1, 1)


def test_a_streaming_response_is_refused_and_the_key_stays_free(client_):
    key = new_key()

    refused = client_.send("/http/stream/", None, key=key)

    assert refused.status == 500
    assert (Order.objects.count(), http_records()) == (0, [])


def test_a_response_at_the_storage_bound_is_stored_and_one_byte_more_is_refused(client_, settings):
    settings.WORKHORSE_IDEMPOTENT_RESPONSE_MAX_BYTES = 2048

    at_bound = client_.send("/http/large/?size=2048", None, key=new_key())
    over = client_.send("/http/large/?size=2049", None, key=new_key())

    assert at_bound.status == 200 and len(at_bound.body) == 2048
    assert over.status == 500
    assert [len(bytes(record.response_body)) for record in http_records()] == [2048]
    assert Order.objects.count() == 1


# -- owners ---------------------------------------------------------------------------------------------------


def test_two_owners_with_the_same_key_are_independent(client_):
    key = new_key()
    path = "/http/orders-per-tenant/"

    alpha = client_.send(path, BOOK, key=key, headers={"X-Tenant": "alpha"})
    beta = client_.send(path, {"product": "pen"}, key=key, headers={"X-Tenant": "beta"})
    alpha_again = client_.send(path, BOOK, key=key, headers={"X-Tenant": "alpha"})

    assert (alpha.replayed, beta.replayed, alpha_again.replayed) == (False, False, True)
    assert beta.status == 201 and alpha.json["order"] != beta.json["order"]
    assert alpha_again.body == alpha.body
    assert sorted(record.owner for record in http_records()) == ["tenant:alpha", "tenant:beta"]


def session_cookie(user: Any) -> str:
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.save()
    return f"sessionid={session.session_key}"


def test_the_default_owner_is_the_authenticated_user(client_, django_user_model):
    ann = django_user_model.objects.create_user("ann", password="pw")
    bob = django_user_model.objects.create_user("bob", password="pw")
    key = new_key()
    path = "/http/orders-for-user/"

    as_ann = client_.send(path, BOOK, key=key, headers={"Cookie": session_cookie(ann)})
    as_bob = client_.send(path, BOOK, key=key, headers={"Cookie": session_cookie(bob)})
    anonymous = client_.send(path, BOOK, key=key)
    ann_again = client_.send(path, BOOK, key=key, headers={"Cookie": session_cookie(ann)})

    assert [r.replayed for r in (as_ann, as_bob, anonymous, ann_again)] == [False, False, False, True]
    assert len({as_ann.json["order"], as_bob.json["order"]}) == 2
    assert (anonymous.status, anonymous.json["code"]) == (403, "idempotency-owner-anonymous")  # no opt-in
    owners = sorted(record.owner for record in http_records())
    assert owners == sorted([f"user:{ann.pk}", f"user:{bob.pk}"])


# -- the key header -------------------------------------------------------------------------------------------


def test_a_missing_key_is_a_400_problem_unless_the_key_is_optional(client_):
    missing = client_.send(ORDERS, BOOK)
    optional = client_.send("/http/orders-optional/", BOOK)

    assert missing.status == 400 and missing.headers["content-type"] == "application/problem+json"
    assert missing.json["code"] == "idempotency-key-missing"
    assert (optional.status, optional.json) == (201, {"keyed": False})
    assert Order.objects.count() == 0


@pytest.mark.parametrize(
    "header",
    ['"unterminated', "a,b", '"a";p=1', '"a", "b"', "two words", '"tab\there"', '""', "é", '"\\n"'],
    ids=["unterminated", "list", "parameters", "two strings", "space", "control", "empty", "non-ascii", "bad escape"],
)
def test_a_malformed_key_is_a_400_problem(client_, header):
    reply = client_.send(ORDERS, BOOK, header=header.encode("utf-8").decode("latin-1"))

    assert reply.status == 400 and reply.json["code"] == "idempotency-key-malformed"
    assert Order.objects.count() == 0


def test_a_bare_token_and_its_quoted_form_are_the_same_key(client_):
    quoted = client_.send(ORDERS, BOOK, header='"abc-123:x/y"')
    bare = client_.send(ORDERS, BOOK, header="abc-123:x/y")
    escaped = client_.send(ORDERS, BOOK, header='"say \\"hi\\" \\\\ there"')

    assert (quoted.replayed, bare.replayed, escaped.status, escaped.replayed) == (False, True, 201, False)


def test_a_key_of_the_largest_size_passes_and_one_character_more_is_refused(client_):
    largest = "k" * conf.MAX_KEY_BYTES

    at_bound = client_.send(ORDERS, BOOK, header=f'"{largest}"')
    over = client_.send(ORDERS, BOOK, header=f'"{largest}k"')

    assert at_bound.status == 201
    assert over.status == 400 and str(conf.MAX_KEY_BYTES) in over.json["detail"]


def test_methods_that_are_not_keyed_run_the_view_as_is(client_):
    listing = client_.send("/http/class/orders/", None, method="GET")
    created = client_.send("/http/class/orders/", BOOK, key=(key := new_key()))
    replayed = client_.send("/http/class/orders/", BOOK, key=key)

    assert (listing.status, listing.json) == (200, {"orders": 0})
    assert (created.status, replayed.replayed) == (201, True)


# -- DRF ------------------------------------------------------------------------------------------------------


def basic(user: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:pw".encode()).decode()}


def test_a_drf_viewset_create_is_idempotent_per_authenticated_user(client_, django_user_model):
    django_user_model.objects.create_user("ann", password="pw")
    django_user_model.objects.create_user("bob", password="pw")
    key = new_key()
    path = "/http/drf/orders/"

    ann = client_.send(path, BOOK, key=key, headers=basic("ann"))
    ann_again = client_.send(path, BOOK, key=key, headers=basic("ann"))
    bob = client_.send(path, BOOK, key=key, headers=basic("bob"))
    ann_changed = client_.send(path, {"product": "pen"}, key=key, headers=basic("ann"))

    assert (ann.status, ann.json["user"], ann_again.replayed, ann_again.body) == (201, "ann", True, ann.body)
    assert ann_again.headers["content-type"] == "application/json"
    assert (bob.status, bob.replayed, bob.json["user"]) == (201, False, "bob")
    assert ann_changed.status == 422 and ann_changed.json["differing"] == ["body"]
    assert Order.objects.count() == 2


def test_a_drf_api_view_is_idempotent(client_):
    key = new_key()
    first = client_.send("/http/drf/create-order/", BOOK, key=key)
    again = client_.send("/http/drf/create-order/", BOOK, key=key)

    assert (first.status, again.status, again.replayed, again.body) == (201, 201, True, first.body)
    assert Order.objects.count() == 1


def test_a_drf_exception_is_answered_by_drf_and_nothing_is_stored(client_):
    key = new_key()
    first = client_.send("/http/drf/refuse/", BOOK, key=key)
    again = client_.send("/http/drf/refuse/", BOOK, key=key)

    assert (first.status, first.json, again.status, again.replayed) == (400, {"product": ["out of stock"]}, 400, False)
    assert (Order.objects.count(), http_records(), CONTROL.runs) == (0, [], 2)


# -- one key end to end, and what is stored -------------------------------------------------------------------


def test_the_job_key_derived_from_the_request_stays_the_same_when_the_view_runs_again(client_):
    key = new_key()
    first = client_.send(ORDERS, BOOK, key=key)
    release_effects([record.pk for record in http_records()])

    again = client_.send(ORDERS, BOOK, key=key)

    assert (again.status, again.replayed) == (201, False)  # released: the view ran again
    assert again.json["order"] != first.json["order"]
    assert again.json["job"] == first.json["job"]  # the same job: its key comes from the client's key
    assert Job.objects.count() == 1


def test_the_raw_key_is_in_no_table(client_):
    key = "raw-key-" + uuid.uuid4().hex
    client_.send(ORDERS, BOOK, key=key)
    client_.send(ORDERS, BOOK, key=key)
    client_.send(ORDERS, {"product": "pen"}, key=key)

    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = [row[0] for row in cursor.fetchall()]
        found = []
        for table in tables:
            cursor.execute(
                f'SELECT count(*) FROM "{table}" AS t WHERE strpos(t::text, %s) > 0 OR strpos(t::text, %s) > 0',
                [key, key.encode().hex()],
            )
            if cursor.fetchone()[0]:
                found.append(table)
    assert found == []
    record = EffectRecord.objects.get(kind="http")
    assert record.key_preview == key[:8] + "…" + key[-4:]


# -- decoration -----------------------------------------------------------------------------------------------


def view(request: Any) -> Any:
    return None


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"scope": ""}, "scope"),
        ({"scope": "s" * (conf.MAX_SCOPE_BYTES + 1)}, "scope"),
        ({"ttl": timedelta(0)}, "ttl"),
        ({"ttl": conf.MAX_KEY_TTL + timedelta(microseconds=1)}, "ttl"),
        ({"wait": 60.000001}, "wait"),
        ({"wait": -1}, "wait"),
        ({"wait": True}, "wait"),
        ({"methods": ("GET",)}, "methods"),
        ({"methods": "POST"}, "methods"),
        ({"methods": ()}, "methods"),
        ({"owner": "user"}, "owner"),
        ({"required": 1}, "required"),
        ({"using": "nowhere"}, "using"),
    ],
)
def test_decoration_refuses_arguments_out_of_bounds(arguments, field):
    with pytest.raises(IdempotentViewError) as raised:
        idempotent(**{"scope": "orders", **arguments})(view)
    assert raised.value.field == field


def test_decoration_accepts_arguments_at_their_bounds():
    for arguments in (
        {"scope": "s" * conf.MAX_SCOPE_BYTES},
        {"ttl": conf.MIN_KEY_TTL},
        {"ttl": conf.MAX_KEY_TTL},
        {"wait": 60},
        {"wait": timedelta(seconds=60)},
        {"methods": ("POST", "PUT", "PATCH", "DELETE")},
        {"using": "other"},
    ):
        assert callable(idempotent(**{"scope": "orders", **arguments})(view))


def test_decoration_refuses_an_async_view():
    async def async_view(request: Any) -> Any:
        return None

    with pytest.raises(IdempotentViewError) as raised:
        idempotent("orders")(async_view)
    assert raised.value.field == "view"


# -- the ledger admin -----------------------------------------------------------------------------------------

LEDGER = "/admin/workhorse/effectrecord/"


def staff(django_user_model: Any, name: str, *codenames: str) -> Any:
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="workhorse", codename__in=codenames))
    return user


def test_the_ledger_admin_lists_records_and_releases_only_with_the_permission(client_, client, django_user_model):
    key = new_key()
    client_.send(ORDERS, BOOK, key=key)
    record = EffectRecord.objects.get(kind="http")

    client.force_login(staff(django_user_model, "viewer", "view_effectrecord"))
    listing = client.get(LEDGER)
    page = listing.content.decode()
    assert listing.status_code == 200
    assert record.key_digest in page and "anonymous" in page and "tests.orders" in page and key not in page
    assert "release" not in action_choices(listing)
    forged = post_action(client, LEDGER, "release", [record.pk], confirmed="yes", request_id=uuid.uuid4().hex)
    assert forged.status_code in (200, 302) and EffectRecord.objects.filter(pk=record.pk).exists()
    detail = client.get(f"{LEDGER}{record.pk}/change/")
    size = len(bytes(EffectRecord.objects.get(pk=record.pk).response_body))
    assert detail.status_code == 200 and f"{size} bytes (not shown)" in detail.content.decode()

    client.force_login(staff(django_user_model, "releaser", "view_effectrecord", "release_effect"))
    assert "release" in action_choices(client.get(LEDGER))
    preview = post_action(client, LEDGER, "release", [record.pk])
    assert preview.status_code == 200 and record.key_digest in preview.content.decode()
    assert EffectRecord.objects.filter(pk=record.pk).exists()  # not before the confirmation
    done = confirm(client, LEDGER, preview)
    assert "Released 1 entry" in done.content.decode()
    assert not EffectRecord.objects.filter(pk=record.pk).exists()
    again = client_.send(ORDERS, BOOK, key=key)
    assert (again.status, again.replayed, CONTROL.runs) == (201, False, 2)  # released: the view runs again

    client.force_login(staff(django_user_model, "nobody"))
    assert client.get(LEDGER).status_code == 403


def test_idempotency_of_is_the_request_idempotency_or_none():
    class Request:
        pass

    keyed, plain = Request(), Request()
    keyed.idempotency = RequestIdempotency(key="secret-key-123456", scope="s", owner="o")  # type: ignore[attr-defined]
    assert idempotency_of(keyed) is keyed.idempotency  # type: ignore[attr-defined]
    assert idempotency_of(plain) is None
    assert "secret-key-123456" not in repr(keyed.idempotency)  # type: ignore[attr-defined]
    assert keyed.idempotency.job_key("a") != keyed.idempotency.job_key("b")  # type: ignore[attr-defined]


# -- inside the caller's transaction (ATOMIC_REQUESTS, or a view's own atomic block) --------------------------


def test_inside_an_outer_transaction_a_5xx_rolls_back_only_the_view_and_the_outer_work_stays():
    from django.db import transaction
    from django.test import RequestFactory

    from tests.http_views import create_order

    CONTROL.reset()
    CONTROL.failures = 1
    request = RequestFactory().post(ORDERS, json.dumps(BOOK), content_type="application/json")
    request.META["HTTP_IDEMPOTENCY_KEY"] = '"outer-1"'
    with transaction.atomic():
        outer = Order.objects.create(product="outer", quantity=1, placement_token=uuid.uuid4())
        failed = create_order(request)
        replay_free = create_order(request)  # the key is free: the view runs, and is stored
        again = create_order(request)
        assert Order.objects.filter(pk=outer.pk).exists()
    assert (failed.status_code, replay_free.status_code, again.status_code) == (503, 201, 201)
    assert again["Idempotent-Replayed"] == "true" and not replay_free.has_header("Idempotent-Replayed")
    assert sorted(Order.objects.values_list("product", flat=True)) == ["book", "outer"]
    assert CONTROL.runs == 2
    CONTROL.reset()


def keyed_request(header: str) -> Any:
    from django.test import RequestFactory

    request = RequestFactory().post(ORDERS, json.dumps(BOOK), content_type="application/json")
    request.META["HTTP_IDEMPOTENCY_KEY"] = header
    return request


def test_a_commit_that_fails_stores_nothing_and_leaves_the_key_free_and_the_connection_usable():
    from django.db import IntegrityError

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE test_deferred_parent (id int PRIMARY KEY);"
            "CREATE TABLE test_deferred_child (parent_id int REFERENCES test_deferred_parent "
            "DEFERRABLE INITIALLY DEFERRED)"
        )
    try:

        @idempotent("tests.deferred", anonymous=True)
        def orphan(request: Any) -> Any:
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO test_deferred_child VALUES (1)")  # checked at COMMIT
            from django.http import JsonResponse

            return JsonResponse({"ok": True}, status=201)

        with pytest.raises(IntegrityError):
            orphan(keyed_request('"deferred-1"'))

        assert EffectRecord.objects.filter(scope="tests.deferred").count() == 0
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO test_deferred_parent VALUES (1)")
        assert orphan(keyed_request('"deferred-1"')).status_code == 201  # the key was free
        assert EffectRecord.objects.filter(scope="tests.deferred").count() == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS test_deferred_child, test_deferred_parent")


def wait_until_expired(record: EffectRecord) -> None:
    """Poll until the database clock has passed ``record``'s expiry."""

    def expired() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp() > %s", [record.expires_at])
            return bool(cursor.fetchone()[0])

    wait_for(expired, what="the database clock to pass the record's expiry")


def test_a_record_past_its_ttl_is_taken_over_and_the_view_runs_again():
    from django.http import JsonResponse

    runs: list[int] = []

    @idempotent("tests.short", ttl=timedelta(seconds=1), anonymous=True)  # the replay below must fall within it
    def short(request: Any) -> Any:
        runs.append(1)
        return JsonResponse({"run": len(runs)}, status=201)

    first = short(keyed_request('"short-1"'))
    record = EffectRecord.objects.get(scope="tests.short")
    wait_until_expired(record)
    again = short(keyed_request('"short-1"'))
    replay = short(keyed_request('"short-1"'))

    assert (first.status_code, json.loads(first.content)) == (201, {"run": 1})
    assert (again.status_code, json.loads(again.content), again.has_header("Idempotent-Replayed")) == (
        201,
        {"run": 2},
        False,
    )
    assert (replay["Idempotent-Replayed"], json.loads(replay.content)) == ("true", {"run": 2})
    taken_over = EffectRecord.objects.get(scope="tests.short")
    assert taken_over.pk == record.pk and taken_over.expires_at > record.expires_at


@pytest.mark.parametrize(
    ("owner", "accepted"),
    [
        ("o" * conf.MAX_IDEMPOTENT_OWNER_CHARS, True),
        ("o" * (conf.MAX_IDEMPOTENT_OWNER_CHARS + 1), False),
        ("", False),
        ("a\x00b", False),
        (7, False),
    ],
    ids=["256 chars", "257 chars", "empty", "NUL", "not a string"],
)
def test_an_owner_callable_is_held_to_its_bounds(owner, accepted):
    from django.http import JsonResponse

    @idempotent("tests.owners", owner=lambda request: owner)
    def view(request: Any) -> Any:
        return JsonResponse({}, status=201)

    if accepted:
        assert view(keyed_request('"owner-1"')).status_code == 201
        assert EffectRecord.objects.get(scope="tests.owners").owner == owner
    else:
        with pytest.raises(IdempotentViewError) as raised:
            view(keyed_request('"owner-1"'))
        assert raised.value.field == "owner"
        assert not EffectRecord.objects.filter(scope="tests.owners").exists()


def test_maintenance_prunes_http_records_past_their_ttl_with_the_other_ledger_entries():
    from django.http import JsonResponse

    from django_workhorse import prune_expired_effects

    @idempotent("tests.pruned", ttl=timedelta(milliseconds=20), anonymous=True)
    def view(request: Any) -> Any:
        return JsonResponse({}, status=201)

    view(keyed_request('"pruned-1"'))
    record = EffectRecord.objects.get(scope="tests.pruned")
    wait_until_expired(record)
    assert prune_expired_effects() == 1
    assert not EffectRecord.objects.filter(scope="tests.pruned").exists()


def test_a_view_nested_in_another_with_the_same_key_stores_neither():
    from django.http import JsonResponse

    from django_workhorse.exceptions import KeyNotSettledError

    @idempotent("tests.nested", anonymous=True)
    def inner(request: Any) -> Any:
        Order.objects.create(product="inner", quantity=1, placement_token=uuid.uuid4())
        return JsonResponse({"inner": True}, status=201)

    @idempotent("tests.nested", anonymous=True)
    def outer(request: Any) -> Any:
        assert inner(request).status_code == 201  # the lock is this transaction's own: the inner view runs
        return JsonResponse({"outer": True}, status=201)

    with pytest.raises(KeyNotSettledError, match="nested"):
        outer(keyed_request('"nested-1"'))

    assert (EffectRecord.objects.filter(scope="tests.nested").count(), Order.objects.count()) == (0, 0)


def test_a_keyed_view_makes_as_many_round_trips_as_the_view_alone():
    from django.db import transaction
    from django.http import JsonResponse

    from django_workhorse import enqueue
    from tests.test_round_trips import protocol_trace, round_trips

    def work(request: Any) -> Any:
        order = Order.objects.create(product="trips", quantity=1, placement_token=uuid.uuid4())
        enqueue("tests.record", {"order": order.pk})
        return JsonResponse({"order": order.pk}, status=201)

    def plain(request: Any) -> Any:
        with transaction.atomic():
            return work(request)

    keyed = idempotent("tests.trips", anonymous=True)(work)
    for view, key in ((plain, None), (keyed, '"trips-warm"')):  # prepare every statement once
        view(keyed_request(key or '"unused"'))
    with protocol_trace() as plain_lines:
        assert plain(keyed_request('"unused"')).status_code == 201
    with protocol_trace() as keyed_lines:
        assert keyed(keyed_request('"trips-1"')).status_code == 201
    # The claim goes with the BEGIN and the record with the COMMIT: BEGIN, the row, the job, COMMIT.
    assert round_trips(plain_lines) == round_trips(keyed_lines) == 4
    assert EffectRecord.objects.filter(scope="tests.trips").count() == 2


def test_a_keyed_views_on_commit_callbacks_run_once_after_its_record_commits():
    from django.db import transaction
    from django.http import JsonResponse

    from tests.conftest import connect_directly

    seen: list[int] = []

    @idempotent("tests.hooks", anonymous=True)
    def view(request: Any) -> Any:
        def committed() -> None:
            with connect_directly() as other:
                seen.append(
                    other.execute("SELECT count(*) FROM workhorse_effect WHERE scope = 'tests.hooks'").fetchone()[0]
                )

        transaction.on_commit(committed)
        return JsonResponse({}, status=201)

    view(keyed_request('"hooks-1"'))
    assert view(keyed_request('"hooks-1"')).has_header("Idempotent-Replayed")
    assert seen == [1]  # after the commit (another session sees the record), and not for the replay
