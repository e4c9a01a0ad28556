"""The admin in a real browser: headless Chromium logs in, reads the dashboard and a job, and
redrives a dead job and cancels a queued one through the pages an operator clicks; and every page
fits a 1280 px window with the admin's side bar open, nothing wider than its box.

The second test also takes the screenshots of the admin docs: each run saves them in its
``tmp_path`` and, when ``WORKHORSE_SCREENSHOTS_DIR`` is set, in that directory too
(``WORKHORSE_SCREENSHOTS_DIR=docs/images pytest tests/test_admin_browser.py`` refreshes the docs).
"""

from __future__ import annotations

import os
import random
import shutil
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import django.contrib.admin
import pytest
from django.contrib.auth.models import Permission
from django.db import connections
from django.db.models import F
from django.test.utils import override_settings
from django.utils import timezone

from django_workhorse import Debounce, Idempotency, Throttle, Unique, enqueue, enqueue_due_schedules, once, register
from django_workhorse.enqueueing.fingerprints import key_hash, key_preview
from django_workhorse.models import (
    Checkpoint,
    EffectRecord,
    IdempotencyBinding,
    Job,
    JobEvent,
    JobStatus,
    Redrive,
    ScheduleState,
    WorkerRecord,
)
from tests.factories import JobFactory

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
USERNAME, PASSWORD = "operator", "correct-horse-battery-staple"
ADMIN_STATIC = Path(django.contrib.admin.__file__).parent / "static"
TIMEOUT_MS = 15_000
T = TypeVar("T")

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"needs Chromium at {CHROMIUM} (the Debian chromium package)"),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture(scope="session", autouse=True)
def _admin_static_files() -> Iterator[None]:
    """Serve the admin's CSS and JavaScript from the live server, so pages look as they do in production.

    The live server serves STATIC_URL from STATIC_ROOT, and it reads STATIC_URL once, when it starts
    (without a STATIC_URL it cannot serve anything). The live server lives for the whole session,
    so this session fixture, autouse hence set up before it, sets both first.
    """
    with override_settings(STATIC_URL="/static/", STATIC_ROOT=str(ADMIN_STATIC)):
        yield


# -- example data: what a small shop's queue looks like on a weekday afternoon ----------------------

QUEUES = {
    "default": ("shop.send_confirmation", "search.reindex_product", "shop.sync_inventory"),
    "billing": ("billing.capture_invoice", "billing.refund", "billing.sync_payouts"),
    "emails": ("emails.send_receipt", "emails.weekly_digest", "emails.abandoned_cart"),
}
ERRORS = [
    ("billing", "billing.capture_invoice", "CardError: Your card was declined. (decline_code=insufficient_funds)"),
    ("billing", "billing.refund", "InvalidRequestError: Charge ch_3PQk2LJx9 has already been refunded."),
    ("emails", "emails.send_receipt", "SMTPRecipientsRefused: {'anna@example.invalid': (550, b'5.1.1 User unknown')}"),
    ("emails", "emails.send_receipt", "SMTPServerDisconnected: Connection unexpectedly closed"),
    ("default", "shop.sync_inventory", "ReadTimeout: the warehouse API did not answer within 30 s"),
]
# As the worker stores a failure: the exception, then the end of its traceback.
LAST_ERROR = '{0}\nTraceback (most recent call last):\n  File "shop/tasks.py", line 88, in handle\n    ...\n{0}\n'


@dataclass
class Showcase:
    job: Job  # a keyed job with a history, for the detail page
    dead: Job  # the dead job the operator redrives
    cancellable: Job  # a queued job the operator cancels


