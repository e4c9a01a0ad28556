"""Sealed @idempotent responses (decision 0024), through a real HTTP server and a real HTTP client.

The views are in tests/http_views.py (``_sealed_reply``): each answer repeats the request's note in
its body and in a replayed header, so the note is the plaintext that must not be stored.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pytest
from django.db import connection

from django_workhorse.encryption import envelope_key_id, is_envelope
from django_workhorse.encryption.sealed_json import SEALED_FIELD
from django_workhorse.exceptions import EncryptionNotConfiguredError, IdempotentViewError
from django_workhorse.http import idempotent
from django_workhorse.models import EffectRecord
from example_project.shop.models import Order
from tests.encryption import ACTIVE, assert_shows_no_key, encryption_setting
from tests.encryption import new_key as new_encryption_key
from tests.http_views import CONTROL, SEALED
from tests.test_http_idempotency import Client, Reply

pytestmark = pytest.mark.django_db(transaction=True)

BY_SETTING, BY_ARGUMENT, NEVER = "/http/sealed/by-setting/", "/http/sealed/by-argument/", "/http/sealed/never/"
REPLAYED = ("content-type", "location", "link")


@pytest.fixture
def client_(live_server) -> Client:
    CONTROL.reset()
    yield Client(live_server.url)
    CONTROL.reset()


@pytest.fixture
def keys(settings: Any) -> dict[str, Any]:
    setting = encryption_setting(encrypted_scopes=[SEALED])
    settings.WORKHORSE_ENCRYPTION = setting
    return setting


def new_key() -> str:
    return f"k-{uuid.uuid4()}"


def order(note: str, **more: Any) -> dict[str, Any]:
    return {"product": "book", "quantity": 1, "note": note, **more}


def records() -> list[EffectRecord]:
    return list(EffectRecord.objects.filter(kind="http").order_by("id"))


def dump() -> str:
    """Every ledger row as PostgreSQL renders it (bytea as hex), and each stored body as text."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(string_agg(row_to_json(t)::text, ''), '') FROM workhorse_effect t")
        rows = str(cursor.fetchone()[0])
    return rows + "".join(bytes(record.response_body).decode("latin-1") for record in records())


def first_and_replay(client_: Client, path: str, note: str, key: str | None = None) -> tuple[Reply, Reply]:
    key = key or new_key()
    return client_.send(path, order(note), key=key), client_.send(path, order(note), key=key)


def assert_replays_the_first(first: Reply, replay: Reply) -> None:
    assert (first.status, first.replayed, replay.status, replay.replayed) == (201, False, 201, True)
    assert replay.body == first.body
    assert {name: replay.headers[name] for name in REPLAYED} == {name: first.headers[name] for name in REPLAYED}
    assert "set-cookie" in first.headers and "set-cookie" not in replay.headers


def assert_stored_sealed(record: EffectRecord, note: str) -> None:
    body = bytes(record.response_body).decode("ascii")
    assert is_envelope(body) and envelope_key_id(body) == ACTIVE
    assert list(record.response_headers) == [SEALED_FIELD] and is_envelope(record.response_headers[SEALED_FIELD])
    assert record.status_code == 201  # kept in clear, for the admin
    assert note not in dump() and note.encode().hex() not in dump()
    assert "/orders/" not in json.dumps(record.response_headers) and "application/json" not in dump()


# -- sealed, and replayed as a clear record is ----------------------------------------------------------------


@pytest.mark.parametrize("setting", [{"encrypted_scopes": [SEALED]}, {"encrypt_all": True}])
def test_a_response_is_sealed_by_the_scope_list_or_encrypt_all_and_replayed_as_it_was(client_, settings, setting):
    settings.WORKHORSE_ENCRYPTION = encryption_setting(**setting)
    note = f"note-{uuid.uuid4()}"

    first, replay = first_and_replay(client_, BY_SETTING, note)

    assert_replays_the_first(first, replay)
    assert first.json["note"] == note and first.headers["link"] == f'</notes/{note}>; rel="note"'
    assert (Order.objects.count(), CONTROL.runs) == (1, 1)
    assert_stored_sealed(records()[0], note)


def test_a_response_is_sealed_by_the_argument(client_, settings):
    settings.WORKHORSE_ENCRYPTION = encryption_setting()  # no scope listed
    note = f"note-{uuid.uuid4()}"

    first, replay = first_and_replay(client_, BY_ARGUMENT, note)

    assert_replays_the_first(first, replay)
    assert_stored_sealed(records()[0], note)


