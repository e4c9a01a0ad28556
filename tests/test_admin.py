"""The operator's Django admin.

Every page renders for staff with only the view permissions and is refused to everyone else; raw
keys never appear in a response; each changing action needs its own permission (checked on the
server), previews before it acts where it says so, and records who acted; the dashboard's numbers
match the database; nobody, superusers included, can add, edit or delete a job by hand.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from html import unescape
from typing import Any

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.utils import timezone
from django.views.debug import SafeExceptionReporterFilter

from django_workhorse import (
    Debounce,
    EnqueueOutcome,
    Idempotency,
    Throttle,
    Unique,
    enqueue,
    enqueue_with_result,
    redrive,
)
from django_workhorse.admin import JSON_DISPLAY_CHARS
from django_workhorse.enqueueing.fingerprints import key_digest, key_hash
from django_workhorse.models import (
    Checkpoint,
    EventKind,
    IdempotencyBinding,
    Job,
    JobDependency,
    JobEvent,
    JobStatus,
    Redrive,
    WorkerRecord,
)
from django_workhorse.operations import stats
from tests.factories import JobFactory, WaitingStepFactory

pytestmark = pytest.mark.django_db

RAW_KEY = "raw-key-7f3a9c-secret"
SCOPE = "orders"
XSS = "<script>alert(1)</script>"

ADMIN = "/admin/"
JOBS = "/admin/workhorse/job/"
DEAD = "/admin/workhorse/deadjob/"
BINDINGS = "/admin/workhorse/idempotencybinding/"
FIND = "/admin/workhorse/idempotencybinding/find/"
WORKERS = "/admin/workhorse/workerrecord/"
DASHBOARD = "/admin/workhorse/job/dashboard/"

VIEW_PERMS = ("view_job", "view_deadjob", "view_idempotencybinding", "view_workerrecord")
ACTION_PERMS = ("cancel_job", "run_job_now", "redrive_job", "purge_job", "release_binding")


# -- helpers ---------------------------------------------------------------------------------------


def make_user(django_user_model: Any, username: str, perms: tuple[str, ...] = (), *, staff: bool = True) -> Any:
    """A user with the given workhorse permissions (codenames)."""
    user = django_user_model.objects.create_user(username=username, password=None, is_staff=staff)
    found = Permission.objects.filter(content_type__app_label="workhorse", codename__in=perms)
    assert found.count() == len(set(perms)), "a permission the test names does not exist"
    user.user_permissions.add(*found)
    return user


def login(client: Any, django_user_model: Any, username: str, perms: tuple[str, ...] = (), **kwargs: Any) -> Any:
    user = make_user(django_user_model, username, perms, **kwargs)
    client.force_login(user)
    return user


def change_url(base: str, pk: int) -> str:
    return f"{base}{pk}/change/"


def body(response: Any) -> str:
    return response.content.decode()


def result_ids(response: Any) -> set[int]:
    """The ids on a changelist page."""
    assert response.status_code == 200, response.status_code
    return {obj.pk for obj in response.context["cl"].result_list}


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]] if response.context else []


def action_choices(response: Any) -> set[str]:
    form = response.context.get("action_form")
    return {name for name, _ in form.fields["action"].choices if name} if form else set()


def post_action(client: Any, url: str, action: str, ids: list[int], **extra: str) -> Any:
    """Submit an admin action as the changelist's "Go" button does (or, with ``confirmed``, the preview page)."""
    data: dict[str, Any] = {"action": action, "_selected_action": [str(pk) for pk in ids], "select_across": "0"}
    if "confirmed" not in extra:
        data["index"] = "0"
    data.update(extra)
    return client.post(url, data)


def confirm_fields(preview: Any) -> dict[str, Any]:
    """The hidden fields a preview page submits, as its confirm button would."""
    text = body(preview)
    fields: dict[str, Any] = {"_selected_action": re.findall(r'name="_selected_action" value="([^"]*)"', text)}
    for name in ("action", "request_id", "confirmed", "select_across"):
        match = re.search(rf'name="{name}" value="([^"]*)"', text)
        assert match, f"the preview page has no {name} field"
        fields[name] = match.group(1)
    return fields


def confirm(client: Any, url: str, preview: Any) -> Any:
    return client.post(url, confirm_fields(preview), follow=True)


def snapshot() -> tuple[Any, ...]:
    """Everything an action could change."""
    return (
        list(Job.objects.order_by("pk").values()),
        list(JobEvent.objects.order_by("pk").values_list("pk", "job_id", "kind")),
        list(IdempotencyBinding.objects.order_by("pk").values_list("pk", "job_id")),
        list(Redrive.objects.order_by("pk").values_list("pk", flat=True)),
        LogEntry.objects.count(),
    )


def events(job: Job, kind: str) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job=job, kind=kind).order_by("id"))


def section(text: str, element_id: str) -> str:
    """The (unescaped) text of the detail page section with ``element_id``."""
    start = text.index(f'id="{element_id}"')
    end = text.find('<div class="workhorse-section"', start)
    return unescape(text[start : end if end != -1 else None])


# -- data ------------------------------------------------------------------------------------------


@dataclass
class World:
    keyed: Job  # queued, owns RAW_KEY; its payload holds a script tag
    big: Job  # a payload too long to show whole
    done: Job  # succeeded, with a result
    dead: Job
    redriven: Job  # the dead job's redrive
    running: Job
    scheduled: Job  # queued for later
    binding: IdempotencyBinding
    worker: WorkerRecord

    @property
    def digest(self) -> str:
        return key_digest(key_hash(SCOPE, RAW_KEY))