def populate(now: datetime) -> Showcase:
    """Jobs in every state across three queues, keyed jobs in each mode, dead jobs, workers."""
    rng = random.Random(8_2024)
    workers = [f"app-{n}:{31_000 + 17 * n}:{suffix}" for n, suffix in ((1, "k3f9"), (2, "x81c"), (3, "p0qd"))]
    for n, name in enumerate(workers, start=1):
        WorkerRecord.objects.create(
            name=name,
            host=f"app-{n}",
            pid=31_000 + 17 * n,
            queues=list(QUEUES) if n < 3 else ["emails"],
            concurrency=8,
            started_at=now - timedelta(hours=5, minutes=n),
            heartbeat_at=now - timedelta(seconds=2 * n),
        )
    jobs: list[Job] = []

    def add(queue: str, status: str, **fields: Any) -> None:
        fields.setdefault("job_type", rng.choice(QUEUES[queue]))
        fields.setdefault("created_at", now - timedelta(minutes=rng.randint(61, 120)))
        jobs.append(JobFactory.build(queue=queue, status=status, payload={"id": rng.randint(1000, 9999)}, **fields))

    # finished over the last hour: the throughput chart
    for minute in range(60):
        for _ in range(rng.randint(3, 11) + (6 if 20 <= minute <= 30 else 0)):
            finished = now - timedelta(minutes=minute, seconds=rng.randint(0, 59))
            status = JobStatus.CANCELLED if rng.random() < 0.03 else JobStatus.SUCCEEDED
            add(
                rng.choice(list(QUEUES)),
                status,
                attempt=1,
                started_at=finished - timedelta(seconds=2),
                finished_at=finished,
            )
    # waiting now, scheduled for later, running
    for queue, ready, scheduled, wait in (("default", 9, 4, 40), ("billing", 3, 6, 9), ("emails", 42, 18, 95)):
        for _ in range(ready):
            add(queue, JobStatus.QUEUED, run_at=now - timedelta(seconds=rng.randint(1, wait)))
        for _ in range(scheduled):
            add(queue, JobStatus.QUEUED, run_at=now + timedelta(minutes=rng.randint(2, 600)), attempt=rng.randint(0, 2))
    for n, queue in enumerate(("default", "billing", "billing", "emails", "emails", "emails")):
        add(
            queue,
            JobStatus.RUNNING,
            attempt=1,
            started_at=now - timedelta(seconds=rng.randint(1, 40)),
            claimed_by=workers[n % 3],
            lease_token=uuid.uuid4(),
            lease_expires_at=now + timedelta(seconds=45),
        )
    # dead letters
    for n, (queue, job_type, error) in enumerate(ERRORS):
        finished = now - timedelta(minutes=4 + 11 * n, seconds=17)
        add(
            queue,
            JobStatus.DEAD,
            job_type=job_type,
            attempt=5,
            max_attempts=5,
            started_at=finished - timedelta(seconds=3),
            finished_at=finished,
            last_error=LAST_ERROR.format(error),
        )
    Job.objects.bulk_create(jobs)

    # keyed jobs, one mode each, as the application enqueues them
    for n in range(6):
        enqueue(
            "billing.capture_invoice",
            {"invoice_id": f"inv_2024_{801 + n:05d}", "amount": {"currency": "EUR", "value": f"{40 + 13 * n}.90"}},
            queue="billing",
            tags=["invoices"],
            idempotency=Idempotency(f"capture:inv_2024_{801 + n:05d}", scope="invoice-capture"),
        )
    for customer in ("cus_Q2xY8", "cus_L7mN1", "cus_A9bC4"):
        enqueue(
            "emails.weekly_digest",
            {"customer_id": customer},
            queue="emails",
            delay=timedelta(hours=14),
            unique=Unique(f"digest:{customer}:2024-W24", scope="weekly-digest"),
        )
    for sku in ("SKU-4411-BLK", "SKU-0932-RED"):
        enqueue(
            "search.reindex_product",
            {"sku": sku},
            debounce=Debounce(f"product:{sku}", window=timedelta(minutes=5), scope="reindex"),
        )
    enqueue(
        "shop.sync_inventory",
        {"warehouse": "berlin"},
        throttle=Throttle("warehouse:berlin", window=timedelta(minutes=5), scope="inventory-sync"),
    )
    # two captures already went through; their keys keep answering for 24 h, the unique digest key is free
    captured = list(Job.objects.filter(job_type="billing.capture_invoice", bindings__isnull=False).order_by("id")[:2])
    Job.objects.filter(pk__in=[job.pk for job in captured]).update(
        status=JobStatus.SUCCEEDED,
        attempt=1,
        started_at=now - timedelta(minutes=3),
        finished_at=now - timedelta(minutes=3),
    )
    digest = Job.objects.filter(job_type="emails.weekly_digest", bindings__isnull=False).order_by("id").first()
    assert digest is not None
    Job.objects.filter(pk=digest.pk).update(
        status=JobStatus.SUCCEEDED, attempt=1, finished_at=now - timedelta(minutes=9)
    )
    earlier = timedelta(minutes=48)
    IdempotencyBinding.objects.filter(scope="invoice-capture").update(
        created_at=F("created_at") - earlier, expires_at=F("expires_at") - earlier
    )

    showcase = captured[0]
    tell_story(showcase, now, workers)
    dead = Job.objects.filter(status=JobStatus.DEAD, job_type="emails.send_receipt").order_by("id").first()
    cancellable = Job.objects.filter(status=JobStatus.QUEUED, queue="default", run_at__gt=now).order_by("id").first()
    assert dead is not None and cancellable is not None
    return Showcase(job=Job.objects.get(pk=showcase.pk), dead=dead, cancellable=cancellable)


