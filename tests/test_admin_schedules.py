"""The admin's schedules: the list (next ticks, last job, state), its actions and their permissions,
the detail page and the dashboard's next ticks, with schedules active, paused and inactive."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from html import unescape
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_workhorse import enqueue_due_schedules, pause_schedules, register, run_schedule_now
from django_workhorse.models import Job, JobStatus, ScheduleEvent, ScheduleState
from django_workhorse.schedules.definition import Schedule, ticks
from tests.test_admin import (
    DASHBOARD,
    VIEW_PERMS,
    action_choices,
    body,
    change_url,
    confirm,
    confirm_fields,
    login,
    messages_of,
    post_action,
    result_ids,
)
from tests.test_admin_inputs import BEYOND_BIGINT, NOT_UTF8, NUL, is_refused

pytestmark = pytest.mark.django_db

SCHEDULES = "/admin/workhorse/schedulestate/"
VIEW = VIEW_PERMS + ("view_schedulestate",)
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=dt_timezone.utc)
TASK = "tests.admin_schedules.tick"
PARIS = ZoneInfo("Europe/Paris")


@register(TASK)
def tick_handler(payload):
    return payload


DAILY = {"task": TASK, "cron": "30 8 * * *", "timezone": "Europe/Paris"}
MINUTELY = {"task": TASK, "every": timedelta(minutes=1), "kwargs": {"n": 1}}
GONE = {"task": TASK, "every": timedelta(hours=1)}


@dataclass(frozen=True)
class Schedules:
    daily: ScheduleState  # active
    minutely: ScheduleState  # paused, with a job of its last tick
    gone: ScheduleState  # removed from code: inactive
    job: Job  # minutely's last tick


@pytest.fixture
def schedules(settings) -> Schedules:
    settings.WORKHORSE_SCHEDULES = {"daily": DAILY, "minutely": MINUTELY, "gone": GONE}
    enqueue_due_schedules(T0)
    [result] = enqueue_due_schedules(T0 + timedelta(seconds=61))
    settings.WORKHORSE_SCHEDULES = {"daily": DAILY, "minutely": MINUTELY}
    enqueue_due_schedules(T0 + timedelta(seconds=62))
    pause_schedules(["minutely"], requested_by="setup")
    ScheduleState.objects.filter(name="daily").update(last_skip_at=T0, last_skip_reason="catch_up=skip: too late")
    by_name = {s.name: s for s in ScheduleState.objects.all()}
    return Schedules(by_name["daily"], by_name["minutely"], by_name["gone"], Job.objects.get(pk=result.job_id))


def rows(page: str) -> dict[str, str]:
    """The changelist's rows by schedule name, as unescaped HTML."""
    found = {}
    for row in page.split("<tr")[2:]:
        for name in ("daily", "minutely", "gone"):
            if f'title="{name}">{name}</span>' in row:
                found[name] = unescape(row)
    return found


# -- the list ----------------------------------------------------------------------------------------


def test_the_list_shows_next_ticks_last_job_and_state(client, django_user_model, schedules):
    login(client, django_user_model, "viewer", VIEW)
    now = timezone.now()

    by_name = rows(body(client.get(SCHEDULES)))

    assert set(by_name) == {"daily", "minutely", "gone"}
    daily = by_name["daily"]
    expected = ticks(
        Schedule("30 8 * * *", timezone="Europe/Paris"), now, now + timedelta(days=6), limit=5, oldest=True
    )
    assert len(expected) == 5
    for tick in expected[:3]:  # the list shows three, local, with the zone's abbreviation and UTC on hover
        local = tick.astimezone(PARIS)
        assert (
            f'title="{local:%Y-%m-%d} 08:30:00 {local:%Z} = {tick:%Y-%m-%d %H:%M:%S} UTC">{local:%Y-%m-%d} 08:30:00<'
            in daily
        )
    assert f"{expected[3]:%Y-%m-%d %H:%M:%S} UTC" not in daily
    assert "30 8 * * *" in daily and "Europe/Paris" in daily and TASK in daily
    assert "catch_up=skip: too late" in daily and "2026-06-01 12:00:00 UTC" in daily
    minutely = by_name["minutely"]
    assert "every 0:01:00" in minutely and "— (paused)" in minutely
    assert f'<a href="{change_url("/admin/workhorse/job/", schedules.job.pk)}">#{schedules.job.pk}</a> (queued)' in (
        minutely
    )
    gone = by_name["gone"]
    assert "every 1:00:00" in gone and "— (inactive)" in gone  # from its stored definition


