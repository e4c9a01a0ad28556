"""The admin against hostile input: filters and searches it refuses, values it must still render.

Every filter and search parameter of every list is tried with text PostgreSQL cannot store (NUL),
bytes that are not UTF-8, non-numbers where numbers are expected and numbers beyond bigint: each
gives the admin's usual answer for a bad lookup (a redirect to ``?e=1``) or, for a filter choice
that does not exist, the unfiltered list; never a server error. Jobs written straight to the
database with hostile but storable values render, escaped. Lists never load payloads or results,
and the workers list costs the same number of queries however many workers there are.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from html import unescape
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_workhorse.admin import JSON_DISPLAY_CHARS, FindKeyForm
from django_workhorse.models import EventKind, IdempotencyBinding, Job, JobEvent, JobStatus, WorkerRecord
from tests.factories import JobFactory
from tests.test_admin import (
    BINDINGS,
    DASHBOARD,
    DEAD,
    FIND,
    JOBS,
    VIEW_PERMS,
    WORKERS,
    body,
    change_url,
    login,
    result_ids,
)

pytestmark = pytest.mark.django_db

NUL = "%00"
NOT_UTF8 = "%ED%A0%80"  # a lone surrogate's UTF-8 form: not UTF-8, decoded to replacement characters
BEYOND_BIGINT = str(2**63)
BELOW_BIGINT = str(-(2**63) - 1)
NOT_A_NUMBER = "%C2%B2"  # "²": str.isdigit() says yes, int() says no

# Every filter and search parameter of each list, with a valid value (the lists' own lookups and
# the plain field lookups Django accepts from the query string).
PARAMETERS = {
    JOBS: ["status", "status__exact", "queue", "queue__isnull", "job_type", "has_key", "tag", "q", "id", "priority"],
    DEAD: ["queue", "job_type", "tag", "q", "id", "attempt"],
    BINDINGS: ["mode", "mode__exact", "state", "scope", "q", "id", "job"],
    WORKERS: ["q", "id", "pid", "name"],
}
CASES = [(url, name) for url, names in PARAMETERS.items() for name in names]
NUMERIC = {"id", "priority", "attempt", "job", "pid"}


def is_refused(response: Any) -> bool:
    """The admin's answer to a bad lookup: back to the unfiltered list, flagged ``?e=1``."""
    return response.status_code == 302 and response["Location"].endswith("?e=1")


@pytest.fixture
def viewer(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW_PERMS)
    job = JobFactory(tags=["vip"], status=JobStatus.DEAD)
    WorkerRecord.objects.create(
        name="w-1", host="h", pid=1, queues=["default"], concurrency=1, started_at=job.run_at, heartbeat_at=job.run_at
    )
    return client


@pytest.mark.parametrize(("url", "name"), CASES, ids=[f"{url.split('/')[-2]}-{name}" for url, name in CASES])
def test_a_nul_in_any_filter_or_search_is_refused(viewer, url, name):
    assert is_refused(viewer.get(f"{url}?{name}=a{NUL}b"))
    assert is_refused(viewer.get(f"{url}?{name}={NUL}"))


@pytest.mark.parametrize(("url", "name"), CASES, ids=[f"{url.split('/')[-2]}-{name}" for url, name in CASES])
def test_bytes_that_are_not_utf8_in_any_filter_or_search_are_refused_or_match_nothing(viewer, url, name):
    response = viewer.get(f"{url}?{name}={NOT_UTF8}")

    if name in NUMERIC:
        assert is_refused(response)
    elif name in {"has_key", "state"} or url == WORKERS:  # not a choice of the filter, or no search: ignored
        assert response.status_code == 200
    else:
        assert is_refused(response) or result_ids(response) == set()


@pytest.mark.parametrize(("url", "name"), CASES, ids=[f"{url.split('/')[-2]}-{name}" for url, name in CASES])
@pytest.mark.parametrize("value", ["abc", NOT_A_NUMBER, BEYOND_BIGINT, BELOW_BIGINT, "1.5", "9" * 5000])
def test_a_non_number_or_a_number_beyond_bigint_in_any_filter_or_search_is_a_normal_answer(viewer, url, name, value):
    response = viewer.get(f"{url}?{name}={value}")

    if name in NUMERIC:
        assert is_refused(response)
    else:
        assert response.status_code == 200 or is_refused(response)


@pytest.mark.parametrize("url", list(PARAMETERS))
@pytest.mark.parametrize(
    "query",
    [
        f"{NUL}=1",
        f"id__in=1,{BEYOND_BIGINT}",
        "id__in=1,x",
        f"id__gt={BEYOND_BIGINT}",
        f"pk={BEYOND_BIGINT}",
        f"o={NUL}",
        f"p={NUL}",
        f"p={BEYOND_BIGINT}",
        f"q=1&q={NUL}",
    ],
)
def test_other_lookups_and_list_parameters_are_refused_not_a_server_error(viewer, url, query):
    response = viewer.get(f"{url}?{query}")

    assert response.status_code == 200 or is_refused(response)
    if NUL in query or "x" in query:
        assert is_refused(response)