@pytest.fixture
def world() -> World:
    now = timezone.now()
    keyed_id = enqueue(
        "billing.capture_invoice",
        {"invoice": 42, "note": XSS},
        queue="billing",
        tags=["vip", "invoices"],
        idempotency=Idempotency(RAW_KEY, scope=SCOPE),
    )
    keyed = Job.objects.get(pk=keyed_id)
    JobEvent.objects.create(job=keyed, kind=EventKind.CLAIMED, attempt=1, at=now, details={"worker": "worker-a"})
    dead = JobFactory(
        job_type="billing.charge",
        queue="billing",
        status=JobStatus.DEAD,
        attempt=3,
        max_attempts=3,
        started_at=now,
        finished_at=now,
        last_error="ValueError: card declined\nTraceback (most recent call last):\n  File ...\nValueError: card declined",
    )
    worker = WorkerRecord.objects.create(
        name="worker-a",
        host="web-1",
        pid=4242,
        queues=["default", "billing"],
        concurrency=4,
        started_at=now,
        heartbeat_at=now,
    )
    done = JobFactory(
        job_type="emails.send_receipt",
        queue="emails",
        status=JobStatus.SUCCEEDED,
        attempt=1,
        started_at=now,
        finished_at=now,
        result={"message_id": "msg-1", "html": "<b>sent</b>"},
    )
    Checkpoint.objects.create(job=done, name="render", value={"template": "receipt_v2"}, attempt=1, created_at=now)
    return World(
        keyed=keyed,
        big=JobFactory(job_type="reports.export", payload={"rows": "x" * 25_000}),
        done=done,
        dead=dead,
        redriven=Job.objects.get(pk=redrive(dead.pk, request_id="ticket-7", requested_by="alice")),
        running=JobFactory(
            job_type="emails.send_receipt",
            queue="emails",
            status=JobStatus.RUNNING,
            attempt=1,
            started_at=now,
            claimed_by="worker-a",
            lease_token=uuid.uuid4(),
            lease_expires_at=now + timedelta(minutes=5),
        ),
        scheduled=JobFactory(job_type="reports.export", run_at=now + timedelta(hours=1)),
        binding=IdempotencyBinding.objects.get(job_id=keyed_id),
        worker=worker,
    )


def admin_pages(world: World) -> list[str]:
    """Every admin page of the app, with each filter and kind of search."""
    return [
        ADMIN,
        JOBS,
        f"{JOBS}?status=queued",
        f"{JOBS}?queue=billing",
        f"{JOBS}?job_type=billing.charge",
        f"{JOBS}?has_key=yes",
        f"{JOBS}?has_key=no",
        f"{JOBS}?tag=vip",
        f"{JOBS}?q={world.keyed.pk}",
        f"{JOBS}?q=capture_invoice",
        f"{JOBS}?q={world.digest}",
        *(change_url(JOBS, job.pk) for job in (world.keyed, world.big, world.done, world.dead, world.redriven)),
        change_url(JOBS, world.running.pk),
        DEAD,
        change_url(DEAD, world.dead.pk),
        BINDINGS,
        f"{BINDINGS}?mode=idempotency",
        f"{BINDINGS}?state=active",
        f"{BINDINGS}?state=expired",
        f"{BINDINGS}?q={world.digest}",
        change_url(BINDINGS, world.binding.pk),
        FIND,
        WORKERS,
        change_url(WORKERS, world.worker.pk),
        DASHBOARD,
    ]


# -- pages and who may see them --------------------------------------------------------------------


def test_every_page_renders_for_staff_with_only_view_permissions(client, django_user_model, world):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    for url in admin_pages(world):
        response = client.get(url)
        assert response.status_code == 200, url
        assert RAW_KEY not in body(response), url


@pytest.mark.parametrize("who", ["anonymous", "not staff, with every permission", "staff without permissions"])
def test_every_page_is_refused_to_others(client, django_user_model, world, who):
    if who == "not staff, with every permission":
        login(client, django_user_model, "customer", VIEW_PERMS + ACTION_PERMS, staff=False)
    elif who == "staff without permissions":
        login(client, django_user_model, "clerk")

    for url in admin_pages(world):
        if url == ADMIN and who == "staff without permissions":
            continue  # the admin index is open to all staff; it lists no workhorse model
        response = client.get(url)
        if who == "staff without permissions":
            assert response.status_code == 403, url
        else:
            assert response.status_code == 302, url
            assert response["Location"].startswith("/admin/login/"), url
        assert RAW_KEY not in body(response)


def test_the_admin_index_lists_only_what_the_user_may_view(client, django_user_model, world):
    login(client, django_user_model, "clerk")
    assert "/admin/workhorse/" not in body(client.get(ADMIN))

    login(client, django_user_model, "binder", ("view_idempotencybinding",))
    index = body(client.get(ADMIN))
    assert BINDINGS in index and JOBS not in index and WORKERS not in index


def test_viewing_jobs_is_enough_to_view_dead_letters(client, django_user_model, world):
    login(client, django_user_model, "viewer", ("view_job",))

    assert result_ids(client.get(DEAD)) == {world.dead.pk}
    assert client.get(change_url(DEAD, world.dead.pk)).status_code == 200
    assert client.get(DASHBOARD).status_code == 200
    assert client.get(BINDINGS).status_code == 403