def test_a_pruned_last_job_and_an_unreadable_definition_still_render(client, django_user_model, schedules):
    login(client, django_user_model, "viewer", VIEW)
    Job.objects.filter(pk=schedules.job.pk).delete()
    ScheduleState.objects.filter(name="gone").update(definition=["not", "a", "definition"])

    by_name = rows(body(client.get(SCHEDULES)))

    assert f"#{schedules.job.pk} (pruned)" in by_name["minutely"]
    assert client.get(change_url(SCHEDULES, schedules.gone.pk)).status_code == 200


def test_the_list_reads_last_job_statuses_in_its_own_query(client, django_user_model, schedules, settings):
    login(client, django_user_model, "viewer", VIEW)
    with CaptureQueriesContext(connection) as few:
        assert client.get(SCHEDULES).status_code == 200
    more = {f"extra-{i}": MINUTELY for i in range(10)}
    settings.WORKHORSE_SCHEDULES = {"daily": DAILY, "minutely": MINUTELY, **more}
    enqueue_due_schedules(T0 + timedelta(minutes=5))
    enqueue_due_schedules(T0 + timedelta(minutes=6, seconds=1))
    assert ScheduleState.objects.exclude(last_job_id=None).count() == 11  # the extras ran, and minutely before

    with CaptureQueriesContext(connection) as many:
        assert client.get(SCHEDULES).status_code == 200

    assert len(many) == len(few)


def test_an_active_schedule_this_code_does_not_declare_has_no_next_ticks(client, django_user_model, schedules):
    login(client, django_user_model, "viewer", VIEW)
    ScheduleState.objects.filter(name="gone").update(active=True)  # another host's code still declares it

    assert "— (not declared in this code)" in rows(body(client.get(SCHEDULES)))["gone"]


def test_filters_and_search(client, django_user_model, schedules):
    login(client, django_user_model, "viewer", VIEW)

    def listed(query: str) -> set[int]:
        return result_ids(client.get(f"{SCHEDULES}?{query}"))

    assert listed("paused__exact=1") == {schedules.minutely.pk}
    assert listed("paused__exact=0") == {schedules.daily.pk, schedules.gone.pk}
    assert listed("active__exact=0") == {schedules.gone.pk}
    assert listed("active__exact=1") == {schedules.daily.pk, schedules.minutely.pk}
    assert listed("q=dail") == {schedules.daily.pk}
    assert listed("q=tests.admin_schedules") == {schedules.daily.pk, schedules.minutely.pk, schedules.gone.pk}
    assert listed(f"q={NOT_UTF8}") == set()  # replacement characters: no match


@pytest.mark.parametrize(
    "query",
    [
        f"paused__exact={NUL}",
        "paused__exact=maybe",
        f"active__exact=1{NUL}",
        f"q=a{NUL}b",
        f"name=a{NUL}",
        f"id={BEYOND_BIGINT}",
        "id=abc",
        f"last_job_id={BEYOND_BIGINT}",
        "evaluated_until__gte=never",
        "nope=1",
    ],
)
def test_a_bad_query_string_is_refused_not_a_server_error(client, django_user_model, schedules, query):
    login(client, django_user_model, "viewer", VIEW)
    assert is_refused(client.get(f"{SCHEDULES}?{query}"))


@pytest.mark.parametrize("object_id", ["0", BEYOND_BIGINT, "abc", "1%00"])
def test_a_detail_page_of_an_impossible_id_says_it_does_not_exist(client, django_user_model, schedules, object_id):
    login(client, django_user_model, "viewer", VIEW)
    response = client.get(f"{SCHEDULES}{object_id}/change/", follow=True)
    assert response.status_code == 200
    assert "doesn’t exist" in unescape(body(response))


