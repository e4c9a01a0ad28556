"""The example shop (example_project/) end to end: its pages, its jobs and real worker processes.

The pages are driven with Django's test client against the shop's URLs; jobs are run by burst
workers in this process, or by real ``manage.py workhorse_worker`` processes with the example
project's settings, pointed at the test database. The kill -9 scenario signals the pause through
the database (the invoice row), never through sleeps.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import signal
import socket
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_workhorse.models import Job, JobEvent, JobStatus
from example_project.shop.models import Digest, Invoice, Order, Product, ProviderCharge, WebhookDelivery
from example_project.shop.payments import FakePaymentProvider, IdempotencyKeyReusedError
from tests.conftest import race
from tests.processes import WorkerProcess, worker_spawner
from tests.worker_tasks import run_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("example_project.urls")]

ROOT = Path(__file__).resolve().parent.parent


def jobs(job_type: str) -> list[Job]:
    return list(Job.objects.filter(job_type=job_type).order_by("id"))


def make_due(job_id: int) -> None:
    """Let a scheduled job (a debounce window, a retry back-off) run now."""
    Job.objects.filter(pk=job_id).update(run_at=timezone.now() - timedelta(seconds=1))


# -- worker processes ---------------------------------------------------------------------------


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start the example project's ``manage.py workhorse_worker`` (as ``make run`` does) on the test database."""
    command = [sys.executable, "manage.py", "workhorse_worker", "--poll-interval", "0.05", "--listen-database", "none"]
    with worker_spawner(tmp_path, command, settings="example_project.settings") as start:
        yield start


# -- home -----------------------------------------------------------------------------------------


def test_the_home_page_links_every_scenario_and_the_admin(client):
    page = client.get(reverse("home")).content.decode()

    for name in ("orders", "webhooks", "invoices", "search-index", "digest", "conflict"):
        assert f'href="{reverse(name)}"' in page
    assert 'href="/admin/"' in page


@pytest.mark.parametrize("name", ["orders", "webhooks", "invoices", "search-index", "digest", "conflict"])
def test_every_scenario_page_renders(client, name):
    assert client.get(reverse(name)).status_code == 200


# -- place an order: double-click safe ---------------------------------------------------------


def order_form(client: Client) -> dict[str, str]:
    token = client.get(reverse("orders")).context["form"].initial["token"]
    return {"token": str(token), "product": "Ceramic mug", "quantity": "2"}


def test_a_double_posted_order_form_places_one_order_and_enqueues_one_job(client):
    form = order_form(client)

    first = client.post(reverse("orders"), form)
    second = client.post(reverse("orders"), form)

    order = Order.objects.get()
    assert (order.product, order.quantity) == ("Ceramic mug", 2)
    assert first.status_code == second.status_code == 302
    assert first["Location"] == f"{reverse('order-detail', args=[order.pk])}?outcome=accepted"
    assert second["Location"] == f"{reverse('order-detail', args=[order.pk])}?outcome=replayed"
    [job] = jobs("shop.send_confirmation")
    assert (job.payload, order.confirmation_job_id) == ({"order_id": order.pk}, job.pk)
    assert list(JobEvent.objects.filter(job_id=job.pk).values_list("kind", flat=True)) == []

    shown = client.get(second["Location"])
    assert (shown.context["result"]["outcome"], shown.context["result"]["job_id"]) == ("replayed", job.pk)
    page = shown.content.decode()
    assert '<span class="outcome replayed">REPLAYED</span>' in page
    assert f'href="/admin/workhorse/job/{job.pk}/change/"' in page

    assert run_worker().finished == {"succeeded": 1}
    job.refresh_from_db()
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, {"order_id": order.pk})


def test_a_double_click_racing_itself_places_one_order(client):
    form = order_form(client)

    responses = race(2, lambda i: Client().post(reverse("orders"), form))

    assert sorted(r["Location"].rsplit("=", 1)[1] for r in responses) == ["accepted", "replayed"]
    assert Order.objects.count() == 1
    assert len(jobs("shop.send_confirmation")) == 1