@pytest.mark.parametrize(
    ("url", "field"), [(JOBS, "job_type"), (DEAD, "queue"), (BINDINGS, "scope"), (WORKERS, "name")]
)
def test_a_lookup_postgresql_refuses_only_when_it_runs_is_refused(viewer, url, field):
    assert is_refused(viewer.get(f"{url}?{field}__regex=("))  # not a regular expression
    assert viewer.get(f"{url}?{field}__regex=.").status_code == 200


@pytest.mark.parametrize("url", [JOBS, DEAD, BINDINGS])
def test_a_search_for_a_huge_or_odd_number_matches_it_as_text_only(viewer, url):
    for term in ("9" * 30, BEYOND_BIGINT, "٣", NOT_A_NUMBER, "0x1f", "ff" * 40):
        assert result_ids(viewer.get(f"{url}?q={term}")) == set(), term


def test_a_valid_lookup_still_filters(viewer):
    job = Job.objects.get()
    assert result_ids(viewer.get(f"{JOBS}?id={job.pk}")) == {job.pk}
    assert result_ids(viewer.get(f"{JOBS}?q={job.pk}")) == {job.pk}
    assert result_ids(viewer.get(f"{DEAD}?tag=vip")) == {job.pk}


@pytest.mark.parametrize("url", [f"{JOBS}{{}}/change/", f"{DEAD}{{}}/change/", f"{BINDINGS}{{}}/change/"])
@pytest.mark.parametrize("object_id", [NUL, BEYOND_BIGINT, "abc", NOT_UTF8])
def test_a_detail_page_of_an_impossible_id_says_it_does_not_exist(viewer, url, object_id):
    response = viewer.get(url.format(object_id))

    assert response.status_code == 302 and response["Location"] == "/admin/"


# -- the find form ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "key"),
    [("orders", "a\x00b"), ("or\x00ders", "key"), ("s" * 257, "key"), ("orders", "k" * 513)],
    ids=["NUL key", "NUL scope", "scope too long", "key too long"],
)
def test_the_find_form_refuses_an_unstorable_key_or_scope_as_a_form_error(viewer, scope, key):
    response = viewer.post(FIND, {"scope": scope, "key": key})

    assert response.status_code == 200
    assert response.context["form"].errors
    assert "a\x00b" not in body(response) and "k" * 513 not in body(response)


def test_the_find_form_takes_bytes_that_are_not_utf8_as_a_key_that_finds_nothing(viewer):
    response = viewer.post(FIND, f"scope=orders&key={NOT_UTF8}", content_type="application/x-www-form-urlencoded")

    assert response.status_code == 200
    assert "No binding holds that key" in body(response)


@pytest.mark.parametrize(("scope", "key"), [("orders", "\ud800"), ("\udfff", "key")], ids=["key", "scope"])
def test_the_find_form_refuses_a_lone_surrogate(scope, key):
    form = FindKeyForm({"scope": scope, "key": key})  # a browser cannot send one; a form may still get one

    assert not form.is_valid()
    assert "\ud800" not in str(form.errors)


# -- lists never load large values ---------------------------------------------------------------


def listed_columns(sql: str) -> str:
    """The select list of a query (what it loads), without its WHERE clause."""
    return sql.split(" FROM ", 1)[0]


def without_error_head(columns: str) -> str:
    """A select list without what a listing reads of the error: its start, and its length."""
    return columns.replace('LEFT("workhorse_job"."last_error"', "").replace('LENGTH("workhorse_job"."last_error"', "")


@pytest.mark.parametrize("url", [JOBS, DEAD], ids=["jobs", "dead letters"])
def test_job_lists_never_load_payloads_results_or_whole_errors(viewer, url):
    now = timezone.now()
    big = "x" * 200_000
    for _ in range(3):
        JobFactory(
            payload={"big": big}, result={"big": big}, last_error=f"Boom\n{big}", status=JobStatus.DEAD, finished_at=now
        )

    with CaptureQueriesContext(connection) as queries:
        response = viewer.get(url)

    assert len(result_ids(response)) == 4
    job_queries = [
        q["sql"] for q in queries.captured_queries if '"workhorse_job"."job_type"' in listed_columns(q["sql"])
    ]
    assert job_queries, "the list's query was not captured"
    for sql in job_queries:
        columns = listed_columns(sql)
        assert '"workhorse_job"."payload"' not in columns
        assert '"workhorse_job"."result"' not in columns
        assert '"workhorse_job"."last_error"' not in without_error_head(columns)
    assert big not in body(response)
    if url == DEAD:
        assert "Boom" in body(response)


# -- the workers list: one query for all their jobs ------------------------------------------------


def add_workers(count: int) -> None:
    now = timezone.now()
    for _ in range(count):
        name = f"worker-{uuid.uuid4().hex[:8]}"
        WorkerRecord.objects.create(
            name=name, host="h", pid=1, queues=["default"], concurrency=2, started_at=now, heartbeat_at=now
        )
        for _ in range(2):
            JobFactory(
                status=JobStatus.RUNNING,
                claimed_by=name,
                started_at=now,
                lease_token=uuid.uuid4(),
                lease_expires_at=now + timedelta(minutes=5),
            )


