"""What the admin shows so that it fits and reads first what matters: failing jobs (a state, a
filter, the dashboard's count by queue), the last error's first line with the whole line on hover,
a job's page leading with status and error and folding its internals, the retry policy in words,
one time format, stale workers, and the dashboard linked from the app's index page.

How wide the pages are is checked in a real browser, in ``test_admin_browser.py``.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from html import unescape

import pytest
from django.utils import timezone

from django_workhorse.admin.display import retry_policy_words
from django_workhorse.models import Job, JobStatus, WorkerRecord
from django_workhorse.tasks.retry import RetryPolicy
from tests.factories import JobFactory
from tests.test_admin import DASHBOARD, JOBS, VIEW_PERMS, WORKERS, body, change_url, login, result_ids, section

pytestmark = pytest.mark.django_db

LONG_LINE = "SalesforceApiError: REQUEST_LIMIT_EXCEEDED " + "x" * 300
ERROR = f'{LONG_LINE}\nTraceback (most recent call last):\n  File "sync.py", line 3, in run\n{LONG_LINE}\n'


def failing_job(**fields):
    return JobFactory(status=JobStatus.QUEUED, attempt=2, max_attempts=8, last_error=ERROR, **fields)


def test_failing_jobs_are_a_state_and_a_filter_of_the_job_list(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    failing = failing_job(run_at=timezone.now() + timedelta(minutes=5))
    JobFactory(status=JobStatus.QUEUED)  # never ran
    JobFactory(status=JobStatus.QUEUED, attempt=1)  # released by a worker shutting down: no error
    JobFactory(status=JobStatus.DEAD, attempt=8, max_attempts=8, last_error=ERROR)

    assert result_ids(client.get(f"{JOBS}?status=failing")) == {failing.pk}
    assert len(result_ids(client.get(f"{JOBS}?status=queued"))) == 3
    row = re.search(rf"<tr>(?:(?!</tr>).)*?>{failing.pk}</a>.*?</tr>", body(client.get(JOBS)), re.DOTALL)
    assert row is not None and ">failing<" in row.group(0) and "2/8" in row.group(0)
    assert "Failing (waiting for a retry)" in body(client.get(JOBS))


def test_the_job_list_shows_the_last_errors_first_line_cut_and_whole_on_hover(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    failing_job()

    page = body(client.get(JOBS))

    assert f'class="workhorse-cut wide" title="{LONG_LINE}">{LONG_LINE}</span>' in unescape(page)
    assert "Traceback (most recent call last)" not in page  # only the first line


def test_a_jobs_page_leads_with_status_and_error_and_folds_the_internals(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    job = failing_job(
        job_type="billing.capture_invoice",
        queue="billing",
        lease_token=uuid.uuid4(),
        trace_context={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
    )

    page = body(client.get(change_url(JOBS, job.pk)))

    lead = page[: page.index('id="workhorse-payload"')]
    for label in ("Job type", "Queue", "Status", "Attempts", "Last error"):
        assert f"{label}:</label>" in lead, label
    assert "failing (queued, waiting for a retry)" in lead and "2/8" in lead
    assert '<pre class="workhorse-traceback">' in lead and "Traceback (most recent call last):" in unescape(lead)
    assert "Lease token" not in lead and "Trace context" not in lead
    folded = page[page.index('id="workhorse-checkpoints"') :]
    assert folded.count('class="module aligned collapse"') == 2
    assert "Lease token" in folded and "4bf92f3577b34da6a3ce929d0e0e4736" in folded
    assert (
        page.index('id="workhorse-payload"')
        < page.index('id="workhorse-events"')
        < page.index('id="workhorse-binding"')
    )
    assert "exponential backoff from 1 s, ×2, up to 1 h, jitter up to 10 %" in page


def test_every_instant_on_a_jobs_page_is_utc_to_the_second(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    job = failing_job()
    Job.objects.filter(pk=job.pk).update(run_at=job.created_at.replace(microsecond=123456))

    page = body(client.get(change_url(JOBS, job.pk)))

    assert f"{job.created_at:%Y-%m-%d %H:%M:%S} UTC" in page
    assert "a.m." not in page and "p.m." not in page  # not Django's long format
    assert ".123456" not in page


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        (RetryPolicy(), "exponential backoff from 1 s, ×2, up to 1 h, jitter up to 10 %"),
        (RetryPolicy.fixed(timedelta(seconds=90)), "fixed: 1.5 min between attempts, no jitter"),
        (
            RetryPolicy(base=timedelta(milliseconds=250), factor=1.5, max_delay=timedelta(days=2), jitter=0.25),
            "exponential backoff from 250 ms, ×1.5, up to 2 d, jitter up to 25 %",
        ),
    ],
)
def test_retry_policies_read_in_words(policy, words):
    assert retry_policy_words(policy.to_json()) == words


def test_a_retry_policy_this_code_cannot_read_shows_as_stored():
    assert '"kind": "quadratic"' in retry_policy_words({"kind": "quadratic"})


def test_workers_whose_heartbeat_stopped_are_stale_in_the_list_and_the_dashboard(client, django_user_model, settings):
    settings.WORKHORSE_WORKER_STALE_AFTER = timedelta(minutes=5)
    login(client, django_user_model, "viewer", VIEW_PERMS)
    now = timezone.now()
    for name, age in (("w-alive", timedelta(seconds=3)), ("w-stale", timedelta(minutes=6))):
        WorkerRecord.objects.create(
            name=name, host="h", pid=1, queues=["default"], concurrency=1, started_at=now, heartbeat_at=now - age
        )

    listing = body(client.get(WORKERS))
    dashboard = section(body(client.get(DASHBOARD)), "workhorse-workers")

    for page in (listing, dashboard):
        rows = dict(re.findall(r'title="(w-\w+)">.*?(<td.*?)</tr>', page, re.DOTALL))
        assert ">stale<" in rows["w-stale"] and ">alive<" in rows["w-alive"]
        assert ">alive<" not in rows["w-stale"]


def test_the_dashboard_counts_failing_jobs_by_queue(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    for queue, count in (("billing", 3), ("emails", 1)):
        for _ in range(count):
            failing_job(queue=queue)
    JobFactory(queue="emails", status=JobStatus.QUEUED)

    page = body(client.get(DASHBOARD))

    failing = page[page.index('id="workhorse-failing"') : page.index('id="workhorse-throughput"')]
    assert re.search(r'data-field="failing-total">4<', failing)
    counts = dict(re.findall(r'data-failing-queue="(\w+)">.*?data-field="failing">(\d+)<', failing, re.DOTALL))
    assert counts == {"billing": "3", "emails": "1"}
    assert f'href="{JOBS}?status=failing&amp;queue=billing"' in failing


def test_the_dashboard_says_when_nothing_is_failing(client, django_user_model):
    login(client, django_user_model, "viewer", ("view_job",))

    assert "No failing jobs" in body(client.get(DASHBOARD))


def test_the_apps_index_page_links_the_dashboard(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    assert f'href="{DASHBOARD}"' in body(client.get("/admin/workhorse/"))


def test_the_apps_index_page_offers_the_dashboard_only_to_who_may_view_jobs(client, django_user_model):
    login(client, django_user_model, "binder", ("view_idempotencybinding",))

    assert f'href="{DASHBOARD}"' not in body(client.get("/admin/workhorse/"))


ENTRY = "/admin/workhorse/dashboard/"


def test_the_admin_index_and_side_bar_list_the_dashboard_which_leads_to_it(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    index = body(client.get("/admin/"))
    entry = client.get(ENTRY)

    assert f'href="{ENTRY}"' in index and ">Dashboard<" in index
    assert (entry.status_code, entry["Location"]) == (302, DASHBOARD)
    assert f'href="{ENTRY}"' in body(client.get(JOBS))  # the side bar, on every page


def test_the_admin_index_lists_the_dashboard_only_for_who_may_view_jobs(client, django_user_model):
    login(client, django_user_model, "binder", ("view_idempotencybinding",))

    assert f'href="{ENTRY}"' not in body(client.get("/admin/"))
    assert client.get(ENTRY).status_code == 403


def test_the_workers_list_shows_a_supervisor_its_children_and_what_each_is_doing(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    now = timezone.now()
    rows = [("w-boss", "supervisor", "", "draining"), ("w-boss/0.1", "child", "w-boss", "recycling")]
    for name, kind, supervisor, state in rows:
        WorkerRecord.objects.create(
            name=name, host="h", pid=1, queues=["default"], concurrency=1, started_at=now, heartbeat_at=now,
            kind=kind, supervisor=supervisor, state=state,
        )  # fmt: skip

    listing = body(client.get(WORKERS))

    cells = dict(re.findall(r'title="(w-[\w/.]+)">.*?(<td.*?)</tr>', listing, re.DOTALL))
    assert ">supervisor<" in cells["w-boss"] and "draining" in cells["w-boss"]
    assert ">child<" in cells["w-boss/0.1"] and "of w-boss" in cells["w-boss/0.1"]
    assert "recycling" in cells["w-boss/0.1"] and "recycling" not in cells["w-boss"]