def test_job_filters_and_search(client, django_user_model, world):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    all_ids = set(Job.objects.values_list("pk", flat=True))

    def listed(query: str) -> set[int]:
        return result_ids(client.get(f"{JOBS}?{query}"))

    assert listed("") == all_ids
    assert listed("status=queued") == set(Job.objects.filter(status="queued").values_list("pk", flat=True))
    assert listed("status=queued") == {world.keyed.pk, world.big.pk, world.redriven.pk, world.scheduled.pk}
    assert listed("status=dead") == {world.dead.pk}
    assert listed("queue=billing") == {world.keyed.pk, world.dead.pk, world.redriven.pk}
    assert listed("job_type=billing.charge") == {world.dead.pk, world.redriven.pk}
    assert listed("has_key=yes") == {world.keyed.pk}
    assert listed("has_key=no") == all_ids - {world.keyed.pk}
    assert listed("tag=vip") == listed("tag=invoices") == {world.keyed.pk}
    assert listed("queue=emails&status=running") == {world.running.pk}
    # search: by id, by (part of) a job type, by a key digest (any case, or a longer prefix of the hash)
    hashed = key_hash(SCOPE, RAW_KEY).hex()
    by_id = {world.dead.pk} | (
        {world.keyed.pk} if len(str(world.dead.pk)) % 2 == 0 and hashed.startswith(str(world.dead.pk)) else set()
    )
    assert listed(f"q={world.dead.pk}") == by_id  # ids are digits, so also hex: a digest prefix may match too
    assert listed("q=capture_invoice") == {world.keyed.pk}
    assert listed("q=reports.export") == {world.big.pk, world.scheduled.pk}
    assert listed(f"q={world.digest}") == {world.keyed.pk}
    assert listed(f"q={world.digest.upper()}") == {world.keyed.pk}
    assert listed(f"q={key_hash(SCOPE, RAW_KEY).hex()[:20]}") == {world.keyed.pk}
    assert listed("q=0123456789ab") == set()
    assert listed("q=not-a-thing") == set()
    assert listed("q=" + "9" * 30) == set()  # beyond any id
    # the tag filter offers the tags in use
    page = body(client.get(JOBS))
    assert "?tag=vip" in page and "?tag=invoices" in page


def test_job_changelist_shows_the_key_preview_never_the_key(client, django_user_model, world):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    page = body(client.get(JOBS))

    assert f"idempotency: {world.binding.key_preview}" in unescape(page)
    assert world.binding.key_preview == "raw-key-…cret"
    assert RAW_KEY not in page
    assert f'href="{DASHBOARD}"' in page


def test_job_detail_shows_payload_escaped_result_events_checkpoints_and_key(client, django_user_model, world):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    page = body(client.get(change_url(JOBS, world.keyed.pk)))

    assert XSS not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    payload = section(page, "workhorse-payload")
    assert json.loads(payload[payload.index("{") : payload.rindex("}") + 1]) == {"invoice": 42, "note": XSS}
    # the timeline: the enqueue, then the claim with its details
    timeline = section(page, "workhorse-events")
    assert timeline.index("enqueued") < timeline.index("claimed") < timeline.index("worker=worker-a")
    assert "None." in section(page, "workhorse-checkpoints")
    # the key: a link to the binding, by mode, preview and digest
    key = section(page, "workhorse-binding")
    assert f'href="{change_url(BINDINGS, world.binding.pk)}"' in key
    assert f"idempotency key raw-key-…cret [{world.digest}]" in key and "active" in key
    assert "Not redriven." in section(page, "workhorse-lineage")
    assert 'name="_save"' not in page  # read-only
    assert RAW_KEY not in page


def test_job_detail_cuts_a_long_payload(client, django_user_model, world):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    page = body(client.get(change_url(JOBS, world.big.pk)))

    full = json.dumps(world.big.payload, indent=2, sort_keys=True)
    assert len(full) > JSON_DISPLAY_CHARS == 20_000
    payload = section(page, "workhorse-payload")
    assert f"({len(full) - JSON_DISPLAY_CHARS:,} more characters not shown)" in payload
    assert "more characters not shown" in payload
    assert "x" * 19_000 in payload and "x" * 20_000 not in payload
    assert "No key binds this job." in section(page, "workhorse-binding")


def test_job_detail_shows_the_result_and_checkpoints(client, django_user_model, world):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    page = body(client.get(change_url(JOBS, world.done.pk)))

    result = section(page, "workhorse-result")
    assert '"message_id": "msg-1"' in result and '"html": "<b>sent</b>"' in result
    assert "<b>sent</b>" not in page  # escaped in the page
    checkpoints = section(page, "workhorse-checkpoints")
    assert "render" in checkpoints and '"template": "receipt_v2"' in checkpoints
    assert 'id="workhorse-result"' not in body(client.get(change_url(JOBS, world.keyed.pk)))  # no result yet


def test_job_detail_links_the_redrive_lineage_both_ways(client, django_user_model, world):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    dead_lineage = section(body(client.get(change_url(JOBS, world.dead.pk))), "workhorse-lineage")
    new_lineage = section(body(client.get(change_url(JOBS, world.redriven.pk))), "workhorse-lineage")
    dead_letter_lineage = section(body(client.get(change_url(DEAD, world.dead.pk))), "workhorse-lineage")

    assert f'Redriven as <a href="{change_url(JOBS, world.redriven.pk)}">job #{world.redriven.pk}</a> by alice' in (
        dead_lineage
    )
    assert dead_letter_lineage == dead_lineage
    assert f'Redriven from <a href="{change_url(JOBS, world.dead.pk)}">job #{world.dead.pk}</a> by alice' in (
        new_lineage
    )
    # its history starts with the enqueue, drawn from the job row, naming where it came from
    timeline = section(body(client.get(change_url(JOBS, world.redriven.pk))), "workhorse-events")
    assert f"redriven_from={world.dead.pk}" in timeline.split("</tr>")[1]


def test_dead_letters_list_only_dead_jobs_with_their_error(client, django_user_model, world):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    response = client.get(DEAD)

    assert result_ids(response) == {world.dead.pk}
    assert "ValueError: card declined" in body(response)  # the error's first line
    assert "Traceback (most recent call last):" not in body(response)
    detail = body(client.get(change_url(DEAD, world.dead.pk)))
    assert "Traceback (most recent call last):" in detail  # the whole error
    assert client.get(change_url(DEAD, world.keyed.pk)).status_code == 302  # not a dead letter: "does not exist"


