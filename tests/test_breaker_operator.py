"""What an operator sees and does with circuit breakers: the admin page and its reset (behind
``workhorse.reset_breaker``), the job page's held line, ``workhorse_status`` and the gauges."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_workhorse import breaker_states, enqueue
from django_workhorse.models import Breaker as BreakerRow
from django_workhorse.models import Job
from django_workhorse.worker.eager import run_job
from tests.breaker_tasks import PROVIDER_BREAKER
from tests.test_admin import JOBS, VIEW_PERMS, action_choices, body, change_url, login, messages_of, post_action

pytestmark = pytest.mark.django_db

BREAKERS = "/admin/workhorse/breaker/"
VIEW = (*VIEW_PERMS, "view_breaker")


def open_breaker(key: str, *, hours: float = 1) -> BreakerRow:
    now = timezone.now()
    return BreakerRow.objects.create(
        key=key,
        state="open",
        opened_at=now,
        open_until=now + timedelta(hours=hours),
        cooldown=PROVIDER_BREAKER.cooldown,
        probes=1,
        policy=PROVIDER_BREAKER.to_json(),
        recent_failures=[now.timestamp() - 1, now.timestamp() - 120],
        transitions=[{"from": "closed", "to": "open", "at": now.isoformat(), "reason": "3 failures within 60 s"}],
        changed_at=now,
    )


def held_job(key: str) -> int:
    job_id = enqueue("tests.record", {}, breaker_key=key)
    assert run_job(job_id) is None  # the claim holds it
    return job_id


def test_the_breaker_list_shows_state_failures_transitions_and_held_jobs(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW)
    row = open_breaker("smtp:mail.example.com")
    held_job(row.key)
    held_job(row.key)

    page = body(client.get(BREAKERS))

    assert "smtp:mail.example.com" in page
    assert f"open until {row.open_until:%Y-%m-%d %H:%M:%S} UTC" in page
    assert "1/3" in page  # one failure in the last minute, of the three that open it
    assert "closed → open" in page and "3 failures within 60 s" in page
    assert client.get(BREAKERS).context["cl"].result_list[0].held_jobs == 2
    assert client.get(change_url(BREAKERS, row.pk)).status_code == 200


def test_reset_needs_its_permission(client, django_user_model):
    row = open_breaker("smtp:a")
    job_id = held_job(row.key)
    login(client, django_user_model, "viewer", VIEW)
    assert "reset_selected" not in action_choices(client.get(BREAKERS))
    post_action(client, BREAKERS, "reset_selected", [row.pk])
    row.refresh_from_db()
    assert row.state == "open"
    assert Job.objects.get(pk=job_id).held_since is not None


def test_reset_from_the_admin_closes_the_breaker_and_gives_its_jobs_back(client, django_user_model):
    row = open_breaker("smtp:a")
    job_id = held_job(row.key)
    login(client, django_user_model, "operator", (*VIEW, "reset_breaker"))
    assert "reset_selected" in action_choices(client.get(BREAKERS))

    response = post_action(client, BREAKERS, "reset_selected", [row.pk])

    assert response.status_code == 302
    assert "Reset 1 breaker(s); 1 held job(s) are back in their queues." in messages_of(client.get(BREAKERS))
    row.refresh_from_db()
    assert (row.state, row.recent_failures, row.open_until) == ("closed", [], None)
    assert row.transitions[-1]["reason"] == "reset by admin:operator"
    job = Job.objects.get(pk=job_id)
    assert job.held_since is None and job.run_at <= timezone.now()


def test_a_held_jobs_page_says_which_breaker_holds_it_since_when(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW)
    open_breaker("smtp:a")
    job = Job.objects.get(pk=held_job("smtp:a"))
    assert job.held_since is not None

    page = body(client.get(change_url(JOBS, job.pk)))

    assert f"queued, held by breaker smtp:a since {job.held_since:%Y-%m-%d %H:%M:%S} UTC" in page


def status_json() -> dict[str, Any]:
    out = StringIO()
    call_command("workhorse_status", "--json", stdout=out)
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def test_status_lists_breakers_and_warns_of_open_ones():
    assert status_json()["breakers"] == []
    row = open_breaker("smtp:a")
    held_job(row.key)
    BreakerRow.objects.create(
        key="smtp:b", state="closed", policy=PROVIDER_BREAKER.to_json(), changed_at=timezone.now()
    )

    report = status_json()

    by_key = {entry["key"]: entry for entry in report["breakers"]}
    assert by_key["smtp:a"]["state"] == "open" and by_key["smtp:a"]["held_jobs"] == 1
    assert by_key["smtp:a"]["effective"].startswith("open until ")
    assert by_key["smtp:a"]["transitions"][-1]["to"] == "open"
    assert by_key["smtp:b"]["effective"] == "closed"
    [warning] = [w for w in report["warnings"] if w["kind"] == "breaker_open"]
    assert warning["names"] == [{"name": "smtp:a", "jobs": 1}]

    out = StringIO()
    call_command("workhorse_status", stdout=out)
    text = out.getvalue()
    assert "Circuit breakers open or half-open (their jobs are held) (1): smtp:a (1 held)" in text
    assert "Circuit breakers\n" in text and "closed -> open: 3 failures within 60 s" in text


def test_an_open_breaker_whose_cooldown_passed_reads_half_open():
    row = open_breaker("smtp:a", hours=-1)
    [status] = breaker_states()
    assert (status.key, status.state, status.effective) == (row.key, "open", "half-open")


def test_the_gauges_show_each_breakers_state_and_held_jobs():
    pytest.importorskip("prometheus_client")
    from django_workhorse.observability.metrics.gauges import DatabaseGauges

    open_breaker("smtp:a")
    held_job("smtp:a")
    metrics = {metric.name: metric for metric in DatabaseGauges(ttl=0).collect()}
    states = {tuple(sample.labels.values()): sample.value for sample in metrics["workhorse_breaker_state"].samples}
    assert states == {("smtp:a", "closed"): 0.0, ("smtp:a", "open"): 1.0, ("smtp:a", "half_open"): 0.0}
    [held] = metrics["workhorse_breaker_held_jobs"].samples
    assert (held.labels, held.value) == ({"key": "smtp:a"}, 1.0)