def test_the_detail_page_shows_the_definition_and_the_events(client, django_user_model, schedules):
    login(client, django_user_model, "viewer", VIEW)
    run_schedule_now("minutely", request_id="ticket-9", requested_by="alice")

    page = unescape(body(client.get(change_url(SCHEDULES, schedules.minutely.pk))))

    definition = page[page.index('id="workhorse-definition"') :]
    assert '"every_seconds": 60.0' in definition and '"kwargs": {\n    "n": 1\n  }' in definition
    events = page[page.index('id="workhorse-schedule-events"') :]
    assert "run_now" in events and "alice" in events and "ticket-9" in events
    assert "paused" in events and "setup" in events
    assert events.index("run_now") < events.index("paused")  # newest first
    empty = unescape(body(client.get(change_url(SCHEDULES, schedules.daily.pk))))
    assert "No operator has paused, resumed or run this schedule." in empty


def test_pages_are_refused_without_the_view_permission(client, django_user_model, schedules):
    login(client, django_user_model, "no-schedules", VIEW_PERMS)
    assert client.get(SCHEDULES).status_code == 403
    assert client.get(change_url(SCHEDULES, schedules.daily.pk)).status_code == 403
    client.logout()
    login(client, django_user_model, "not-staff", VIEW, staff=False)
    assert client.get(SCHEDULES).status_code == 302  # to the login page


# -- actions -----------------------------------------------------------------------------------------


def snapshot() -> tuple[Any, ...]:
    return (
        list(ScheduleState.objects.order_by("pk").values()),
        list(ScheduleEvent.objects.order_by("pk").values()),
        list(Job.objects.order_by("pk").values_list("pk", flat=True)),
    )


@pytest.mark.parametrize(
    ("perms", "offered"),
    [
        ((), set()),
        (("pause_schedule",), {"pause_selected", "resume_selected"}),
        (("run_schedule_now",), {"run_selected_now"}),
        (("pause_schedule", "run_schedule_now"), {"pause_selected", "resume_selected", "run_selected_now"}),
    ],
)
def test_each_action_is_offered_with_exactly_its_permission(client, django_user_model, schedules, perms, offered):
    login(client, django_user_model, "operator", VIEW + perms)
    assert action_choices(client.get(SCHEDULES)) == offered


@pytest.mark.parametrize(
    ("action", "others"),
    [("pause_selected", ("run_schedule_now",)), ("resume_selected", ()), ("run_selected_now", ("pause_schedule",))],
)
@pytest.mark.parametrize("confirmed", [False, True], ids=["first post", "forged confirmation"])
def test_an_action_without_its_permission_changes_nothing(
    client, django_user_model, schedules, action, others, confirmed
):
    login(client, django_user_model, "operator", VIEW + others)
    before = snapshot()
    extra = {"confirmed": "yes", "request_id": "0" * 32} if confirmed else {}
    ids = [schedules.daily.pk, schedules.minutely.pk]

    response = post_action(client, SCHEDULES, action, ids, **extra)

    assert snapshot() == before
    assert 'id="workhorse-preview"' not in body(response)


def test_pause_and_resume_record_the_admin_user(client, django_user_model, schedules):
    login(client, django_user_model, "olga", VIEW + ("pause_schedule",))
    ids = [schedules.daily.pk, schedules.minutely.pk]

    paused = post_action(client, SCHEDULES, "pause_selected", ids)
    assert messages_of(client.get(paused["Location"])) == ["Paused 1 schedule(s); 1 were paused already."]
    assert ScheduleState.objects.get(name="daily").paused
    resumed = post_action(client, SCHEDULES, "resume_selected", ids)

    assert messages_of(client.get(resumed["Location"]))[0].startswith("Resumed 2 schedule(s); 0 were not paused.")
    assert not ScheduleState.objects.filter(paused=True).exists()
    recorded = ScheduleEvent.objects.exclude(requested_by="setup").order_by("id")
    assert list(recorded.values_list("schedule__name", "kind", "requested_by")) == [
        ("daily", "paused", "admin:olga"),
        ("daily", "resumed", "admin:olga"),
        ("minutely", "resumed", "admin:olga"),
    ]