def test_fulfilling_an_order_twice_makes_one_workflow_that_runs_in_order_and_charges_once(client):
    response = client.post(reverse("orders"), order_form(client))
    order = Order.objects.get()
    fulfil = reverse("fulfil-order", args=[order.pk])

    first = client.post(fulfil)
    second = client.post(fulfil)

    detail = reverse("order-detail", args=[order.pk])
    assert (first["Location"], second["Location"]) == (f"{detail}?fulfilment=accepted", f"{detail}?fulfilment=replayed")
    order.refresh_from_db()
    steps = {job.step_name: job for job in Job.objects.filter(workflow_id=order.fulfilment_workflow_id)}
    assert {name: job.status for name, job in steps.items()} == {
        "charge": JobStatus.QUEUED, "pack": JobStatus.WAITING, "mail": JobStatus.WAITING, "close": JobStatus.WAITING
    }  # fmt: skip
    waiting = client.get(second["Location"])
    assert waiting.context["fulfilment"]["state"] == "running"
    assert f'href="/admin/workhorse/workflow/{order.fulfilment_workflow_id}/change/"' in waiting.content.decode()

    assert run_worker().finished == {"succeeded": 5}  # the confirmation and the four steps
    order.refresh_from_db()
    [charge] = ProviderCharge.objects.filter(reference=f"order-{order.pk}")
    assert (order.charge_id, charge.amount_cents, charge.request_count) == (charge.charge_id, 2 * 1200, 1)
    assert charge.idempotency_key.startswith("wf:")  # the step's key, derived from the workflow's
    started = {job.step_name: Job.objects.get(pk=job.pk).started_at for job in steps.values()}
    assert (
        started["charge"]
        < min(started["pack"], started["mail"])
        <= max(started["pack"], started["mail"])
        < started["close"]
    )
    assert order.packed_at and order.receipt_sent_at and order.closed_at
    results = {job.step_name: job.result for job in Job.objects.filter(workflow_id=order.fulfilment_workflow_id)}
    assert results["mail"] == {"charge_id": charge.charge_id}
    assert results["close"] == {"order_id": order.pk, "after": ["mail", "pack"]}
    done = client.get(reverse("order-detail", args=[order.pk]))
    assert done.context["fulfilment"]["state"] == "succeeded"
    assert [job.step_name for job in done.context["fulfilment"]["steps"]] == ["charge", "pack", "mail", "close"]
    assert response.status_code == 302


# -- webhook receiver: one job per delivery id ----------------------------------------------------


def deliver(client: Client, body: object) -> tuple[int, dict[str, object]]:
    response = client.post(reverse("provider-webhook"), json.dumps(body), content_type="application/json")
    return response.status_code, response.json()


def test_a_redelivered_webhook_gives_one_job_and_the_second_answer_says_replayed():
    client = Client(enforce_csrf_checks=True)  # the provider has no CSRF token
    body = {"delivery_id": "evt_1001", "type": "invoice.paid"}

    first = deliver(client, body)
    second = deliver(client, body)

    [job] = jobs("shop.handle_webhook")
    assert first == (202, {"delivery_id": "evt_1001", "job_id": job.pk, "outcome": "accepted"})
    assert second == (200, {"delivery_id": "evt_1001", "job_id": job.pk, "outcome": "replayed"})
    delivery = WebhookDelivery.objects.get()
    assert (delivery.received_count, delivery.job_id, delivery.body) == (2, job.pk, body)

    assert run_worker().finished == {"succeeded": 1}
    delivery.refresh_from_db()
    assert delivery.processed_at is not None
    # Still the same job after it ran: the key lives for three days, whatever the job's state.
    assert deliver(client, body) == (200, {"delivery_id": "evt_1001", "job_id": job.pk, "outcome": "replayed"})
    assert len(jobs("shop.handle_webhook")) == 1

    other = deliver(client, {"delivery_id": "evt_1002", "type": "invoice.paid"})
    assert other[0] == 202
    assert len(jobs("shop.handle_webhook")) == 2


@pytest.mark.parametrize("body", [[], {"type": "invoice.paid"}, {"delivery_id": 7}, {"delivery_id": "a b"}])
def test_the_webhook_receiver_refuses_a_body_without_a_delivery_id(client, body):
    assert deliver(client, body)[0] == 400
    assert not Job.objects.exists()