def tell_story(job: Job, now: datetime, workers: list[str]) -> None:
    """Give ``job`` the history of a capture that failed once, then succeeded."""
    start = now - timedelta(minutes=48)
    payload = {
        "invoice_id": "inv_2024_00801",
        "customer_id": "cus_Q2xY8",
        "amount": {"currency": "EUR", "value": "129.90"},
        "capture_method": "automatic",
        "metadata": {"order": "ORD-58213", "channel": "web"},
    }
    Job.objects.filter(pk=job.pk).update(
        payload=payload,
        created_at=start,
        run_at=start,
        attempt=2,
        max_attempts=5,
        started_at=start + timedelta(seconds=31),
        finished_at=start + timedelta(seconds=33),
        claimed_by=workers[1],
        tags=["invoices", "web"],
        result={"charge_id": "ch_3PQk2LJx9aFz", "captured": True, "amount": "129.90", "currency": "EUR"},
    )
    JobEvent.objects.filter(job=job).update(at=start)
    story = [
        (0.4, "claimed", 1, {"worker": workers[0]}),
        (1.1, "failed", 1, {"error": "APIConnectionError: Could not connect to Stripe (read timeout)"}),
        (1.1, "retry_scheduled", 1, {"run_at": (start + timedelta(seconds=31)).isoformat(timespec="seconds")}),
        (31.2, "claimed", 2, {"worker": workers[1]}),
        (32.0, "checkpoint_saved", 2, {"name": "authorize"}),
        (32.9, "succeeded", 2, {}),
    ]
    for seconds, kind, attempt, details in story:
        JobEvent.objects.create(
            job=job, kind=kind, attempt=attempt, at=start + timedelta(seconds=seconds), details=details
        )
    Checkpoint.objects.create(
        job=job,
        name="authorize",
        value={"authorization_id": "pi_3PQk2LJx9aFz", "status": "requires_capture"},
        attempt=2,
        created_at=start + timedelta(seconds=32),
    )


# -- the test ------------------------------------------------------------------------------------


def orm(work: Callable[[], T]) -> T:
    """Run database code on a thread of its own, and close its connection there.

    While Playwright's sync API is open it keeps an event loop on the test's thread, where Django
    refuses synchronous database access (rightly: a connection opened there would outlive the test).
    """

    def run() -> T:
        try:
            return work()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


def depths_by_queue() -> dict[str, dict[str, str]]:
    """What the dashboard should show, counted with the ORM."""
    now = timezone.now()
    return {
        queue: {
            "ready": str(Job.objects.filter(queue=queue, status=JobStatus.QUEUED, run_at__lte=now).count()),
            "dead": str(Job.objects.filter(queue=queue, status=JobStatus.DEAD).count()),
        }
        for queue in QUEUES
    }


