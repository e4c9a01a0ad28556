"""Encrypted values in the admin (decision 0024): described without ``workhorse.view_encrypted``,
opened with it (and logged), described with the reason when they do not open; clear jobs as before."""

from __future__ import annotations

from html import unescape
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType

from django_workhorse import enqueue
from django_workhorse.admin.encrypted import VIEWED
from django_workhorse.models import EffectRecord, Job
from tests.encrypted_rows import FRAGMENTS, SECRET, EncryptedRows, store_encrypted_rows
from tests.encryption import encryption_setting, new_key
from tests.test_admin import DASHBOARD, DEAD, JOBS, body, change_url, confirm, login, post_action

pytestmark = pytest.mark.django_db(transaction=True)

LEDGER = "/admin/workhorse/effectrecord/"
WORKFLOWS = "/admin/workhorse/workflow/"
VIEW = ("view_job", "view_deadjob", "view_effectrecord", "view_workflow")
DESCRIBED = "encrypted ("


@pytest.fixture
def setting(settings: Any) -> dict[str, Any]:
    setting = encryption_setting()
    settings.WORKHORSE_ENCRYPTION = setting
    return setting


@pytest.fixture
def rows(setting: dict[str, Any]) -> EncryptedRows:
    return store_encrypted_rows()


def page(client: Any, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return unescape(body(response))


def assert_hides_plaintext(text: str, url: str) -> None:
    for fragment in FRAGMENTS:
        assert fragment not in text, f"{fragment!r} shown on {url}"


def object_pages(rows: EncryptedRows) -> list[str]:
    """The pages of one object each that show encrypted values."""
    jobs = [rows.succeeded, rows.dead, rows.staged, rows.failed]
    return [
        *(change_url(JOBS, pk) for pk in jobs),
        change_url(DEAD, rows.dead),
        change_url(LEDGER, rows.effect),
    ]


def viewed_entries() -> list[LogEntry]:
    return list(LogEntry.objects.filter(change_message=VIEWED).order_by("id"))


# -- without the permission ---------------------------------------------------------------------


def test_a_viewer_without_the_permission_sees_every_encrypted_value_described(client, django_user_model, rows):
    login(client, django_user_model, "viewer", VIEW)
    for url in object_pages(rows):
        text = page(client, url)
        assert DESCRIBED in text, url
        assert_hides_plaintext(text, url)
    lists = [
        JOBS,
        DEAD,
        DASHBOARD,
        LEDGER,
        WORKFLOWS,
        change_url(WORKFLOWS, rows.workflow),
        change_url(LEDGER, rows.http),
    ]
    for url in lists:
        assert_hides_plaintext(page(client, url), url)
    assert not viewed_entries()


def test_the_job_page_describes_payload_result_error_events_and_checkpoints(client, django_user_model, rows):
    login(client, django_user_model, "viewer", VIEW)
    staged = page(client, change_url(JOBS, rows.staged))
    payload = staged.split('id="workhorse-payload"')[1].split("</pre>")[0]
    result = staged.split('id="workhorse-result"')[1].split("</pre>")[0]
    checkpoints = staged.split('id="workhorse-checkpoints"')[1].split("</table>")[0]
    for section in (payload, result, checkpoints):
        assert "encrypted (" in section and "bytes, key 2026-12)" in section
    dead = page(client, change_url(JOBS, rows.dead))
    assert dead.count(DESCRIBED) >= 4  # payload, last error, the two failed attempts' events
    failed = page(client, change_url(JOBS, rows.failed))
    assert "reason=encrypted (" in failed


def test_lists_and_previews_describe_an_encrypted_error(client, django_user_model, rows):
    login(client, django_user_model, "operator", (*VIEW, "redrive_job"))
    for url in (JOBS, DEAD, DASHBOARD):
        assert DESCRIBED in page(client, url), url
    before = Job.objects.count()
    preview = post_action(client, DEAD, "redrive_jobs", [rows.dead])
    assert preview.status_code == 200
    text = unescape(body(preview))
    assert DESCRIBED in text
    assert_hides_plaintext(text, "the redrive preview")
    done = confirm(client, DEAD, preview)
    assert done.status_code == 200 and Job.objects.count() == before + 1
    assert_hides_plaintext(unescape(body(done)), "the redrive's answer")


def test_search_never_matches_plaintext_and_does_not_fail(client, django_user_model, rows):
    login(client, django_user_model, "viewer", VIEW)
    for url in (JOBS, DEAD, LEDGER, WORKFLOWS):
        response = client.get(url, {"q": SECRET})
        assert response.status_code == 200, url
        assert list(response.context["cl"].result_list) == [], url


# -- with the permission --------------------------------------------------------------------------


def test_a_viewer_with_the_permission_sees_values_opened_and_each_page_view_is_logged(client, django_user_model, rows):
    user = login(client, django_user_model, "auditor", (*VIEW, "view_encrypted"))
    staged = page(client, change_url(JOBS, rows.staged))
    assert '"charged": "marmalade-4c1e-plaintext"' in staged  # the checkpoint and the result
    assert f"RuntimeError: crashed after charging {SECRET}" in staged  # the failed attempt's event
    assert DESCRIBED not in staged
    dead = page(client, change_url(DEAD, rows.dead))
    assert f"ValueError: cannot handle {SECRET}" in dead
    assert f"reason=gave up on {SECRET}" in page(client, change_url(JOBS, rows.failed))
    ledger = page(client, change_url(LEDGER, rows.effect))
    assert f'"iban": "{SECRET}"' in ledger
    page(client, change_url(JOBS, rows.staged))  # each view is one entry

    entries = viewed_entries()
    shown = [rows.staged, rows.dead, rows.failed, rows.effect, rows.staged]
    assert [(entry.object_id, entry.action_flag, entry.user_id) for entry in entries] == [
        (str(pk), CHANGE, user.pk) for pk in shown
    ]
    assert entries[3].content_type == ContentType.objects.get_for_model(EffectRecord)
    assert entries[0].get_change_message() == VIEWED


def test_lists_do_not_open_values_nor_log(client, django_user_model, rows):
    login(client, django_user_model, "auditor", (*VIEW, "view_encrypted"))
    for url in (JOBS, DEAD, DASHBOARD, LEDGER, WORKFLOWS, change_url(WORKFLOWS, rows.workflow)):
        assert_hides_plaintext(page(client, url), url)
    assert not viewed_entries()


def test_a_superuser_sees_values_opened(client, django_user_model, rows):
    admin = django_user_model.objects.create_superuser(username="root", password=None)
    client.force_login(admin)
    text = page(client, change_url(JOBS, rows.succeeded))
    assert f'"secret": "{SECRET}"' in text
    assert [entry.user_id for entry in viewed_entries()] == [admin.pk]


# -- values that do not open ----------------------------------------------------------------------


def _tampered(envelope: str) -> str:
    last = envelope[-2]
    return envelope[:-2] + ("A" if last != "A" else "B") + envelope[-1]


def test_a_tampered_value_is_described_with_the_reason_and_the_page_answers(client, django_user_model, rows):
    job = Job.objects.get(pk=rows.dead)
    Job.objects.filter(pk=job.pk).update(payload=_tampered(job.payload), last_error=_tampered(job.last_error))
    login(client, django_user_model, "auditor", (*VIEW, "view_encrypted"))
    text = page(client, change_url(JOBS, rows.dead))
    assert text.count("does not open (wrong key or tampered)") == 2
    assert f"ValueError: cannot handle {SECRET}" in text  # the events' errors still open
    client.logout()
    login(client, django_user_model, "viewer", VIEW)
    described = page(client, change_url(JOBS, rows.dead))
    assert "does not open" not in described and DESCRIBED in described


def test_a_value_under_a_key_no_longer_configured_says_so(client, django_user_model, settings, rows):
    settings.WORKHORSE_ENCRYPTION = encryption_setting(keys={"2027-01": new_key()}, active="2027-01")
    login(client, django_user_model, "auditor", (*VIEW, "view_encrypted"))
    text = page(client, change_url(JOBS, rows.succeeded))
    assert "bytes, key 2026-12): does not open (unknown key id)" in text
    assert_hides_plaintext(text, "the job page")
    assert DESCRIBED in page(client, change_url(LEDGER, rows.effect))
    assert not viewed_entries()


# -- clear values ---------------------------------------------------------------------------------


def test_a_clear_job_shows_as_before_and_is_not_logged(client, django_user_model, setting):
    job_id = enqueue("tests.encrypted_rows.echo", {"secret": SECRET})
    login(client, django_user_model, "auditor", (*VIEW, "view_encrypted"))
    text = page(client, change_url(JOBS, job_id))
    assert '"secret": "marmalade-4c1e-plaintext"' in text
    assert DESCRIBED not in text
    assert not viewed_entries()