def test_the_webhook_page_delivers_twice_and_shows_one_job(client):
    response = client.post(reverse("webhooks"), {"delivery_id": "evt_page", "event_type": "invoice.paid", "times": 2})

    [job] = jobs("shop.handle_webhook")
    assert response.status_code == 200
    assert [(r["outcome"], r["job_id"]) for r in response.context["results"]] == [
        ("accepted", job.pk),
        ("replayed", job.pk),
    ]
    page = response.content.decode()
    assert "Received 2 times, handled by one job." in page
    assert f'href="/admin/workhorse/job/{job.pk}/change/"' in page


# -- invoice capture: one charge at the provider --------------------------------------------------


def test_the_fake_provider_charges_once_per_key_and_commits_on_its_own():
    provider = FakePaymentProvider()
    with pytest.raises(RuntimeError), transaction.atomic():
        first = provider.charge(500, idempotency_key="k-1", reference="invoice-1")
        raise RuntimeError("the caller's transaction rolls back")

    # An external system: the charge happened although the caller's transaction rolled back.
    again = provider.charge(500, idempotency_key="k-1", reference="invoice-1")
    assert (first.replayed, again.replayed, again.charge_id) == (False, True, first.charge_id)
    with pytest.raises(IdempotencyKeyReusedError):
        provider.charge(700, idempotency_key="k-1")
    charge = ProviderCharge.objects.get()
    assert (charge.charge_id, charge.amount_cents, charge.request_count) == (first.charge_id, 500, 3)


def capture(client: Client, invoice: Invoice, simulate: str = "") -> int:
    response = client.post(reverse("capture-invoice", args=[invoice.pk]), {"simulate": simulate})
    assert response.status_code == 302, response.content.decode()
    invoice.refresh_from_db()
    assert invoice.capture_job_id is not None
    return invoice.capture_job_id


def test_a_worker_killed_during_the_charge_does_not_charge_twice(client, spawn_worker):
    invoice = Invoice.objects.create(amount_cents=1250)
    job_id = capture(client, invoice, simulate="hold")

    # Attempt 1 charges the provider, then pauses (and says so on the invoice row): kill it there.
    first = spawn_worker("--max-jobs", "1")
    holding = wait_for(
        lambda: Invoice.objects.filter(pk=invoice.pk).values_list("holding_pid", flat=True).get(),
        60,
        what="the worker to charge the invoice and pause",
    )
    assert holding == first.pid
    charge = ProviderCharge.objects.get()
    assert (charge.amount_cents, charge.reference, charge.request_count) == (1250, invoice.provider_reference, 1)
    assert charge.idempotency_key == f"workhorse-job-{job_id}:charge"
    page = client.get(reverse("invoice-detail", args=[invoice.pk])).content.decode()
    assert f"kill -9 {first.pid}" in page

    first.popen.kill()
    assert first.wait() == -signal.SIGKILL
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.RUNNING, 1)
    assert Invoice.objects.get(pk=invoice.pk).status == Invoice.Status.OPEN  # charged, not recorded

    # The dead worker's lease runs out; another worker reclaims the job and runs it to the end.
    Job.objects.filter(pk=job_id).update(lease_expires_at=timezone.now() - timedelta(minutes=1))
    second = spawn_worker("--burst")
    assert second.wait() == 0, second.output()

    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.SUCCEEDED, 2)
    assert job.result == {"charge_id": charge.charge_id, "provider_replayed": True}
    invoice.refresh_from_db()
    assert (invoice.status, invoice.charge_id, invoice.holding_pid) == (Invoice.Status.PAID, charge.charge_id, None)
    # One charge at the provider, asked for twice.
    assert list(ProviderCharge.objects.values_list("charge_id", "request_count")) == [(charge.charge_id, 2)]
    kinds = list(JobEvent.objects.filter(job_id=job_id).order_by("id").values_list("kind", "attempt"))
    assert kinds == [("claimed", 1), ("lease_expired", 1), ("claimed", 2), ("succeeded", 2)]


