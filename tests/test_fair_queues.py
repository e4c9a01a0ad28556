"""Fair queues (decision 0021, "Fair share"): the claim reads a fair queue round-robin across its
partition keys, priorities within a key, its unkeyed jobs as one more key; an unfair claim's plan is
unchanged; two claims never take one job; bad WORKHORSE_QUEUES values fail their check."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.checks import Error
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings

from django_workhorse import EnqueueOptions, EnqueueRequest, enqueue, enqueue_many, pause_queue
from django_workhorse import sql as workhorse_sql
from django_workhorse.admission import fair
from django_workhorse.checks import check_settings
from django_workhorse.conf import MAX_QUEUE_CHARS
from django_workhorse.models import JOB_FAIR_READY_IDX, JOB_READY_IDX, Job, JobStatus
from django_workhorse.operations import fair as fair_status
from django_workhorse.sql.claims import ClaimedJob
from tests.conftest import race
from tests.test_admin import body, login
from tests.worker_tasks import GATE, make_worker, running, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = timedelta(seconds=30)
QUEUE = "reports"


def enqueue_keyed(key: str | None, count: int, *, queue: str = QUEUE, priority: int = 0) -> list[int]:
    """Enqueue ``count`` jobs of partition key ``key`` (in batches of 1,000); return their ids."""
    options = EnqueueOptions(queue=queue, partition_key=key, priority=priority)
    ids: list[int] = []
    for start in range(0, count, 1000):
        batch = [EnqueueRequest("tests.record", {"n": n}, options) for n in range(start, min(count, start + 1000))]
        ids.extend(result.job_id for result in enqueue_many(batch))
    return ids


def claim(limit: int, *, after: str = "", unkeyed: bool = False, queues: list[str] | None = None) -> list[ClaimedJob]:
    return workhorse_sql.claims.claim(
        "default",
        queues=queues or [],
        limit=limit,
        lease=LEASE,
        worker="w",
        fair_queues=[(QUEUE, after, unkeyed)],
    )


def keys_of(jobs: list[ClaimedJob]) -> Counter[str | None]:
    return Counter(job.partition_key for job in jobs)


# -- the claim -------------------------------------------------------------------------------------------------------


def test_a_fair_claim_takes_each_key_its_share_despite_an_older_backlog():
    enqueue_keyed("tenant-a", 100)
    enqueue_keyed("tenant-b", 3)
    jobs = claim(10)
    assert keys_of(jobs) == {"tenant-a": 5, "tenant-b": 3}  # ceil(10 / 2) each, at most


def test_a_fair_claim_respects_priorities_within_a_key():
    low = enqueue_keyed("tenant-a", 3)
    high = enqueue_keyed("tenant-a", 2, priority=10)
    enqueue_keyed("tenant-b", 5)
    jobs = claim(4)
    assert [job.id for job in jobs if job.partition_key == "tenant-a"] == high
    assert not set(low) & {job.id for job in jobs}


def test_the_unkeyed_jobs_of_a_fair_queue_count_as_one_more_key():
    enqueue_keyed("tenant-a", 50)
    unkeyed = enqueue_keyed(None, 5)
    jobs = claim(6, unkeyed=True)
    assert keys_of(jobs) == {"tenant-a": 3, None: 3}
    assert [job.id for job in jobs if job.partition_key is None] == unkeyed[:3]


def test_a_claim_that_does_not_look_for_unkeyed_jobs_leaves_them():
    enqueue_keyed("tenant-a", 5)
    enqueue_keyed(None, 5)
    assert keys_of(claim(10)) == {"tenant-a": 5}


def test_a_fair_queue_with_only_unkeyed_jobs_is_claimed_whole_batches():
    enqueue_keyed(None, 30)
    assert len(claim(10, unkeyed=True)) == 10


def test_the_cursor_walks_every_key_once_when_there_are_more_keys_than_the_batch():
    keys = [f"acct-{n:02d}" for n in range(30)]
    for key in keys:
        enqueue_keyed(key, 3)
    cursors = fair.FairCursors([QUEUE])
    seen: list[str] = []
    for _ in range(3):
        reads = cursors.reads()
        jobs = workhorse_sql.claims.claim("default", queues=[], limit=10, lease=LEASE, worker="w", fair_queues=reads)
        cursors.advance(reads, jobs)
        assert max(keys_of(jobs).values()) == 1  # one head per key
        seen.extend(job.partition_key or "" for job in jobs)
    # 9 keys per claim (the 10th share is the unkeyed jobs', looked for at first), then 10: all 30 once but one.
    assert len(seen) == len(set(seen)) == 29
    reads = cursors.reads()
    jobs = workhorse_sql.claims.claim("default", queues=[], limit=10, lease=LEASE, worker="w", fair_queues=reads)
    assert keys_of(jobs)[keys[-1]] == 1  # the one left comes next, then the ring starts again
    assert keys_of(jobs)[keys[0]] == 1


def test_a_key_whose_jobs_are_all_scheduled_later_is_passed_over():
    later = EnqueueOptions(queue=QUEUE, partition_key="tenant-later", delay=timedelta(hours=1))
    enqueue("tests.record", {}, later)
    enqueue_keyed("tenant-now", 2)
    assert keys_of(claim(10)) == {"tenant-now": 2}


def test_a_paused_fair_queue_is_not_claimed():
    enqueue_keyed("tenant-a", 2)
    pause_queue(QUEUE)
    assert claim(10) == []


def test_unfair_and_fair_queues_claim_together_in_one_statement():
    enqueue_keyed(None, 3, queue="plain")
    enqueue_keyed("tenant-a", 3)
    jobs = claim(10, queues=["plain"])
    assert Counter(job.queue for job in jobs) == {"plain": 3, QUEUE: 3}


def test_two_claims_in_parallel_never_take_the_same_job():
    ids = set()
    for n in range(8):
        ids.update(enqueue_keyed(f"tenant-{n}", 40))
    ids.update(enqueue_keyed(None, 40))

    def claim_until_empty(_: int) -> list[int]:
        taken: list[int] = []
        cursors = fair.FairCursors([QUEUE])
        while True:
            reads = cursors.reads()
            reads = [(queue, after, True) for queue, after, _ in reads]
            jobs = workhorse_sql.claims.claim("default", queues=[], limit=7, lease=LEASE, worker="w", fair_queues=reads)
            if not jobs and not Job.objects.filter(queue=QUEUE, status=JobStatus.QUEUED).exists():
                return taken
            cursors.advance(reads, jobs)
            taken.extend(job.id for job in jobs)

    first, second = race(2, claim_until_empty)
    assert isinstance(first, list) and isinstance(second, list), (first, second)
    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(ids)
    assert set(Job.objects.filter(pk__in=ids).values_list("attempt", flat=True)) == {1}


# -- the cursor ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "keys", "expected"),
    [
        ("", [], ""),
        ("", ["b", "a", None], "b"),
        ("m", ["n", "z"], "z"),
        ("m", ["n", "z", "a", "c"], "c"),  # wrapped round: ended at c
        ("m", ["m"], "m"),
        ("m", [None], "m"),
    ],
)
def test_next_cursor(after, keys, expected):
    assert fair.next_cursor(after, keys) == expected


def test_a_worker_splits_its_queues_by_the_setting():
    with override_settings(WORKHORSE_QUEUES={QUEUE: {"fair": True}, "mail": {"fair": False}}):
        assert fair.split_queues(["default", QUEUE, "mail"]) == (["default", "mail"], [QUEUE])


# -- the plans -------------------------------------------------------------------------------------------------------


def _plan(params: dict[str, Any]) -> dict[str, Any]:
    with transaction.atomic(), connection.cursor() as cursor:
        statement = workhorse_sql.claims.CLAIM_FAIR if params["fair_queues"] else workhorse_sql.claims.CLAIM
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
        value = cursor.fetchone()[0]
        transaction.set_rollback(True)
    return (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


def _params(queues: list[str], fair_queues: list[str], limit: int = 50) -> dict[str, Any]:
    return {
        "queues": queues, "fair_queues": fair_queues, "fair_after": [""] * len(fair_queues),
        "fair_unkeyed": [False] * len(fair_queues), "limit": limit, "lease": LEASE, "worker": "explain",
    }  # fmt: skip


def _fill_keys(keys: int, per_key: int) -> None:
    options = [EnqueueOptions(queue=QUEUE, partition_key=f"acct-{k:04d}") for k in range(keys)]
    requests = [EnqueueRequest("tests.record", {}, option) for _ in range(per_key) for option in options]
    for start in range(0, len(requests), 1000):
        enqueue_many(requests[start : start + 1000])
    enqueue_keyed(None, 1000, queue="plain")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE workhorse_job")


def _candidates(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes that read the claim's candidates (the ``candidates`` CTE and what it reads)."""
    (cte,) = [node for node in _nodes(plan) if node.get("Subplan Name") == "CTE candidates"]
    keys = [node for node in _nodes(plan) if node.get("Subplan Name") == "CTE fair_keys"]
    return _nodes(cte) + [node for key in keys for node in _nodes(key)]