def test_a_sealed_replay_answers_as_the_clear_replay_does(client_, keys):
    sealed_first, sealed = first_and_replay(client_, BY_SETTING, "same note")
    clear_first, clear = first_and_replay(client_, NEVER, "same note")

    assert_replays_the_first(sealed_first, sealed)
    assert_replays_the_first(clear_first, clear)
    assert sealed.status == clear.status
    assert sealed.headers.keys() - {"date"} == clear.headers.keys() - {"date"}
    ids = ("order", "job", "key_digest")  # this request's own
    assert {k: v for k, v in sealed.json.items() if k not in ids} == {
        k: v for k, v in clear.json.items() if k not in ids
    }
    sealed_record, clear_record = records()
    assert b"same note" in bytes(clear_record.response_body)  # encrypted=False: in clear, scope listed or not
    assert b"same note" not in bytes(sealed_record.response_body)


def test_a_clear_record_replays_once_its_scope_is_sealed_and_a_sealed_one_once_it_is_not(client_, settings, keys):
    settings.WORKHORSE_ENCRYPTION = {**keys, "encrypted_scopes": []}
    clear_key, sealed_key = new_key(), new_key()
    clear_first = client_.send(BY_SETTING, order("clear"), key=clear_key)
    settings.WORKHORSE_ENCRYPTION = keys
    sealed_first = client_.send(BY_SETTING, order("sealed"), key=sealed_key)

    assert_replays_the_first(clear_first, client_.send(BY_SETTING, order("clear"), key=clear_key))
    settings.WORKHORSE_ENCRYPTION = {**keys, "encrypted_scopes": []}
    assert_replays_the_first(sealed_first, client_.send(BY_SETTING, order("sealed"), key=sealed_key))
    assert CONTROL.runs == 2


def test_a_response_sealed_under_an_old_key_replays_after_the_active_key_changes(client_, settings, keys):
    key = new_key()
    first = client_.send(BY_SETTING, order("rotated"), key=key)
    settings.WORKHORSE_ENCRYPTION = {
        **keys,
        "keys": {**keys["keys"], "2027-06": new_encryption_key()},
        "active": "2027-06",
    }

    assert_replays_the_first(first, client_.send(BY_SETTING, order("rotated"), key=key))
    client_.send(BY_SETTING, order("new"), key=new_key())
    old, new = (bytes(record.response_body).decode() for record in records())
    assert (envelope_key_id(old), envelope_key_id(new)) == (ACTIVE, "2027-06")


# -- failing closed ---------------------------------------------------------------------------------------


def swap(column: str, first: EffectRecord, second: EffectRecord) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE workhorse_effect AS a SET {column} = b.{column} FROM workhorse_effect AS b "
            "WHERE a.id = %s AND b.id = %s",
            [first.id, second.id],
        )


def assert_fails_closed(reply: Reply, caplog: Any, *, key_id: str, reason: str, keys: dict[str, Any]) -> None:
    assert reply.status == 500 and not reply.replayed
    assert reply.json == {"type": "about:blank", "title": "Internal Server Error", "status": 500}
    assert reply.headers["content-type"] == "application/problem+json"
    logged = [r for r in caplog.records if r.name == "django_workhorse.http.decorator" and r.levelno == logging.ERROR]
    assert len(logged) == 1
    message = logged[0].getMessage()
    assert f"scope={SEALED}" in message and f"key_id={key_id}" in message and reason in message
    assert_shows_no_key(message, *keys["keys"].values(), keys["fingerprint_key"])


@pytest.mark.parametrize("column", ["response_body", "response_headers"])
def test_an_envelope_swapped_between_two_records_fails_closed_without_running_the_view(client_, keys, caplog, column):
    first_key, second_key = new_key(), new_key()
    client_.send(BY_SETTING, order("first"), key=first_key)
    client_.send(BY_SETTING, order("first"), key=second_key)
    swap(column, *records())
    caplog.set_level(logging.ERROR, logger="django_workhorse.http.decorator")

    reply = client_.send(BY_SETTING, order("first"), key=first_key)

    assert_fails_closed(reply, caplog, key_id=ACTIVE, reason="wrong key or tampered", keys=keys)
    assert b"first" not in reply.body
    assert (CONTROL.runs, Order.objects.count(), len(records())) == (2, 2, 2)