def test_operator_works_the_admin_in_a_real_browser(live_server, django_user_model):
    from playwright.sync_api import sync_playwright

    now = timezone.now()
    showcase = populate(now)
    user = django_user_model.objects.create_user(USERNAME, password=PASSWORD, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="workhorse"))
    expected_depths = depths_by_queue()
    bindings = IdempotencyBinding.objects.count()
    url = live_server.url

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport=VIEWPORT, color_scheme="light", locale="en-US", timezone_id="UTC")
            try:
                context.set_default_timeout(TIMEOUT_MS)
                # the model list in the side bar open, as it is until an operator folds it
                context.add_init_script("window.localStorage.setItem('django.admin.navSidebarIsOpen', 'true')")
                page = context.new_page()

                # log in; the admin sends us on to the dashboard
                response = page.goto(f"{url}/admin/login/?next=/admin/workhorse/job/dashboard/")
                assert response is not None and response.ok, (
                    "the live server cannot serve pages: was it started, without a STATIC_URL, before this module?"
                )
                page.fill("#id_username", USERNAME)
                page.fill("#id_password", PASSWORD)
                page.click("input[type=submit]")
                page.wait_for_url("**/admin/workhorse/job/dashboard/")
                assert page.locator("#workhorse-queues").is_visible()
                for queue, expected in expected_depths.items():
                    row = page.locator(f'tr[data-queue="{queue}"]')
                    assert {
                        field: row.locator(f'td[data-field="{field}"]').inner_text() for field in expected
                    } == expected
                assert int(page.locator('[data-field="total"]').inner_text()) > 300
                assert page.locator("#workhorse-throughput rect.ok").count() > 50

                # a job's page: payload, result, key, history
                page.goto(f"{url}/admin/workhorse/job/{showcase.job.pk}/change/")
                assert "inv_2024_00801" in page.locator("#workhorse-payload").inner_text()
                assert "ch_3PQk2LJx9aFz" in page.locator("#workhorse-result").inner_text()
                assert "idempotency key capture:…0801" in page.locator("#workhorse-binding").inner_text()
                assert page.locator("#workhorse-events tbody tr").count() == 7

                # the key's binding, one click away
                page.click("#workhorse-binding a")
                page.wait_for_url("**/admin/workhorse/idempotencybinding/*/change/")
                assert "invoice-capture" in page.inner_text("#content")
                page.goto(f"{url}/admin/workhorse/idempotencybinding/")
                assert page.locator("#result_list tbody tr").count() == bindings == 12

                # redrive a dead letter: select it, run the action, read the preview, confirm
                page.goto(f"{url}/admin/workhorse/deadjob/")
                page.check(f'input[name="_selected_action"][value="{showcase.dead.pk}"]')
                page.select_option('select[name="action"]', "redrive_jobs")
                page.click('button[name="index"]')
                preview = page.locator("#workhorse-preview")
                assert f"#{showcase.dead.pk}" in preview.inner_text()
                assert "SMTP" in preview.inner_text()
                assert not orm(Redrive.objects.filter(source=showcase.dead).exists)  # not before confirming
                page.click("#workhorse-confirm")
                page.wait_for_url("**/admin/workhorse/deadjob/")
                assert "Redrove 1 job(s)" in page.locator(".messagelist").inner_text()
                assert orm(Redrive.objects.filter(source=showcase.dead).count) == 1

                # cancel a scheduled job from the job list
                page.goto(f"{url}/admin/workhorse/job/?q={showcase.cancellable.pk}")
                page.check(f'input[name="_selected_action"][value="{showcase.cancellable.pk}"]')
                page.select_option('select[name="action"]', "cancel_jobs")
                page.click('button[name="index"]')
                assert "Cancelled 1 queued job(s)" in page.locator(".messagelist").inner_text()
            finally:
                context.close()
        finally:
            browser.close()

    redriven = Redrive.objects.select_related("new_job").get(source=showcase.dead)
    assert redriven.requested_by == f"admin:{USERNAME}"
    assert (redriven.new_job.status, redriven.new_job.job_type) == (JobStatus.QUEUED, "emails.send_receipt")
    assert Job.objects.get(pk=showcase.dead.pk).status == JobStatus.DEAD
    assert Job.objects.get(pk=showcase.cancellable.pk).status == JobStatus.CANCELLED
    [cancelled] = JobEvent.objects.filter(job=showcase.cancellable, kind="cancelled")
    assert cancelled.details == {"requested_by": f"admin:{USERNAME}"}


# -- every page fits a laptop's window, with the admin's side bar open ----------------------------

