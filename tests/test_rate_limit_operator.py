"""What operators see of rate limits: workhorse_status (text and JSON), the dashboard, the metrics
gauges (by limit name, partitions summed) and a held job's page and timeline."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from django_workhorse import RateLimit, enqueue, rate_limits
from django_workhorse.models import Job, JobEvent
from django_workhorse.worker.eager import run_job
from tests import rate_tasks  # noqa: F401 (its handlers register on import)
from tests.test_admin import DASHBOARD, JOBS, VIEW_PERMS, body, change_url, login

pytestmark = pytest.mark.django_db
NOOP = "tests.rate.record_start.noop"


@pytest.fixture(autouse=True)
def limits(settings):
    settings.WORKHORSE_RATE_LIMITS = {
        "stripe": RateLimit(1, per=timedelta(hours=1)),
        "accounts": RateLimit(5, partitioned=True),
    }


def _spend() -> int:
    """One stripe job run, a second one held; two partitions of accounts spent once each."""
    assert run_job(enqueue(NOOP, {}, rate_limit="stripe")) == "succeeded"
    held = enqueue(NOOP, {}, rate_limit="stripe")
    assert run_job(held) is None
    rate_limits.acquire("accounts", "a")
    rate_limits.acquire("accounts", "b")
    return held


def status_json() -> dict[str, Any]:
    out = StringIO()
    call_command("workhorse_status", "--json", stdout=out)
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def test_status_shows_each_budget_in_json_and_text():
    assert status_json()["rate_limits"] == []
    _spend()
    by_budget = {(b["name"], b["partition"]): b for b in status_json()["rate_limits"]}
    assert set(by_budget) == {("stripe", ""), ("accounts", "a"), ("accounts", "b")}
    assert (by_budget["stripe", ""]["admitted"], by_budget["stripe", ""]["deferred"]) == (1, 1)
    assert by_budget["stripe", ""]["available"] == 0
    assert by_budget["accounts", "a"]["available"] == 0  # 5/s with no burst: one start, then 200 ms
    out = StringIO()
    call_command("workhorse_status", stdout=out)
    text = out.getvalue()
    assert "Rate limits\n" in text and "available now" in text and "stripe" in text


def test_a_budget_of_a_limit_removed_from_settings_reads_unlimited(settings):
    _spend()
    settings.WORKHORSE_RATE_LIMITS = {}
    assert {b["available"] for b in status_json()["rate_limits"]} == {None}


def test_the_gauges_show_each_limit_with_its_partitions_summed():
    pytest.importorskip("prometheus_client")
    from django_workhorse.observability.metrics.gauges import DatabaseGauges

    _spend()
    metrics = {metric.name: metric for metric in DatabaseGauges(ttl=0).collect()}
    admitted = {s.labels["limit"]: s.value for s in metrics["workhorse_rate_limit_admitted"].samples}
    deferred = {s.labels["limit"]: s.value for s in metrics["workhorse_rate_limit_deferred"].samples}
    available = {s.labels["limit"]: s.value for s in metrics["workhorse_rate_limit_available"].samples}
    assert admitted == {"stripe": 1.0, "accounts": 2.0}
    assert deferred == {"stripe": 1.0, "accounts": 0.0}
    assert available == {"stripe": 0.0, "accounts": 0.0}


def test_the_dashboard_lists_the_budgets(client, django_user_model):
    _spend()
    login(client, django_user_model, "viewer", VIEW_PERMS)
    page = body(client.get(DASHBOARD))
    assert 'id="workhorse-rate-limits"' in page and 'data-limit="stripe"' in page


def test_a_held_jobs_page_and_timeline_name_the_rate_limit(client, django_user_model):
    held = _spend()
    job = Job.objects.get(pk=held)
    event = JobEvent.objects.get(job_id=held, kind="held")
    assert event.details["rate_limit"] == "stripe"
    login(client, django_user_model, "viewer", VIEW_PERMS)
    page = body(client.get(change_url(JOBS, job.pk)))
    assert f"queued, held by rate limit stripe since {job.held_since:%Y-%m-%d %H:%M:%S} UTC" in page
    assert "rate_limit" in page and "until" in page  # the timeline's held event, with its details