def test_an_unfair_claim_reads_its_queue_as_before_and_has_none_of_the_fair_branches():
    _fill_keys(100, 5)
    nodes = _candidates(_plan(_params(["plain"], [])))
    scans = [node for node in nodes if node.get("Relation Name") == "workhorse_job"]
    run = [node for node in scans if node["Actual Loops"] > 0]
    assert [node.get("Index Name") for node in run] == [JOB_READY_IDX], scans  # the queue, read as before
    assert run[0]["Actual Rows"] == 50
    assert not [node for node in scans if node.get("Index Name") == JOB_FAIR_READY_IDX]  # a worker without fair queues


def test_a_fair_claim_statement_with_no_fair_queue_runs_none_of_the_fair_branches():
    _fill_keys(100, 5)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + workhorse_sql.claims.CLAIM_FAIR, _params(["plain"], []))
        value = cursor.fetchone()[0]
        transaction.set_rollback(True)
    scans = [
        node
        for node in _candidates((json.loads(value) if isinstance(value, str) else value)[0]["Plan"])
        if node.get("Relation Name") == "workhorse_job"
    ]
    fair_scans = [node for node in scans if node.get("Index Name") == JOB_FAIR_READY_IDX]
    assert fair_scans and all(node["Actual Loops"] == 0 for node in fair_scans)  # never executed