# What an admin grows on: long dotted job types, long queues and scopes, errors with a long first line.
LONG_TYPES = (
    "integrations.salesforce.sync_opportunity_line_items_for_enterprise_accounts",
    "reporting.exports.build_quarterly_revenue_recognition_workbook_per_region",
)
LONG_ERROR = (
    "SalesforceApiError: REQUEST_LIMIT_EXCEEDED: TotalRequests Limit exceeded for organisation 00D5e000000XyZa "
    "while syncing opportunity 0065e00000AbCdEfGh (line items 1-200 of 1,250); the daily API allowance resets "
    "at 00:00 America/Los_Angeles, retry after https://status.salesforce.example/incidents/2024-06-11-api-limits"
)
SCHEDULE_TASK = "tests.admin_browser.nightly_report"
SCHEDULES = {
    name: {"task": SCHEDULE_TASK, **timing}
    for name, timing in (
        (
            "reporting.quarterly_revenue_workbook",
            {"cron": "15 2 * * 1-5", "timezone": "America/Argentina/Buenos_Aires"},
        ),
        ("billing.dunning_reminders_for_overdue_invoices", {"cron": "0 9,13,17 * * *", "timezone": "Europe/Berlin"}),
        ("search.reindex_stale_products", {"every": timedelta(minutes=5)}),
        ("emails.weekly_digest", {"cron": "0 7 * * 1", "timezone": "Australia/Lord_Howe"}),
        ("integrations.salesforce.full_backfill", {"cron": "30 3 1 * *", "timezone": "Pacific/Chatham"}),
        ("housekeeping.expire_carts", {"every": timedelta(hours=1, minutes=30)}),
    )
}
# Each page an operator visits, by the screenshot it makes (None: checked, not photographed).
LAYOUT_PAGES = (
    ("admin-jobs.png", "/admin/workhorse/job/"),
    ("admin-job.png", "/admin/workhorse/job/{job}/change/"),
    ("admin-dead-letters.png", "/admin/workhorse/deadjob/"),
    ("admin-bindings.png", "/admin/workhorse/idempotencybinding/"),
    ("admin-ledger.png", "/admin/workhorse/effectrecord/"),
    ("admin-workers.png", "/admin/workhorse/workerrecord/"),
    ("admin-schedules.png", "/admin/workhorse/schedulestate/"),
    ("admin-dashboard.png", "/admin/workhorse/job/dashboard/"),
    (None, "/admin/workhorse/queuestate/"),
    (None, "/admin/workhorse/job/{failing}/change/"),
    (None, "/admin/workhorse/schedulestate/{schedule}/change/"),
    (None, "/admin/workhorse/breaker/"),
    (None, "/admin/workhorse/breaker/{breaker}/change/"),
    ("admin-workflows.png", "/admin/workhorse/workflow/"),
    ("admin-workflow.png", "/admin/workhorse/workflow/{workflow}/change/"),
    (None, "/admin/"),
)
FULL_PAGE_SHOTS = ("admin-job.png", "admin-workflow.png")  # pages whose lower half the docs show
# Whatever is wider than the box it sits in: the results table (its box scrolls instead of showing
# every column), any table in the page's main content, or the page itself. <pre> blocks scroll on purpose.
OVERFLOWS = """() => {
  const wide = [];
  const main = document.querySelector('#content-main') || document.querySelector('#content');
  const edge = main.getBoundingClientRect().right + 1;
  const list = document.querySelector('#result_list');
  if (list && list.scrollWidth > list.closest('.results').clientWidth) {
    wide.push(`#result_list ${list.scrollWidth} px in ${list.closest('.results').clientWidth} px`);
  }
  for (const table of main.querySelectorAll('table')) {
    if (table.getBoundingClientRect().right > edge) wide.push(`table ${table.id || table.className} past the edge`);
  }
  const page = document.documentElement;
  if (page.scrollWidth > page.clientWidth) wide.push(`page ${page.scrollWidth} px in ${page.clientWidth} px`);
  return wide;
}"""


@register(SCHEDULE_TASK)
def nightly_report(payload: Any) -> Any:
    return payload