def test_binding_pages_show_preview_digest_and_owner(client, django_user_model, world):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    listing = client.get(BINDINGS)
    detail = body(client.get(change_url(BINDINGS, world.binding.pk)))

    assert result_ids(listing) == {world.binding.pk}
    assert f'href="{FIND}"' in body(listing)
    for text in (unescape(body(listing)), unescape(detail)):
        assert "raw-key-…cret" in text and world.digest in text and SCOPE in text
    assert (
        f'<a href="{change_url(JOBS, world.keyed.pk)}">#{world.keyed.pk} billing.capture_invoice (queued)</a>'
        in unescape(detail)
    )
    assert f'<a href="{change_url(JOBS, world.keyed.pk)}">#{world.keyed.pk}</a> queued' in unescape(body(listing))
    assert 'title="billing.capture_invoice"' in body(listing)
    assert key_hash(SCOPE, RAW_KEY).hex() in detail
    assert result_ids(client.get(f"{BINDINGS}?q={world.digest}")) == {world.binding.pk}
    assert result_ids(client.get(f"{BINDINGS}?q={SCOPE}")) == {world.binding.pk}
    assert result_ids(client.get(f"{BINDINGS}?q=0123456789ab")) == set()
    assert result_ids(client.get(f"{BINDINGS}?mode=idempotency")) == {world.binding.pk}
    assert result_ids(client.get(f"{BINDINGS}?mode=unique")) == set()
    for text in (body(listing), detail):
        assert RAW_KEY not in text