def test_the_workers_list_costs_the_same_queries_for_one_worker_or_many(viewer):
    def queries_for_list() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as queries:
            response = viewer.get(WORKERS)
        assert response.status_code == 200
        return len(queries.captured_queries), body(response)

    add_workers(1)
    few, _ = queries_for_list()
    add_workers(10)
    many, page = queries_for_list()

    assert many == few
    for job in Job.objects.filter(status=JobStatus.RUNNING):
        assert f'href="{change_url(JOBS, job.pk)}">#{job.pk}</a>' in page


# -- the job page renders whatever is stored -----------------------------------------------------

HOSTILE_TEXT = (
    "<script>alert(1)</script> \u202eRTL\u202c \u200f emoji 🐎👩‍👩‍👧 \x01\x07\x1b[31m \ufeff \\u0000 tab\tend"
)


def nested(depth: int) -> Any:
    value: Any = HOSTILE_TEXT
    for level in range(depth):
        value = {f"k{level}\x02<b>": value} if level % 2 else [value]
    return value


@pytest.mark.parametrize(
    "fields",
    [
        {"payload": nested(90), "result": nested(90)},
        {"payload": nested(900), "result": None},
        {"payload": {"html": HOSTILE_TEXT, HOSTILE_TEXT: [HOSTILE_TEXT]}, "result": "y" * 2_000_000},
        {"payload": None, "result": HOSTILE_TEXT},
        {"payload": [], "result": 0},
        {"payload": "plain", "result": False},
        {"payload": 1.5e300, "result": [None, True, -1, 10**30]},
        {"payload": {}, "result": {}, "last_error": f"{HOSTILE_TEXT}\n" + "e" * 100_000},
        {"payload": {}, "result": None, "tags": [HOSTILE_TEXT], "job_type": HOSTILE_TEXT, "queue": HOSTILE_TEXT},
    ],
    ids=[
        "nested 90 deep",
        "nested 900 deep",
        "2 MB result",
        "null payload",
        "empty and zero",
        "string and false",
        "numbers",
        "100 KB error",
        "hostile names",
    ],
)
@pytest.mark.parametrize("base", [JOBS, DEAD], ids=["job page", "dead letter page"])
def test_the_job_page_renders_any_stored_value_escaped(viewer, base, fields):
    now = timezone.now()
    job = JobFactory(status=JobStatus.DEAD, finished_at=now, **fields)
    JobEvent.objects.create(
        job=job,
        kind=EventKind.FAILED,
        attempt=1,
        at=now,
        details={"error": HOSTILE_TEXT * 1000, HOSTILE_TEXT: nested(50)},
    )

    response = viewer.get(change_url(base, job.pk))
    listing = viewer.get(f"{base}?q={job.pk}")

    assert response.status_code == 200
    page = body(response)
    assert "<script>alert(1)" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert len(page) < 3 * JSON_DISPLAY_CHARS + 400_000  # cut, not the whole 2 MB
    if fields.get("result") == "y" * 2_000_000:
        assert "more characters not shown" in unescape(page)
    assert listing.status_code == 200 and "<script>alert(1)" not in body(listing)


def test_a_binding_page_renders_hostile_but_storable_values(viewer):
    job = JobFactory()
    binding = IdempotencyBinding.objects.create(
        scope=HOSTILE_TEXT[:200],
        key_hash=b"\x00" * 32,
        key_preview="<b>x</b>\x01",
        mode="idempotency",
        request_digest=b"\xff" * 32,
        field_digests={HOSTILE_TEXT: HOSTILE_TEXT},
        job=job,
        created_at=timezone.now(),
    )

    for url in (change_url(BINDINGS, binding.pk), BINDINGS, change_url(JOBS, job.pk)):
        response = viewer.get(url)
        assert response.status_code == 200, url
        assert "<script>alert(1)" not in body(response) and "<b>x</b>" not in body(response), url


def test_the_dashboard_never_loads_payloads_results_or_whole_errors(viewer):
    big = "x" * 200_000
    JobFactory(payload={"big": big}, result={"big": big}, last_error=f"Boom\n{big}", status=JobStatus.DEAD)

    with CaptureQueriesContext(connection) as queries:
        response = viewer.get(DASHBOARD)

    assert response.status_code == 200 and "Boom" in body(response) and big not in body(response)
    # Django 5.2 records no text (None) for a statement run on a server-side-bound cursor of
    # sql.connection (the rate budgets' read, which reads workhorse_rate_budget only); Django 6 does.
    texts = [q["sql"] or "" for q in queries.captured_queries]
    columns = [listed_columns(text) for text in texts if "workhorse_job" in text]
    assert any('"workhorse_job"."job_type"' in c for c in columns), "the failures' query was not captured"
    for listed in columns:
        assert '"workhorse_job"."payload"' not in listed and '"workhorse_job"."result"' not in listed
        assert '"workhorse_job"."last_error"' not in without_error_head(listed)