@dataclass
class Crowd:
    failing: Job  # waiting for its next attempt, after a long error
    schedule: int  # a schedule's id
    workflow: int  # a wide workflow, its first step dead


def wide_workflow() -> int:
    """A keyed fulfilment workflow with long step names, a fan-out of 12 and a dead first step."""
    from django_workhorse import EnqueueRequest
    from django_workhorse.workflows import Workflow

    wf = Workflow(
        "fulfil order ORD-58213 for customer-portal.example.com",
        idempotency=Idempotency("fulfil:ORD-58213", scope="shop.fulfilment.orders-from-customer-portal"),
    )
    charge = wf.add("charge the card at stripe (payment intent)", EnqueueRequest(LONG_TYPES[0], {"order": 58213}))
    middle = [
        wf.add(
            f"pack parcel {n} at warehouse eu-central-{n}", EnqueueRequest(LONG_TYPES[1], {"parcel": n}), after=[charge]
        )
        for n in range(12)
    ]
    wf.add("mail the receipt", EnqueueRequest(LONG_TYPES[1], {"order": 58213}), after=[charge], allow_failure=True)
    wf.add("close the order and notify the customer", EnqueueRequest(LONG_TYPES[0], {"order": 58213}), after=middle)
    result = wf.enqueue()
    Job.objects.filter(pk=result.jobs["charge the card at stripe (payment intent)"]).update(
        status=JobStatus.DEAD, attempt=8, last_error=LAST_ERROR.format(LONG_ERROR), finished_at=timezone.now()
    )
    return result.workflow_id


def breaker(now: datetime) -> str:
    """An open circuit breaker with a long destination key and long transitions; its admin URL's pk."""
    from django.contrib.admin.utils import quote

    from django_workhorse.models import Breaker

    key = "smtp:" + "outbound-relay." * 14 + "example.com"
    reason = "5 failures within 60 s"
    transitions = [{"from": "closed", "to": "open", "at": now.isoformat(), "reason": reason}] * 20
    Breaker.objects.create(
        key=key,
        state="open",
        opened_at=now,
        open_until=now + timedelta(minutes=5),
        cooldown=timedelta(minutes=5),
        policy={"failures": 5, "within": 60.0, "cooldown": 300.0, "probes": 1, "max_cooldown": 600.0},
        recent_failures=[now.timestamp()] * 5,
        transitions=transitions,
        changed_at=now,
    )
    return str(quote(key))