def test_run_now_previews_then_runs_each_schedule_once_and_records_the_admin_user(client, django_user_model, schedules):
    login(client, django_user_model, "olga", VIEW + ("run_schedule_now",))
    before = snapshot()
    selection = [schedules.daily.pk, schedules.minutely.pk, schedules.gone.pk]

    preview = post_action(client, SCHEDULES, "run_selected_now", selection)

    assert preview.status_code == 200 and snapshot() == before
    table = unescape(body(preview))
    assert 'id="workhorse-preview"' in table and 'value="Run 2 schedule(s)"' in table
    assert "1 selected schedule(s) are left out" in table  # the inactive one
    assert "<td>paused</td>" in table and "<td>active</td>" in table

    first = confirm(client, SCHEDULES, preview)
    second = confirm(client, SCHEDULES, preview)  # the same page submitted again

    request_id = f"admin:{confirm_fields(preview)['request_id']}"
    runs = ScheduleEvent.objects.filter(kind="run_now").order_by("schedule__name")
    assert list(runs.values_list("schedule__name", "requested_by", "request_id")) == [
        ("daily", "admin:olga", request_id),
        ("minutely", "admin:olga", request_id),
    ]
    new_jobs = Job.objects.exclude(pk=schedules.job.pk)
    assert new_jobs.count() == 2 and set(new_jobs.values_list("status", flat=True)) == {JobStatus.QUEUED}
    for response in (first, second):
        [message] = messages_of(response)
        assert message.startswith("Ran 2 schedule(s) now: daily → ")
    assert ScheduleState.objects.get(name="minutely").paused  # still paused
    assert ScheduleState.objects.get(name="daily").last_job_id == runs[0].job_id

    again = confirm(client, SCHEDULES, post_action(client, SCHEDULES, "run_selected_now", [schedules.daily.pk]))
    assert messages_of(again)[0].startswith("Ran 1 schedule(s) now")  # a new preview: a new request
    assert Job.objects.count() == 4


def test_run_now_of_a_schedule_gone_since_the_preview_says_why(client, django_user_model, schedules, settings):
    login(client, django_user_model, "olga", VIEW + ("run_schedule_now",))
    preview = post_action(client, SCHEDULES, "run_selected_now", [schedules.daily.pk])
    ScheduleState.objects.filter(name="daily").update(active=False)  # another host's code dropped it
    settings.WORKHORSE_SCHEDULES = {"daily": DAILY, "minutely": MINUTELY}

    response = confirm(client, SCHEDULES, preview)

    assert messages_of(response) == ["Ran 0 schedule(s) now: none."]
    assert Job.objects.count() == 1


# -- dashboard ---------------------------------------------------------------------------------------


def test_the_dashboard_lists_the_next_ticks_of_active_unpaused_schedules(client, django_user_model, schedules):
    login(client, django_user_model, "viewer", VIEW)
    now = timezone.now()

    page = unescape(body(client.get(DASHBOARD)))

    section = page[page.index('id="workhorse-next-ticks"') :]
    expected = ticks(
        Schedule("30 8 * * *", timezone="Europe/Paris"), now, now + timedelta(days=11), limit=10, oldest=True
    )
    assert len(expected) == 10
    for tick in expected:
        local = tick.astimezone(PARIS)
        assert (
            f'title="daily">daily</span></td><td>{local:%Y-%m-%d} 08:30:00 {local:%Z}</td><td>{tick:%Y-%m-%d %H:%M:%S}</td>'
            in section
        )
    assert "minutely" not in section and "gone" not in section
    assert "All schedules" in section


def test_the_dashboard_says_so_without_schedules(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW)
    page = body(client.get(DASHBOARD))
    assert "No active, unpaused schedule declared in this code has a tick to come." in page