def test_a_capture_that_fails_after_the_charge_is_retried_without_a_second_charge(client):
    invoice = Invoice.objects.create(amount_cents=990)
    job_id = capture(client, invoice, simulate="fail")

    assert run_worker().finished == {"queued": 1}  # failed, to be retried
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 1)
    assert "simulated crash after the provider charged the card" in job.last_error
    make_due(job_id)
    assert run_worker().finished == {"succeeded": 1}

    job.refresh_from_db()
    charge = ProviderCharge.objects.get()
    assert (job.status, job.attempt, charge.request_count) == (JobStatus.SUCCEEDED, 2, 2)
    invoice.refresh_from_db()
    assert (invoice.status, invoice.charge_id) == (Invoice.Status.PAID, charge.charge_id)


def test_capturing_again_replays_and_another_choice_conflicts(client):
    invoice = Invoice.objects.create(amount_cents=100)
    job_id = capture(client, invoice)

    again = client.post(reverse("capture-invoice", args=[invoice.pk]), {"simulate": ""})
    changed = client.post(reverse("capture-invoice", args=[invoice.pk]), {"simulate": "fail"})

    assert again["Location"].endswith("?outcome=replayed")
    assert changed.status_code == 409
    assert changed.context["conflict"].conflicting_fields == ("payload",)
    assert f'href="/admin/workhorse/job/{job_id}/change/">job #{job_id}</a>' in changed.content.decode()
    assert [job.pk for job in jobs("shop.capture_invoice")] == [job_id]


# -- debounced search index update ----------------------------------------------------------------


def test_repeated_product_edits_replace_one_pending_index_job(client):
    product = Product.objects.create(name="Kettle", description="v1", indexed_description="v1")
    edit = reverse("edit-product", args=[product.pk])

    first = client.post(edit, {"description": "v2"})
    [job] = jobs("shop.update_search_index")
    first_run_at = job.run_at
    second = client.post(edit, {"description": "v3"})

    assert (first.context["result"]["outcome"], second.context["result"]["outcome"]) == ("accepted", "replaced")
    assert first.context["result"]["job_id"] == second.context["result"]["job_id"] == job.pk
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert job.run_at > first_run_at > timezone.now()  # the window restarted with the second edit
    assert "REPLACED" in second.content.decode()
    assert [j.pk for j in jobs("shop.update_search_index")] == [job.pk]

    make_due(job.pk)
    assert run_worker().finished == {"succeeded": 1}
    product.refresh_from_db()
    assert (product.description, product.indexed_description, product.index_job_id) == ("v3", "v3", job.pk)


def test_an_edit_after_the_index_job_ran_gets_a_follow_up(client):
    product = Product.objects.create(name="Mug", description="v1")
    edit = reverse("edit-product", args=[product.pk])
    client.post(edit, {"description": "v2"})
    [job] = jobs("shop.update_search_index")
    make_due(job.pk)
    run_worker()

    late = client.post(edit, {"description": "v3"}).context["result"]

    assert (late["outcome"], late["reason"], late["job_id"]) == ("non_replaceable", "not_pending", job.pk)
    assert late["follow_up"]["outcome"] == "accepted"
    assert run_worker().finished == {"succeeded": 1}
    product.refresh_from_db()
    assert (product.indexed_description, product.index_job_id) == ("v3", late["follow_up"]["job_id"])


# -- throttled digest -----------------------------------------------------------------------------


def test_repeated_digest_requests_within_the_window_are_coalesced(client):
    outcomes = [client.post(reverse("digest"), {"user": user}).context["result"] for user in ("alice", "alice", "bob")]

    alice, bob = jobs("shop.send_digest")
    assert [(r["outcome"], r["job_id"]) for r in outcomes] == [
        ("accepted", alice.pk),
        ("coalesced", alice.pk),
        ("accepted", bob.pk),
    ]
    assert run_worker().finished == {"succeeded": 2}
    assert sorted(Digest.objects.values_list("recipient", flat=True)) == ["alice", "bob"]
    again = client.post(reverse("digest"), {"user": "alice"})
    assert (again.context["result"]["outcome"], again.context["result"]["job_id"]) == ("coalesced", alice.pk)
    assert "COALESCED" in again.content.decode()


# -- conflict demo ------------------------------------------------------------------------------