def test_the_loose_scan_over_a_thousand_keys_reads_a_batch_of_keys_not_every_job():
    _fill_keys(1000, 5)
    nodes = _candidates(_plan(_params([], [QUEUE], limit=50)))
    scans = [node for node in nodes if node.get("Relation Name") == "workhorse_job"]
    assert all(node["Node Type"] != "Seq Scan" for node in scans)
    assert all(node.get("Index Name") != JOB_READY_IDX or node["Actual Loops"] == 0 for node in scans)
    fair_scans = [node for node in scans if node.get("Index Name") == JOB_FAIR_READY_IDX]
    # One descent per key found (50) and one head per key: each returns at most one row per loop.
    assert sum(node["Actual Loops"] for node in fair_scans) <= 2 * 50 + 2
    assert sum(node["Actual Rows"] * node["Actual Loops"] for node in fair_scans) <= 2 * 50 + 2
    assert Job.objects.filter(queue=QUEUE, status=JobStatus.QUEUED).count() == 5000  # rolled back


# -- WORKHORSE_QUEUES ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "queues",
    [{}, {QUEUE: {"fair": True}}, {QUEUE: {"fair": False}}, {QUEUE: {}}, {"q" * MAX_QUEUE_CHARS: {"fair": True}}],
    ids=["empty", "fair", "unfair", "no-options", "longest-name"],
)
def test_good_queue_settings_pass_the_check(queues):
    with override_settings(WORKHORSE_QUEUES=queues):
        assert check_settings() == []


@pytest.mark.parametrize(
    ("queues", "message", "check_id"),
    [
        ([QUEUE], f"WORKHORSE_QUEUES must be a dict of queue names to options, got {[QUEUE]!r}.", "workhorse.E410"),
        ({QUEUE: True}, f"WORKHORSE_QUEUES[{QUEUE!r}] must be a dict of options (fair), got True.", "workhorse.E410"),
        (
            {QUEUE: {"fair": True, "weight": 2}},
            f"WORKHORSE_QUEUES[{QUEUE!r}] has unknown options 'weight' (known: fair).",
            "workhorse.E410",
        ),
        ({QUEUE: {"fair": 1}}, f"WORKHORSE_QUEUES[{QUEUE!r}]['fair'] must be True or False, got 1.", "workhorse.E410"),
        (
            {QUEUE: {"fair": "yes"}},
            f"WORKHORSE_QUEUES[{QUEUE!r}]['fair'] must be True or False, got 'yes'.",
            "workhorse.E410",
        ),
    ],
    ids=["not-a-dict", "options-not-a-dict", "unknown-option", "fair-int", "fair-str"],
)
def test_bad_queue_settings_fail_the_check(queues, message, check_id):
    with override_settings(WORKHORSE_QUEUES=queues):
        assert check_settings() == [Error(message, id=check_id)]


@pytest.mark.parametrize(
    "name", ["", "q" * (MAX_QUEUE_CHARS + 1), 7, "a\x00b"], ids=["empty", "too-long", "int", "nul"]
)
def test_bad_queue_names_fail_the_check(name):
    with override_settings(WORKHORSE_QUEUES={name: {"fair": True}}):
        errors = check_settings()
    assert [error.id for error in errors] == ["workhorse.E411"]
    assert "WORKHORSE_QUEUES key" in errors[0].msg


# -- what an operator sees -------------------------------------------------------------------------------------------


