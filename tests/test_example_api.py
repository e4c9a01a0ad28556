"""The example shop's JSON API and its retrying client, through a real HTTP server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from django_workhorse.models import EffectRecord, Job
from example_project import api_client
from example_project.shop.models import Invoice, Order

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("example_project.urls")]
ROOT = Path(__file__).resolve().parent.parent


def test_the_client_that_loses_a_response_gets_the_same_order_on_retry(live_server):
    invoice = Invoice.objects.create(amount_cents=1250)

    outcomes = api_client.main(["--url", live_server.url, "--invoice", str(invoice.pk)])

    # The retry may overtake the request it repeats (both reach the server): then the retry runs the
    # view and the lost request gets the replay. Either way one order, and the next retry replays.
    status, headers, order = outcomes["orders"]["retry"]
    assert status == 201
    again_status, again_headers, again = outcomes["orders"]["again"]
    assert (again_status, again_headers.get("idempotent-replayed"), again) == (201, "true", order)
    assert outcomes["orders"]["changed"][0] == 422 and outcomes["orders"]["changed"][1]["differing"] == ["body"]
    assert Order.objects.count() == 1 and Order.objects.get().pk == order["order"]
    assert headers["location"] == f"/orders/{order['order']}/"
    confirmation = Job.objects.get(pk=order["confirmation_job"])
    assert confirmation.job_type == "shop.send_confirmation"

    status, headers, capture = outcomes["capture"]["retry"]
    assert (status, capture["invoice"]) == (202, invoice.pk)
    assert outcomes["capture"]["again"][0] == 202 and outcomes["capture"]["again"][2] == capture
    assert Job.objects.filter(job_type="shop.capture_invoice").count() == 1
    assert EffectRecord.objects.filter(kind="http").count() == 2


def test_a_new_key_places_a_new_order_and_a_bad_order_is_a_stored_400(live_server):
    first = api_client.send(live_server.url, "/api/orders/", {"product": "Ceramic mug"}, "key-1")
    second = api_client.send(live_server.url, "/api/orders/", {"product": "Ceramic mug"}, "key-2")
    bad = api_client.send(live_server.url, "/api/orders/", {"product": "Tea"}, "key-3")
    bad_again = api_client.send(live_server.url, "/api/orders/", {"product": "Tea"}, "key-3")

    assert (first[0], second[0]) == (201, 201) and first[2]["order"] != second[2]["order"]
    assert (bad[0], bad_again[0], bad_again[1].get("idempotent-replayed")) == (400, 400, "true")
    assert Order.objects.count() == 2


def test_the_client_script_prints_the_replay_of_each_lost_answer(live_server):
    invoice = Invoice.objects.create(amount_cents=1250)
    script = ROOT / "example_project" / "api_client.py"

    done = subprocess.run(
        [sys.executable, str(script), "--url", live_server.url, "--invoice", str(invoice.pk)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )

    # The retry comes after the lost request, for certain: it is the replay, not the original.
    order, capture = Order.objects.get(), Invoice.objects.get()
    printed = done.stdout.splitlines()
    assert [line.split(" {")[0] for line in printed if line.startswith("retry")] == [
        "retry with the same key: 201 (replayed)",
        "retry with the same key: 202 (replayed)",
    ]
    assert f'"order": {order.pk}' in done.stdout and f'"capture_job": {capture.capture_job_id}' in done.stdout