def test_the_conflict_page_shows_the_conflicting_fields_and_never_the_raw_key(client):
    order = Order.objects.create(product="Ceramic mug", placement_token="00000000-0000-0000-0000-000000000001")
    raw_key = f"refund:order:{order.pk}"

    first = client.post(reverse("conflict"), {"order": order.pk, "amount": 5})
    again = client.post(reverse("conflict"), {"order": order.pk, "amount": 5})
    changed = client.post(reverse("conflict"), {"order": order.pk, "amount": 7})

    [job] = jobs("shop.refund_order")
    assert (first.context["result"]["outcome"], again.context["result"]["outcome"]) == ("accepted", "replayed")
    assert changed.status_code == 409
    error = changed.context["conflict"]
    assert (error.job_id, error.mode, error.scope, error.conflicting_fields) == (
        job.pk,
        "idempotency",
        "refunds",
        ("payload",),
    )
    page = changed.content.decode()
    for shown in ("payload", error.key_preview, error.key_digest, f"/admin/workhorse/job/{job.pk}/change/"):
        assert shown in page
    assert raw_key not in page
    assert job.payload == {"order_id": order.pk, "amount_cents": 500}  # the first request won, nothing else


def test_the_periodic_reindex_catches_up_stale_products_once_per_tick():
    from datetime import datetime
    from datetime import timezone as tz

    from django.test import override_settings

    from django_workhorse import enqueue_due_schedules
    from django_workhorse.testing import eager
    from example_project import settings as shop_settings

    stale = Product.objects.create(name="lamp", description="brass", indexed_description="")
    fresh = Product.objects.create(name="desk", description="oak", indexed_description="oak")
    t0 = datetime(2026, 6, 1, 12, 1, tzinfo=tz.utc)
    with override_settings(WORKHORSE_SCHEDULES=shop_settings.WORKHORSE_SCHEDULES), eager():
        enqueue_due_schedules(t0)
        [result] = enqueue_due_schedules(t0 + timedelta(minutes=4))  # the 12:05 tick
        assert enqueue_due_schedules(t0 + timedelta(minutes=4)) == []
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert (stale.indexed_description, fresh.indexed_at) == ("brass", None)
    job = Job.objects.get(pk=result.job_id)
    assert job.result == {"reindexed": 1, "tick": "2026-06-01T12:05:00+00:00"}


# -- "Send it twice", through the example project's own runserver ---------------------------------


class BrowserRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects as a browser does: a 307 or 308 sends the same method and body again."""

    def __init__(self) -> None:
        self.codes: list[int] = []

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        self.codes.append(code)
        if code in (307, 308):
            return urllib.request.Request(newurl, data=req.data, method=req.get_method(), unverifiable=True)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


@pytest.fixture
def shop_server(tmp_path: Path) -> Iterator[str]:
    """``manage.py runserver`` with the example project's settings (its CSRF middleware included)
    on the test database, as ``make run`` starts it; yield its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
    with worker_spawner(tmp_path, command, settings="example_project.settings") as start:
        server = start()

        def accepts() -> bool:
            assert server.popen.poll() is None, server.output()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
            return True

        wait_for(accepts, 60, what="the shop's runserver")
        yield f"http://127.0.0.1:{port}"
        server.popen.send_signal(signal.SIGTERM)
        server.wait()


def test_send_it_twice_posts_the_form_twice_and_shows_the_replay(shop_server):
    redirects = BrowserRedirects()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), redirects)
    with browser.open(f"{shop_server}/orders/", timeout=30) as response:
        page = response.read().decode()
    # The form as the browser sends it (its hidden tokens, a product), to the button's formaction.
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page))
    [action] = re.findall(r'<button type="submit" formaction="([^"]+)">Send it twice</button>', page)
    body = urllib.parse.urlencode({**fields, "product": "Ceramic mug", "quantity": "2"}).encode()

    with browser.open(f"{shop_server}{action}", data=body, timeout=30) as response:
        shown, landed = response.read().decode(), response.url

    order = Order.objects.get()
    [job] = jobs("shop.send_confirmation")
    assert redirects.codes == [307, 302]
    assert landed == f"{shop_server}/orders/{order.pk}/?outcome=replayed&first=accepted"
    assert '<span class="outcome replayed">REPLAYED</span>' in shown
    assert '<span class="outcome accepted">ACCEPTED</span>' in shown
    assert (order.confirmation_job_id, job.payload) == (job.pk, {"order_id": order.pk})
    assert list(JobEvent.objects.filter(job_id=job.pk).values_list("kind", flat=True)) == []