def test_binding_state_filter_splits_active_from_free_keys(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    now = timezone.now()

    def bind(key: str, *, status: str = JobStatus.QUEUED, expires: timedelta | None = None, **mode: Any) -> int:
        job_id = enqueue("tests.noop", {"key": key}, **mode)
        Job.objects.filter(pk=job_id).update(status=status)
        binding = IdempotencyBinding.objects.get(job_id=job_id)
        if expires is not None:
            IdempotencyBinding.objects.filter(pk=binding.pk).update(expires_at=now + expires)
        return binding.pk

    minute = timedelta(minutes=1)
    active = {
        bind("idem-live", idempotency=Idempotency("idem-live")),
        bind("unique-queued", unique=Unique("unique-queued")),
        bind("unique-running", status=JobStatus.RUNNING, unique=Unique("unique-running")),
        bind("throttle-live", throttle=Throttle("throttle-live", window=timedelta(hours=1))),
        bind("debounce-due", expires=-minute, debounce=Debounce("debounce-due", window=minute)),
        bind("debounce-cooling", status=JobStatus.SUCCEEDED, debounce=Debounce("debounce-cooling", window=minute)),
    }
    free = {
        bind("idem-old", status=JobStatus.QUEUED, expires=-minute, idempotency=Idempotency("idem-old")),
        bind("unique-done", status=JobStatus.SUCCEEDED, unique=Unique("unique-done")),
        bind("unique-dead", status=JobStatus.DEAD, unique=Unique("unique-dead")),
        bind("throttle-old", expires=-minute, throttle=Throttle("throttle-old", window=minute)),
        bind(
            "debounce-over",
            status=JobStatus.CANCELLED,
            expires=-minute,
            debounce=Debounce("debounce-over", window=minute),
        ),
    }

    assert result_ids(client.get(f"{BINDINGS}?state=active")) == active
    assert result_ids(client.get(f"{BINDINGS}?state=expired")) == free
    listing = client.get(BINDINGS)
    assert {obj.pk for obj in listing.context["cl"].result_list if obj.is_live} == active
    assert result_ids(client.get(f"{BINDINGS}?mode=unique&state=active")) == active & set(
        IdempotencyBinding.objects.filter(mode="unique").values_list("pk", flat=True)
    )


# -- raw keys --------------------------------------------------------------------------------------


def test_find_binding_by_raw_key_redirects_to_it_without_echoing_the_key(client, django_user_model, world):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    form = client.get(FIND)
    found = client.post(FIND, {"scope": SCOPE, "key": RAW_KEY})

    assert 'type="password"' in body(form)
    assert found.status_code == 302 and found["Location"] == change_url(BINDINGS, world.binding.pk)
    assert RAW_KEY not in body(found) and RAW_KEY not in found["Location"]
    followed = client.post(FIND, {"scope": SCOPE, "key": RAW_KEY}, follow=True)
    assert followed.status_code == 200 and world.digest in body(followed)
    assert RAW_KEY not in body(followed)


@pytest.mark.parametrize(
    ("scope", "key"),
    [("other-scope", RAW_KEY), (SCOPE, RAW_KEY + "-nope"), (SCOPE, RAW_KEY.upper()), ("", RAW_KEY)],
    ids=["wrong scope", "unknown key", "another case", "no scope (invalid form)"],
)
def test_find_binding_that_fails_does_not_echo_the_key(client, django_user_model, world, scope, key):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    response = client.post(FIND, {"scope": scope, "key": key})

    assert response.status_code == 200
    page = body(response)
    assert RAW_KEY not in page and RAW_KEY.upper() not in page
    if scope:
        assert f"No binding holds that key in scope &#x27;{scope}&#x27;." in page


def test_find_binding_keeps_the_key_out_of_error_reports(client, django_user_model, world):
    login(client, django_user_model, "viewer", VIEW_PERMS)

    request = client.post(FIND, {"scope": SCOPE, "key": RAW_KEY}).wsgi_request

    reported = SafeExceptionReporterFilter().get_post_parameters(request)
    assert reported["scope"] == SCOPE
    assert reported["key"] != RAW_KEY and set(reported["key"]) == {"*"}


def test_find_binding_needs_the_view_permission(client, django_user_model, world):
    login(client, django_user_model, "clerk", ("view_job",))

    assert client.post(FIND, {"scope": SCOPE, "key": RAW_KEY}).status_code == 403
    assert client.get(FIND).status_code == 403


def test_raw_key_never_appears_in_any_page_nor_through_the_release(client, django_user_model, world):
    login(client, django_user_model, "operator", VIEW_PERMS + ACTION_PERMS)
    pages = [client.get(url) for url in admin_pages(world)]
    pages.append(client.post(FIND, {"scope": SCOPE, "key": RAW_KEY}, follow=True))
    pages.append(client.post(FIND, {"scope": "elsewhere", "key": RAW_KEY}, follow=True))
    preview = post_action(client, BINDINGS, "release", [world.binding.pk])
    pages.append(preview)
    pages.append(confirm(client, BINDINGS, preview))
    pages.append(client.get(change_url(JOBS, world.keyed.pk)))  # with its key_released event
    pages.append(post_action(client, JOBS, "purge_jobs", [world.keyed.pk]))

    for response in pages:
        assert response.status_code == 200
        assert RAW_KEY not in body(response)
    assert not IdempotencyBinding.objects.exists()  # the release did happen


# -- actions: each needs its own permission --------------------------------------------------------


@dataclass(frozen=True)
class ActionCase:
    url: str
    action: str
    permission: str

    def targets(self, world: World) -> list[int]:
        return {
            "cancel_jobs": [world.keyed.pk, world.running.pk],
            "run_jobs_now": [world.scheduled.pk],
            "redrive_jobs": [world.dead.pk],
            "purge_jobs": [world.keyed.pk, world.scheduled.pk],
            "release": [world.binding.pk],
        }[self.action]


ACTION_CASES = [
    ActionCase(JOBS, "cancel_jobs", "cancel_job"),
    ActionCase(JOBS, "run_jobs_now", "run_job_now"),
    ActionCase(JOBS, "redrive_jobs", "redrive_job"),
    ActionCase(JOBS, "purge_jobs", "purge_job"),
    ActionCase(DEAD, "redrive_jobs", "redrive_job"),
    ActionCase(BINDINGS, "release", "release_binding"),
]


@pytest.mark.parametrize("case", ACTION_CASES, ids=lambda case: f"{case.url.split('/')[-2]}-{case.action}")
@pytest.mark.parametrize("others", [False, True], ids=["no action permissions", "every other action permission"])
@pytest.mark.parametrize("confirmed", [False, True], ids=["first post", "forged confirmation"])
def test_action_without_its_permission_is_refused(client, django_user_model, world, case, others, confirmed):
    perms = VIEW_PERMS + tuple(p for p in ACTION_PERMS if others and p != case.permission)
    login(client, django_user_model, "operator", perms)
    before = snapshot()
    extra = {"confirmed": "yes", "request_id": uuid.uuid4().hex} if confirmed else {}

    response = post_action(client, case.url, case.action, case.targets(world), **extra)

    assert snapshot() == before
    assert 'id="workhorse-preview"' not in body(response)
    if response.status_code == 302:  # Django rejects an action it does not offer to this user
        changelist = client.get(response["Location"])
        assert "No action selected." in messages_of(changelist)
        assert case.action not in action_choices(changelist)
        assert action_choices(changelist), "a redirect only when the user has some other action"
    else:  # no action at all for this user: the POST just shows the changelist
        assert response.status_code == 200
        assert action_choices(response) == set()


@pytest.mark.parametrize("case", ACTION_CASES, ids=lambda case: f"{case.url.split('/')[-2]}-{case.action}")
def test_each_action_is_offered_with_exactly_its_permission(client, django_user_model, world, case):
    login(client, django_user_model, f"only-{case.permission}", VIEW_PERMS + (case.permission,))

    assert case.action in action_choices(client.get(case.url))
    assert action_choices(client.get(case.url)) <= {case.action}
    assert "delete_selected" not in action_choices(client.get(case.url))


def test_cancel_counts_waiting_workflow_steps_and_cancels_what_follows_them(client, django_user_model, world):
    login(client, django_user_model, "olga", VIEW_PERMS + ("cancel_job",))
    step = WaitingStepFactory()
    after = WaitingStepFactory(workflow=step.workflow)
    JobDependency.objects.create(parent=step, child=after)

    response = post_action(client, JOBS, "cancel_jobs", [step.pk, world.done.pk])

    assert messages_of(client.get(response["Location"])) == [
        "Cancelled 0 queued job(s); cancelled 1 waiting workflow step(s) and the steps after them; "
        "asked 0 running job(s) to stop; 1 had already finished."
    ]
    assert set(Job.objects.filter(pk__in=[step.pk, after.pk]).values_list("status", flat=True)) == {"cancelled"}
    assert [e.details for e in events(after, "cancelled")] == [{"cause": step.pk, "requested_by": "admin:olga"}]


def test_cancel_records_the_admin_user(client, django_user_model, world):
    login(client, django_user_model, "olga", VIEW_PERMS + ("cancel_job",))

    response = post_action(client, JOBS, "cancel_jobs", [world.keyed.pk, world.running.pk, world.done.pk])

    assert response.status_code == 302
    assert messages_of(client.get(response["Location"])) == [
        "Cancelled 1 queued job(s); asked 1 running job(s) to stop; 1 had already finished."
    ]
    keyed, running = Job.objects.get(pk=world.keyed.pk), Job.objects.get(pk=world.running.pk)
    assert keyed.status == JobStatus.CANCELLED and keyed.finished_at is not None
    assert running.status == JobStatus.RUNNING and running.cancel_requested
    assert [e.details for e in events(keyed, "cancelled")] == [{"requested_by": "admin:olga"}]
    assert [e.details for e in events(running, "cancel_requested")] == [{"requested_by": "admin:olga"}]
    assert not JobEvent.objects.filter(job=world.done, kind__in=["cancelled", "cancel_requested"]).exists()


def test_run_now_makes_a_scheduled_job_due_and_records_the_admin_user(client, django_user_model, world):
    login(client, django_user_model, "olga", VIEW_PERMS + ("run_job_now",))
    ready_run_at = Job.objects.get(pk=world.keyed.pk).run_at

    response = post_action(client, JOBS, "run_jobs_now", [world.scheduled.pk, world.keyed.pk, world.done.pk])

    assert messages_of(client.get(response["Location"])) == ["1 job(s) are due now; 2 were not queued for later."]
    assert Job.objects.get(pk=world.scheduled.pk).run_at <= timezone.now()
    assert Job.objects.get(pk=world.keyed.pk).run_at == ready_run_at
    assert [e.details for e in events(world.scheduled, "run_now")] == [{"requested_by": "admin:olga"}]
    assert not JobEvent.objects.filter(kind="run_now").exclude(job=world.scheduled).exists()
    depth = {d.queue: d for d in stats.queue_depths()}["default"]
    assert depth.scheduled == 0


@pytest.mark.parametrize("url", [JOBS, DEAD], ids=["jobs", "dead letters"])
def test_redrive_previews_then_redrives_once_and_records_the_admin_user(client, django_user_model, world, url):
    login(client, django_user_model, "olga", VIEW_PERMS + ("redrive_job",))
    selection = [world.dead.pk, world.keyed.pk] if url == JOBS else [world.dead.pk]
    before = snapshot()

    preview = post_action(client, url, "redrive_jobs", selection)

    assert preview.status_code == 200
    assert snapshot() == before  # the preview changes nothing
    table = unescape(body(preview))
    assert 'id="workhorse-preview"' in table
    assert f'<a href="{change_url(JOBS, world.dead.pk)}">#{world.dead.pk}</a>' in table
    assert "billing.charge" in table and "ValueError: card declined" in table and "3/3" in table
    assert f"#{world.keyed.pk}<" not in table
    assert ("1 selected job(s) are left out" in table) == (url == JOBS)
    assert 'value="Redrive 1 job(s)"' in table

    first = confirm(client, url, preview)
    second = confirm(client, url, preview)  # the same page submitted again

    redrives = Redrive.objects.filter(source=world.dead).exclude(request_id="ticket-7")
    assert redrives.count() == 1
    new_job = redrives.get().new_job
    assert redrives.get().requested_by == "admin:olga"
    assert redrives.get().request_id == f"admin:{confirm_fields(preview)['request_id']}"
    assert (new_job.status, new_job.job_type, new_job.payload) == ("queued", "billing.charge", world.dead.payload)
    assert [e.details for e in events(world.dead, "redriven")][-1]["requested_by"] == "admin:olga"
    assert len(events(world.dead, "redriven")) == 2  # ticket-7, then this one
    assert Job.objects.get(pk=world.dead.pk).status == JobStatus.DEAD
    for response in (first, second):
        assert f"Redrove 1 job(s): {world.dead.pk} → {new_job.pk}." in messages_of(response)
    assert Job.objects.count() == len(before[0]) + 1

    another = confirm(client, url, post_action(client, url, "redrive_jobs", selection))  # a new preview: a new request
    assert "Redrove 1 job(s)" in messages_of(another)[0]
    assert Redrive.objects.filter(source=world.dead).count() == 3


def test_a_preview_with_nothing_to_do_offers_no_confirmation(client, django_user_model, world):
    login(client, django_user_model, "olga", VIEW_PERMS + ("redrive_job", "purge_job"))

    redrive_preview = body(post_action(client, JOBS, "redrive_jobs", [world.keyed.pk, world.done.pk]))
    purge_preview = body(post_action(client, JOBS, "purge_jobs", [world.running.pk]))

    assert "Redrive applies to none of the selected jobs." in redrive_preview
    assert "2 selected job(s) are left out" in redrive_preview
    assert "Purge applies to none of the selected jobs." in purge_preview
    for page in (redrive_preview, purge_preview):
        assert 'id="workhorse-confirm"' not in page and 'id="workhorse-preview"' not in page


def test_a_confirmation_without_a_valid_request_id_is_refused(client, django_user_model, world):
    login(client, django_user_model, "olga", VIEW_PERMS + ACTION_PERMS)
    before = snapshot()

    for request_id in ("", "not-a-uuid"):
        response = post_action(client, JOBS, "redrive_jobs", [world.dead.pk], confirmed="yes", request_id=request_id)
        assert response.status_code == 403
    assert snapshot() == before


def test_purge_previews_then_deletes_queued_jobs_releases_keys_and_logs_the_user(client, django_user_model, world):
    user = login(client, django_user_model, "olga", VIEW_PERMS + ("purge_job",))
    before = snapshot()

    preview = post_action(client, JOBS, "purge_jobs", [world.keyed.pk, world.scheduled.pk, world.running.pk])

    assert snapshot() == before
    table = unescape(body(preview))
    for job in (world.keyed, world.scheduled):
        assert f'<a href="{change_url(JOBS, job.pk)}">#{job.pk}</a>' in table
    assert f"#{world.running.pk}<" not in table
    assert "1 selected job(s) are left out" in table and 'value="Purge 2 job(s)"' in table

    done = confirm(client, JOBS, preview)

    assert "Purged 2 queued job(s)." in messages_of(done)
    assert not Job.objects.filter(pk__in=[world.keyed.pk, world.scheduled.pk]).exists()
    assert Job.objects.filter(pk=world.running.pk, status=JobStatus.RUNNING).exists()
    assert not IdempotencyBinding.objects.filter(pk=world.binding.pk).exists()
    logged = LogEntry.objects.filter(action_flag=DELETION).order_by("object_id")
    assert {(e.user_id, e.object_id, e.content_type_id) for e in logged} == {
        (user.pk, str(job.pk), ContentType.objects.get_for_model(Job).pk) for job in (world.keyed, world.scheduled)
    }
    assert {e.object_repr for e in logged} == {
        f"billing.capture_invoice #{world.keyed.pk}",
        f"reports.export #{world.scheduled.pk}",
    }
    # the key is free: the same request is a new job
    again = enqueue_with_result(
        "billing.capture_invoice",
        {"invoice": 42, "note": XSS},
        queue="billing",
        tags=["vip", "invoices"],
        idempotency=Idempotency(RAW_KEY, scope=SCOPE),
    )
    assert again.outcome == EnqueueOutcome.ACCEPTED and again.job_id != world.keyed.pk


def test_release_previews_then_frees_the_key_and_records_the_admin_user(client, django_user_model, world):
    login(client, django_user_model, "olga", VIEW_PERMS + ("release_binding",))
    request = {"queue": "billing", "tags": ["vip", "invoices"], "idempotency": Idempotency(RAW_KEY, scope=SCOPE)}
    replayed = enqueue_with_result("billing.capture_invoice", {"invoice": 42, "note": XSS}, **request)
    assert (replayed.outcome, replayed.job_id) == (EnqueueOutcome.REPLAYED, world.keyed.pk)
    before = snapshot()

    preview = post_action(client, BINDINGS, "release", [world.binding.pk])

    assert snapshot() == before
    table = unescape(body(preview))
    assert 'id="workhorse-preview"' in table
    assert "raw-key-…cret" in table and world.digest in table and SCOPE in table and "idempotency" in table
    assert f'<a href="{change_url(JOBS, world.keyed.pk)}">#{world.keyed.pk}</a> (queued)' in table
    assert 'value="Release 1 key(s)"' in table
    assert RAW_KEY not in body(preview)

    done = confirm(client, BINDINGS, preview)

    assert messages_of(done) == ["Released 1 key(s); the next request with one of them creates a new job."]
    assert not IdempotencyBinding.objects.exists()
    assert Job.objects.get(pk=world.keyed.pk).status == JobStatus.QUEUED  # the job stays
    [released] = events(world.keyed, "key_released")
    assert released.details == {
        "requested_by": "admin:olga",
        "mode": "idempotency",
        "scope": SCOPE,
        "key_digest": world.digest,
    }
    accepted = enqueue_with_result("billing.capture_invoice", {"invoice": 42, "note": XSS}, **request)
    assert accepted.outcome == EnqueueOutcome.ACCEPTED and accepted.job_id != world.keyed.pk


def test_permissions_granted_through_a_group(client, django_user_model, world):
    operators = Group.objects.create(name="Workhorse operators")
    operators.permissions.add(
        *Permission.objects.filter(content_type__app_label="workhorse", codename__in=VIEW_PERMS + ("cancel_job",))
    )
    user = make_user(django_user_model, "gina")
    user.groups.add(operators)
    client.force_login(user)

    assert client.get(DASHBOARD).status_code == 200
    assert action_choices(client.get(JOBS)) == {"cancel_jobs"}
    post_action(client, JOBS, "cancel_jobs", [world.keyed.pk])
    assert [e.details for e in events(world.keyed, "cancelled")] == [{"requested_by": "admin:gina"}]


def test_inactive_staff_with_every_permission_gets_nothing(client, django_user_model, world):
    user = login(client, django_user_model, "gone", VIEW_PERMS + ACTION_PERMS)
    user.is_active = False
    user.save()
    before = snapshot()

    response = post_action(client, JOBS, "cancel_jobs", [world.keyed.pk])

    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert snapshot() == before


# -- dashboard -------------------------------------------------------------------------------------


def dashboard_cells(page: str) -> dict[str, dict[str, str]]:
    """{queue: {field: cell text}} from the dashboard's queue table."""
    rows = re.findall(r'<tr data-queue="([^"]*)">(.*?)</tr>', page, re.DOTALL)
    return {
        unescape(queue): {
            field: unescape(text).strip() for field, text in re.findall(r'data-field="(\w+)">(.*?)</td>', row)
        }
        for queue, row in rows
    }


def test_dashboard_numbers_match_the_database(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    now = timezone.now()
    minutes = timedelta(minutes=1)

    def jobs(count: int, queue: str, status: str, **fields: Any) -> None:
        for _ in range(count):
            JobFactory(queue=queue, status=status, **fields)

    for queue, n in (("default", 1), ("billing", 2)):
        jobs(3 * n, queue, JobStatus.QUEUED, run_at=now - 5 * minutes)  # ready
        jobs(2 * n, queue, JobStatus.QUEUED, run_at=now + 60 * minutes)  # scheduled
        jobs(n, queue, JobStatus.RUNNING, attempt=1, started_at=now, claimed_by="worker-a")
        jobs(n, queue, JobStatus.DEAD, attempt=1, finished_at=now - 10 * minutes, last_error=f"{queue} broke")
        jobs(1, queue, JobStatus.DEAD, attempt=1, finished_at=now - 3 * 60 * minutes, last_error="long ago")
        jobs(4 * n, queue, JobStatus.SUCCEEDED, attempt=1, finished_at=now - 20 * minutes)
        jobs(n, queue, JobStatus.CANCELLED, finished_at=now - 30 * minutes)
        jobs(2, queue, JobStatus.SUCCEEDED, attempt=1, finished_at=now - 2 * 60 * minutes)  # too old to count
    jobs(2, "emails", JobStatus.SUCCEEDED, attempt=1, finished_at=now - 1 * minutes)  # no live jobs: no row
    JobFactory(queue="billing", status=JobStatus.QUEUED, run_at=now - 7 * minutes)  # the oldest ready one
    WaitingStepFactory.create_batch(2, queue="billing")
    WorkerRecord.objects.create(
        name="worker-a", host="web-1", pid=7, queues=["default"], concurrency=2, started_at=now, heartbeat_at=now
    )

    response = client.get(DASHBOARD)

    assert response.status_code == 200
    page = body(response)
    cells = dashboard_cells(page)
    assert sorted(cells) == ["billing", "default"]
    seen = timezone.now()
    for queue in ("default", "billing"):
        mine = Job.objects.filter(queue=queue)
        expected = {
            "waiting": mine.filter(status="waiting").count(),
            "ready": mine.filter(status="queued", run_at__lte=seen).count(),
            "scheduled": mine.filter(status="queued", run_at__gt=seen).count(),
            "running": mine.filter(status="running").count(),
            "dead": mine.filter(status="dead").count(),
        }
        assert {field: int(cells[queue][field]) for field in expected} == expected, queue
    assert {field: int(cells["billing"][field]) for field in ("waiting", "ready", "scheduled", "running", "dead")} == {
        "waiting": 2,
        "ready": 7,
        "scheduled": 4,
        "running": 2,
        "dead": 3,
    }
    for queue, oldest in (("default", 5), ("billing", 7)):
        age = float(cells[queue]["oldest"].removesuffix(" s"))
        assert oldest * 60 <= age < oldest * 60 + 60, (queue, age)
    total = int(re.search(r'data-field="total">(\d+)<', page).group(1))
    finished_recently = Job.objects.filter(
        status__in=["succeeded", "dead", "cancelled"], finished_at__gte=now - 59 * minutes
    ).count()
    assert total == finished_recently == (4 + 1 + 1) + (8 + 2 + 2) + 2
    # the same numbers as the stats functions the status command uses
    depths = stats.queue_depths()
    assert {d.queue: {f: getattr(d, f) for f in stats.STATES} for d in depths} == {
        queue: {field: int(value) for field, value in fields.items() if field != "oldest"}
        for queue, fields in cells.items()
    }
    assert stats.throughput().total == total
    # recent failures and workers
    failures = section(page, "workhorse-failures")
    assert "billing broke" in failures and "default broke" in failures
    assert failures.index("broke") < failures.index("long ago")  # newest first
    assert "worker-a" in section(page, "workhorse-workers")
    assert '<meta http-equiv="refresh" content="10">' in page


def test_dashboard_with_nothing_to_show(client, django_user_model):
    login(client, django_user_model, "viewer", ("view_job",))

    page = body(client.get(DASHBOARD))

    assert dashboard_cells(page) == {}
    assert "No queued, running or dead jobs." in page and "No dead jobs." in page and "No workers registered." in page
    assert re.search(r'data-field="total">0<', page)


def test_times_labelled_utc_are_in_utc_whatever_the_time_zone(client, django_user_model, world, settings):
    settings.TIME_ZONE = "America/New_York"
    login(client, django_user_model, "viewer", VIEW_PERMS)
    moment = datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt_timezone.utc)
    JobEvent.objects.create(job=world.keyed, kind=EventKind.CLAIMED, attempt=2, at=moment, details={})
    Job.objects.filter(pk=world.dead.pk).update(finished_at=moment)
    WorkerRecord.objects.filter(pk=world.worker.pk).update(heartbeat_at=moment)

    detail = body(client.get(change_url(JOBS, world.keyed.pk)))
    dashboard = body(client.get(DASHBOARD))

    assert "2024-01-02 03:04:05<" in section(detail, "workhorse-events")  # one precision: the second
    assert section(dashboard, "workhorse-failures").count("2024-01-02 03:04:05") == 2  # died; the worker's heartbeat
    assert "2024-01-01 22:04:05" not in detail + dashboard  # New York time


# -- nothing is edited by hand ---------------------------------------------------------------------


def test_nobody_adds_changes_or_deletes_jobs_by_hand(admin_client, world):
    before = snapshot()
    job = world.keyed
    form = {"job_type": "hacked", "queue": "hacked", "status": "succeeded", "priority": "100", "_save": "Save"}

    assert admin_client.get(f"{JOBS}add/").status_code == 403
    assert admin_client.post(f"{JOBS}add/", form).status_code == 403
    assert admin_client.post(change_url(JOBS, job.pk), form).status_code == 403
    assert admin_client.post(change_url(DEAD, world.dead.pk), form).status_code == 403
    assert admin_client.get(f"{JOBS}{job.pk}/delete/").status_code == 403
    assert admin_client.post(f"{JOBS}{job.pk}/delete/", {"post": "yes"}).status_code == 403
    assert admin_client.post(f"{BINDINGS}{world.binding.pk}/delete/", {"post": "yes"}).status_code == 403
    assert admin_client.post(change_url(BINDINGS, world.binding.pk), {"scope": "x", "_save": "Save"}).status_code == 403
    assert admin_client.post(change_url(WORKERS, world.worker.pk), {"name": "x", "_save": "Save"}).status_code == 403
    assert admin_client.post(f"{WORKERS}{world.worker.pk}/delete/", {"post": "yes"}).status_code == 403
    for url, target in ((JOBS, job.pk), (BINDINGS, world.binding.pk), (WORKERS, world.worker.pk)):
        response = post_action(admin_client, url, "delete_selected", [target], post="yes")
        assert response.status_code in (200, 302)
    assert snapshot() == before
    assert WorkerRecord.objects.filter(pk=world.worker.pk, name="worker-a").exists()

    page = body(admin_client.get(change_url(JOBS, job.pk)))
    assert 'name="_save"' not in page and f"{JOBS}{job.pk}/delete/" not in page
    listing = admin_client.get(JOBS)
    assert f"{JOBS}add/" not in body(listing)
    assert action_choices(listing) == {"cancel_jobs", "run_jobs_now", "redrive_jobs", "purge_jobs"}
    assert action_choices(admin_client.get(BINDINGS)) == {"release"}
    assert action_choices(admin_client.get(DEAD)) == {"redrive_jobs"}