def crowd(now: datetime) -> Crowd:
    """What makes columns wide: long types and errors, failing jobs, long scopes, ledger entries, schedules."""
    jobs = []
    for n in range(8):
        jobs.append(
            JobFactory.build(
                job_type=LONG_TYPES[n % 2],
                queue="integrations-salesforce-backfill",
                status=JobStatus.QUEUED,
                attempt=2 + n % 3,
                max_attempts=8,
                run_at=now + timedelta(minutes=3 + 7 * n),
                created_at=now - timedelta(hours=2, minutes=n),
                last_error=LAST_ERROR.format(LONG_ERROR),
                tags=["salesforce", "backfill", f"region-{n % 3}"],
            )
        )
        jobs.append(
            JobFactory.build(
                job_type=LONG_TYPES[(n + 1) % 2],
                queue="integrations-salesforce-backfill",
                status=JobStatus.DEAD,
                attempt=8,
                max_attempts=8,
                started_at=now - timedelta(minutes=n),
                finished_at=now - timedelta(minutes=n),
                created_at=now - timedelta(hours=3, minutes=n),
                last_error=LAST_ERROR.format(LONG_ERROR),
            )
        )
    Job.objects.bulk_create(jobs)
    for n in range(4):
        enqueue(
            LONG_TYPES[0],
            {"opportunity": f"0065e00000AbCdEf{n:02d}"},
            queue="integrations-salesforce-backfill",
            idempotency=Idempotency(
                f"salesforce:opportunity:0065e00000AbCdEf{n:02d}:line-items",
                scope="integrations.salesforce.opportunity-sync",
            ),
        )
    for n in range(6):
        once(
            f"stripe:refund:re_3PQk2LJx9aFz{n:02d}:order:ORD-58213-{n}",
            lambda n=n: {"refund_id": f"re_3PQk2LJx9aFz{n:02d}", "amount": "129.90", "currency": "EUR"},
            scope="billing.refunds.stripe-payment-intents",
        )
    for n in range(4):
        key = f"checkout-7f3a9c2e-{n:04d}-4b1d-9e8f-2a6c5d4e3f21"
        scope = "shop.checkout.create-order-from-cart"
        EffectRecord.objects.create(
            kind="http",
            scope=scope,
            key_hash=key_hash(scope, key),
            key_preview=key_preview(key),
            owner=f"user:{4711 + n}:customer-portal.example.com",
            status_code=201,
            request_digest=bytes(32),
            field_digests={"method": "00" * 6, "path": "11" * 6, "body": "22" * 6},
            response_headers={"Content-Type": "application/json"},
            response_body=b'{"order": "ORD-58213"}',
            created_at=now - timedelta(minutes=n),
            completed_at=now - timedelta(minutes=n),
            expires_at=now + timedelta(hours=24),
        )
    WorkerRecord.objects.create(
        name="app-4.prod-eu-central-1.internal:31068:x81c",
        host="app-4.prod-eu-central-1.internal",
        pid=31_068,
        queues=["integrations-salesforce-backfill", "billing", "emails", "default"],
        concurrency=16,
        started_at=now - timedelta(days=2),
        heartbeat_at=now - timedelta(minutes=42),  # stopped: stale
    )
    enqueue_due_schedules(now)
    failing = Job.objects.filter(status=JobStatus.QUEUED, attempt__gt=0, job_type=LONG_TYPES[0]).order_by("id").first()
    assert failing is not None
    schedule = ScheduleState.objects.order_by("name").values_list("pk", flat=True)[0]
    return Crowd(failing=failing, schedule=schedule, workflow=wide_workflow())


def test_every_page_fits_1280_pixels_with_the_side_bar_open(live_server, django_user_model, settings, tmp_path):
    from playwright.sync_api import sync_playwright

    settings.WORKHORSE_SCHEDULES = SCHEDULES
    now = timezone.now()
    showcase = populate(now)
    extra = crowd(now)
    user = django_user_model.objects.create_user(USERNAME, password=PASSWORD, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="workhorse"))
    ids = {
        "job": showcase.job.pk,
        "failing": extra.failing.pk,
        "schedule": extra.schedule,
        "breaker": breaker(now),
        "workflow": extra.workflow,
    }
    shots = tmp_path / "screenshots"
    seen = {}

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport=VIEWPORT, color_scheme="light", locale="en-US", timezone_id="UTC")
            try:
                context.set_default_timeout(TIMEOUT_MS)
                context.add_init_script("window.localStorage.setItem('django.admin.navSidebarIsOpen', 'true')")
                page = context.new_page()
                page.goto(f"{live_server.url}/admin/login/?next=/admin/")
                page.fill("#id_username", USERNAME)
                page.fill("#id_password", PASSWORD)
                page.click("input[type=submit]")
                page.wait_for_url("**/admin/")
                for shot, path in LAYOUT_PAGES:
                    response = page.goto(live_server.url + path.format(**ids))
                    assert response is not None and response.ok, path
                    if path != "/admin/":
                        assert page.locator("#nav-sidebar").is_visible(), path
                    seen[path] = page.evaluate(OVERFLOWS)
                    if shot is not None:
                        page.screenshot(path=shots / shot, full_page=shot in FULL_PAGE_SHOTS)
            finally:
                context.close()
        finally:
            browser.close()

    clipped = [f"{path}: {'; '.join(wide)}" for path, wide in seen.items() if wide]
    assert not clipped, "\n".join(clipped)
    made = [shot for shot, _ in LAYOUT_PAGES if shot is not None]
    for name in made:
        shot = shots / name
        assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name
        assert shot.stat().st_size < 400_000, f"{name} is {shot.stat().st_size} bytes"
    if target := os.environ.get("WORKHORSE_SCREENSHOTS_DIR"):
        Path(target).mkdir(parents=True, exist_ok=True)
        for name in made:
            shutil.copyfile(shots / name, Path(target) / name)