def status_json() -> dict[str, Any]:
    out = StringIO()
    call_command("workhorse_status", "--json", stdout=out)
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def test_status_shows_each_fair_queues_keys_with_ready_work_and_the_largest():
    assert status_json()["fair_queues"] == []
    for n in range(fair_status.TOP_KEYS + 2):
        enqueue_keyed(f"tenant-{n}", n + 1)
    enqueue_keyed(None, 4)
    enqueue("tests.record", {}, EnqueueOptions(queue=QUEUE, partition_key="later", delay=timedelta(hours=1)))
    with override_settings(WORKHORSE_QUEUES={QUEUE: {"fair": True}, "other": {"fair": False}}):
        [entry] = status_json()["fair_queues"]
        out = StringIO()
        call_command("workhorse_status", stdout=out)
    assert entry == {
        "queue": QUEUE,
        "keys_with_ready_work": fair_status.TOP_KEYS + 2,
        "unkeyed_ready": 4,
        "top_keys": [{"key": f"tenant-{n}", "ready": n + 1} for n in range(fair_status.TOP_KEYS + 1, 1, -1)],
    }
    text = out.getvalue()
    assert "Fair queues" in text and "tenant-6 (7), tenant-5 (6)" in text


def test_the_gauge_counts_keys_with_ready_work_per_fair_queue():
    pytest.importorskip("prometheus_client")
    from django_workhorse.observability.metrics.gauges import DatabaseGauges

    enqueue_keyed("tenant-a", 3)
    enqueue_keyed("tenant-b", 1)
    with override_settings(WORKHORSE_QUEUES={QUEUE: {"fair": True}}):
        metrics = {metric.name: metric for metric in DatabaseGauges(ttl=0).collect()}
    [sample] = metrics["workhorse_fair_queue_keys"].samples
    assert (sample.labels, sample.value) == ({"queue": QUEUE}, 2.0)


def test_the_dashboard_marks_fair_queues(client, django_user_model):
    enqueue_keyed("tenant-a", 1)
    enqueue_keyed(None, 1, queue="plain")
    login(client, django_user_model, "viewer", ("view_job",))
    with override_settings(WORKHORSE_QUEUES={QUEUE: {"fair": True}}):
        page = body(client.get("/admin/workhorse/job/dashboard/"))
    rows = {row.split('"')[0]: row for row in page.split('<tr data-queue="')[1:]}
    assert 'data-field="fair"' in rows[QUEUE].split("</tr>")[0]
    assert 'data-field="fair"' not in rows["plain"].split("</tr>")[0]


def test_a_key_behind_a_dominant_keys_backlog_is_read_at_its_head_in_the_generic_plan():
    # With one key's 2,000 jobs in the statistics (and no other key), a generic plan would find any key's head as
    # cheaply through the ready index (filtering on the key), and read past the big key's jobs to
    # reach a small key's: the head's order names the key, which only the fair index gives.
    enqueue_keyed("tenant-a", 2000)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE workhorse_job")  # the statistics see one key
    [small] = enqueue_keyed("tenant-b", 1)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        params = {**_params([], [QUEUE], limit=1), "fair_after": ["tenant-a"]}
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + workhorse_sql.claims.CLAIM_FAIR, params)
        value = cursor.fetchone()[0]
        claimed = Job.objects.filter(pk=small, status=JobStatus.RUNNING).exists()
        transaction.set_rollback(True)
    scans = [
        node
        for node in _candidates((json.loads(value) if isinstance(value, str) else value)[0]["Plan"])
        if node.get("Relation Name") == "workhorse_job" and node["Actual Loops"] > 0
    ]
    assert claimed
    read = sum((node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"] for node in scans)
    assert read <= 10, scans
    assert {node.get("Index Name") for node in scans} == {JOB_FAIR_READY_IDX}


@pytest.mark.parametrize(("queue", "claimed"), [(QUEUE, 2), ("plain", 5)])
def test_a_worker_claims_a_fair_queue_only_for_its_idle_executors(queue, claimed):
    # A job claimed ahead is an order decided before later jobs (a small tenant's) could take
    # part in it. The control: an unfair queue's worker holds a batch beyond its executors.
    GATE.reset()
    ids = [
        enqueue("tests.gated", {"label": "fair-held"}, EnqueueOptions(queue=queue, partition_key=f"k{n}"))
        for n in range(10)
    ]
    with (
        override_settings(WORKHORSE_QUEUES={QUEUE: {"fair": True}}),
        running(make_worker(queues=[queue], concurrency=2, batch=5)),
    ):
        wait_for(lambda: GATE.in_flight("fair-held") == 2, 10, what="two handlers running")
        assert Job.objects.filter(pk__in=ids, status=JobStatus.RUNNING).count() == claimed
        GATE.open("fair-held")
        wait_for(lambda: Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == 10, 20)