def test_a_body_and_headers_swapped_within_one_record_fail_closed(client_, keys, caplog):
    key = new_key()
    client_.send(BY_SETTING, order("one"), key=key)
    record = records()[0]
    EffectRecord.objects.filter(pk=record.pk).update(
        response_body=record.response_headers[SEALED_FIELD].encode(),
        response_headers={SEALED_FIELD: bytes(record.response_body).decode()},
    )
    caplog.set_level(logging.ERROR, logger="django_workhorse.http.decorator")

    reply = client_.send(BY_SETTING, order("one"), key=key)

    assert_fails_closed(reply, caplog, key_id=ACTIVE, reason="wrong key or tampered", keys=keys)


def test_a_record_under_a_key_id_no_longer_configured_fails_closed(client_, settings, keys, caplog):
    key = new_key()
    client_.send(BY_SETTING, order("gone"), key=key)
    settings.WORKHORSE_ENCRYPTION = {**keys, "keys": {"2027-06": new_encryption_key()}, "active": "2027-06"}
    caplog.set_level(logging.ERROR, logger="django_workhorse.http.decorator")

    reply = client_.send(BY_SETTING, order("gone"), key=key)

    assert_fails_closed(reply, caplog, key_id=ACTIVE, reason="unknown key id", keys=keys)
    assert CONTROL.runs == 1


def test_a_sealed_record_fails_closed_once_the_setting_is_removed(client_, settings, keys, caplog):
    key = new_key()
    client_.send(BY_SETTING, order("gone"), key=key)
    settings.WORKHORSE_ENCRYPTION = None
    caplog.set_level(logging.ERROR, logger="django_workhorse.http.decorator")

    reply = client_.send(BY_SETTING, order("gone"), key=key)

    assert_fails_closed(reply, caplog, key_id="None", reason="WORKHORSE_ENCRYPTION is not set", keys=keys)
    assert CONTROL.runs == 1


def test_a_sealed_records_request_digests_are_keyed(client_, settings, keys):
    settings.WORKHORSE_ENCRYPTION = {**keys, "encrypted_scopes": []}
    client_.send(BY_SETTING, order("same"), key=new_key())
    settings.WORKHORSE_ENCRYPTION = keys
    sealed_key = new_key()
    client_.send(BY_SETTING, order("same"), key=sealed_key)

    clear, sealed = records()
    assert set(clear.field_digests) == set(sealed.field_digests)
    assert all(clear.field_digests[part] != sealed.field_digests[part] for part in clear.field_digests)
    assert bytes(clear.request_digest) != bytes(sealed.request_digest)
    assert client_.send(BY_SETTING, order("same"), key=sealed_key).replayed
    changed = client_.send(BY_SETTING, order("other"), key=sealed_key)
    assert (changed.status, changed.json["differing"]) == (422, ["body"])


def test_a_different_request_with_the_key_of_a_sealed_record_is_still_a_422(client_, keys):
    key = new_key()
    client_.send(BY_SETTING, order("one"), key=key)
    reply = client_.send(BY_SETTING, order("two"), key=key)
    assert reply.status == 422 and reply.json["differing"] == ["body"]


# -- the body's bound, and the argument ---------------------------------------------------------------------


def envelope_size(body_bytes: int) -> int:
    return len(f"wh1:{ACTIVE}:") + ((12 + body_bytes + 16) * 4 + 2) // 3


def test_the_bodys_envelope_counts_against_the_storage_bound(client_, settings, keys):
    settings.WORKHORSE_IDEMPOTENT_RESPONSE_MAX_BYTES = 2048
    fits = next(n for n in range(2048, 0, -1) if envelope_size(n) <= 2048)

    at_bound = client_.send(BY_SETTING, order("a", size=fits), key=new_key())
    over = client_.send(BY_SETTING, order("b", size=fits + 1), key=new_key())

    assert (at_bound.status, len(at_bound.body), over.status) == (200, fits, 500)
    assert [len(bytes(record.response_body)) for record in records()] == [envelope_size(fits)]
    assert Order.objects.count() == 1


def view(request: Any) -> Any:
    raise AssertionError("never called")


def test_encrypted_true_without_the_setting_is_refused_when_decorating():
    with pytest.raises(EncryptionNotConfiguredError) as caught:
        idempotent("orders", encrypted=True)(view)
    assert caught.value.field == "encrypted"
    idempotent("orders", encrypted=False)(view)
    idempotent("orders", encrypted=None)(view)


@pytest.mark.parametrize("value", [1, "yes", 0])
def test_encrypted_must_be_a_bool_or_none(keys, value):
    with pytest.raises(IdempotentViewError) as caught:
        idempotent("orders", encrypted=value)
    assert caught.value.field == "encrypted"


def test_encrypted_true_with_the_setting_is_accepted(keys):
    assert callable(idempotent("orders", encrypted=True)(view))
