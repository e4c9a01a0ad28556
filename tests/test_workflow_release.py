"""Release of workflow steps (decision 0022, increment 4): the fenced statement that records a
parent's success releases every child whose last dependency it was; a stale lease, a second
recording or a retry releases nothing; concurrent parents of one child release it exactly once; a
death releases only edges that allow failure, whether the recorder, a clean stop or a reclaim buried
the parent. Real PostgreSQL; concurrency with real connections on threads."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_workhorse import EnqueueOptions, EnqueueOutcome, EnqueueRequest, Idempotency, enqueue, sql
from django_workhorse.models import Job, JobEvent, JobStatus
from django_workhorse.sql.claims import ClaimedJob, claim
from django_workhorse.tasks.retry import RetryPolicy
from django_workhorse.testing import eager
from django_workhorse.worker.execution import Outcome, record
from django_workhorse.workflows import Workflow
from tests.conftest import race
from tests.worker_tasks import CALLS, run_worker

LEASE = timedelta(minutes=5)


def request(queue: str = "default", max_attempts: int = 3) -> EnqueueRequest:
    return EnqueueRequest("tests.record", {"n": 1}, EnqueueOptions(queue=queue, max_attempts=max_attempts))


def claim_all(queue: str = "default", limit: int = 100) -> dict[int, ClaimedJob]:
    return {job.id: job for job in claim("default", queues=[queue], limit=limit, lease=LEASE, worker="t")}


def succeeded(job: ClaimedJob) -> Outcome:
    return Outcome(job, "succeeded", result_json='{"ok": true}', events=(("succeeded", {}),))


def statuses(jobs: dict[str, int]) -> dict[str, str]:
    found = dict(Job.objects.filter(pk__in=jobs.values()).values_list("id", "status"))
    return {step: found[job_id] for step, job_id in jobs.items()}


@pytest.mark.django_db(transaction=True)
def test_a_diamond_runs_each_step_once_after_its_parents():
    wf = Workflow("diamond")
    a = wf.add("a", request())
    b = wf.add("b", request(), after=a)
    c = wf.add("c", request(), after=[a])
    wf.add("d", request(), after=[b, c])
    jobs = wf.enqueue().jobs
    assert statuses(jobs) == {"a": "queued", "b": "waiting", "c": "waiting", "d": "waiting"}

    run_worker(concurrency=4)

    rows = {row.step_name: row for row in Job.objects.filter(pk__in=jobs.values())}
    assert {step: (row.status, row.attempt) for step, row in rows.items()} == dict.fromkeys(
        "abcd", (JobStatus.SUCCEEDED, 1)
    )
    for child, parents in {"b": "a", "c": "a", "d": "bc"}.items():
        for parent in parents:
            assert rows[parent].finished_at <= rows[child].started_at, (child, parent)
    ready = JobEvent.objects.filter(kind="ready").values_list("job_id", "details")
    assert sorted((job_id, details["released_by"] in {jobs[p] for p in "abc"}) for job_id, details in ready) == sorted(
        (jobs[step], True) for step in "bcd"
    )
    assert rows["d"].pending_parents == 0


@pytest.mark.django_db
def test_a_second_recording_of_the_same_attempt_and_a_retry_release_nothing():
    wf = Workflow("pair")
    wf.add("a", request())
    wf.add("b", request())
    wf.add("sink", request(), after=["a", "b"])
    jobs = wf.enqueue().jobs
    claimed = claim_all()
    first, second = claimed[jobs["a"]], claimed[jobs["b"]]

    assert record("default", [succeeded(first)]) == ["succeeded"]
    assert record("default", [succeeded(first)]) == ["lost"]  # the lease is spent: nothing happens
    retry = Outcome(second, "queued", error="boom", run_at=timezone.now(), events=(("retry_scheduled", {}),))
    assert record("default", [retry]) == ["queued"]

    sink = Job.objects.get(pk=jobs["sink"])
    assert (sink.status, sink.pending_parents) == (JobStatus.WAITING, 1)

    again = claim_all()[jobs["b"]]
    assert record("default", [succeeded(again)]) == ["succeeded"]
    sink.refresh_from_db()
    assert (sink.status, sink.pending_parents) == (JobStatus.QUEUED, 0)


@pytest.mark.django_db
def test_a_reclaimed_attempt_releases_nothing_when_its_stale_worker_records_it():
    wf = Workflow("stale")
    wf.add("a", request())
    wf.add("b", request(), after=["a"])
    jobs = wf.enqueue().jobs
    stale = claim_all()[jobs["a"]]
    Job.objects.filter(pk=jobs["a"]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert sql.outcomes.reclaim_expired("default") == 1

    assert record("default", [succeeded(stale)]) == ["lost"]
    assert statuses(jobs) == {"a": "queued", "b": "waiting"}


@pytest.mark.django_db(transaction=True)
def test_parents_finishing_in_concurrent_transactions_release_their_child_exactly_once():
    parents = 8
    for round_ in range(5):
        wf = Workflow(f"fan-in-{round_}")
        for i in range(parents):
            wf.add(f"p{i}", request())
        wf.add("sink", request(), after=[f"p{i}" for i in range(parents)])
        jobs = wf.enqueue().jobs
        claimed = claim_all()
        results = race(parents, lambda i, c=claimed, j=jobs: record("default", [succeeded(c[j[f"p{i}"]])]))
        assert results == [["succeeded"]] * parents
        sink = Job.objects.get(pk=jobs["sink"])
        assert (sink.status, sink.pending_parents) == (JobStatus.QUEUED, 0)
        assert JobEvent.objects.filter(job_id=sink.pk, kind="ready").count() == 1
        Job.objects.filter(pk=sink.pk).update(status=JobStatus.CANCELLED, finished_at=timezone.now())


@pytest.mark.django_db
@pytest.mark.parametrize("allow_failure", [True, False])
def test_a_death_releases_only_children_whose_edges_allow_it(allow_failure):
    wf = Workflow("death")
    wf.add("a", request(max_attempts=1))
    wf.add("b", request(), after=["a"], allow_failure=allow_failure)
    jobs = wf.enqueue().jobs
    job = claim_all()[jobs["a"]]
    assert record("default", [Outcome(job, "dead", error="boom", events=(("dead", {}),))]) == ["dead"]
    assert statuses(jobs) == {"a": "dead", "b": "queued" if allow_failure else "waiting"}


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["reclaim", "release"])
def test_a_step_buried_by_a_reclaim_or_a_clean_stop_releases_its_allow_failure_children(how):
    wf = Workflow("buried")
    wf.add("a", request(max_attempts=1))
    wf.add("tolerant", request(), after=["a"], allow_failure=True)
    wf.add("strict", request(), after=["a"])
    jobs = wf.enqueue().jobs
    job = claim_all()[jobs["a"]]
    if how == "reclaim":
        Job.objects.filter(pk=job.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        assert sql.outcomes.reclaim_expired("default") == 1
    else:
        sql.outcomes.release("default", [(job, True)])
    assert statuses(jobs) == {"a": "dead", "tolerant": "queued", "strict": "waiting"}


@pytest.mark.django_db
def test_the_claim_carries_the_workflow_and_plain_jobs_none():
    wf = Workflow("carried")
    wf.add("a", request(queue="carry"))
    result = wf.enqueue()
    plain = enqueue("tests.record", {"n": 2}, queue="carry")
    claimed = claim_all("carry")
    assert claimed[result.jobs["a"]].workflow_id == result.workflow_id
    assert claimed[plain].workflow_id is None


@pytest.mark.django_db(transaction=True)
def test_a_chord_callback_is_released_once_while_its_header_steps_retry():
    # Celery's chord counter breaks when a header task is retried or duplicated; here a retry records
    # "queued" (no release) and only the fenced success of each header step's last attempt counts.
    retry = RetryPolicy.fixed(timedelta(milliseconds=10))
    options = EnqueueOptions(max_attempts=5, retry_policy=retry)
    wf = Workflow("chord")
    header = [wf.add(f"h{n}", EnqueueRequest("tests.fail_until", {"succeed_on": 3}, options)) for n in range(3)]
    wf.add("callback", EnqueueRequest("tests.record", {"callback": True}), after=header)
    jobs = wf.enqueue().jobs
    CALLS.clear()

    run_worker(concurrency=4, max_jobs=3 * 3 + 1)

    rows = {row.step_name: row for row in Job.objects.filter(pk__in=jobs.values())}
    assert {step: (row.status, row.attempt) for step, row in rows.items()} == {
        **{f"h{n}": (JobStatus.SUCCEEDED, 3) for n in range(3)},
        "callback": (JobStatus.SUCCEEDED, 1),
    }
    assert JobEvent.objects.filter(job_id=jobs["callback"], kind="ready").count() == 1
    assert JobEvent.objects.filter(kind="retry_scheduled").count() == 6
    assert [call for call in CALLS.items() if call == {"callback": True}] == [{"callback": True}]
    assert rows["callback"].started_at >= max(rows[f"h{n}"].finished_at for n in range(3))


def eager_diamond() -> Workflow:
    wf = Workflow("eager diamond")  # unkeyed: each one is a new workflow
    wf.add("a", EnqueueRequest("tests.record", "a"))
    wf.add("b", EnqueueRequest("tests.record", "b"), after=["a"])
    wf.add("c", EnqueueRequest("tests.record", "c"), after=["a"])
    wf.add("d", EnqueueRequest("tests.record", "d"), after=["b", "c"])
    return wf


@pytest.mark.django_db
def test_eager_mode_runs_a_workflow_in_dependency_order_inside_enqueue():
    CALLS.clear()

    with eager(), transaction.atomic():
        jobs = eager_diamond().enqueue().jobs
        assert CALLS.items() == ["a", "b", "c", "d"]  # released steps run by id, in the caller's transaction
        assert set(statuses(jobs).values()) == {JobStatus.SUCCEEDED}
        CALLS.clear()
        eager_diamond().enqueue()
        assert CALLS.items() == ["a", "b", "c", "d"]


@pytest.mark.django_db
def test_eager_mode_leaves_the_children_of_a_dead_step_waiting_and_a_keyed_replay_runs_nothing():
    wf = Workflow("eager failure", idempotency=Idempotency("eager-failure"))
    wf.add("a", EnqueueRequest("tests.always_fail", "a", EnqueueOptions(max_attempts=1)))
    wf.add("b", EnqueueRequest("tests.record", "b"), after=["a"])
    wf.add("c", EnqueueRequest("tests.record", "c"))
    CALLS.clear()

    with eager(propagate=False):
        first = wf.enqueue()
        assert statuses(first.jobs) == {"a": JobStatus.DEAD, "b": JobStatus.WAITING, "c": JobStatus.SUCCEEDED}
        assert CALLS.items() == ["a", "c"]
        CALLS.clear()
        again = wf.enqueue()

    assert (again.outcome, again.jobs) == (EnqueueOutcome.REPLAYED, first.jobs)
    assert CALLS.items() == []


@pytest.mark.django_db
def test_the_releasing_statement_reads_jobs_by_primary_key_among_many_waiting_steps():
    # 20,000 waiting steps in other workflows, and a parent of 999: its recording must find its own
    # children by their ids (never by reading every waiting step through the waiting index), and
    # update them by primary key (a nested loop with the join as a filter was quadratic: 0.6 s).
    for n in range(20):
        other = Workflow(f"other {n}")
        other.add("root", request(queue="elsewhere"))
        for m in range(999):
            other.add(f"m{m}", request(), after=["root"])
        other.enqueue()
    wf = Workflow("fan out")
    wf.add("source", request())
    for m in range(999):
        wf.add(f"m{m}", request(), after=["source"])
    jobs = wf.enqueue().jobs
    (source,) = claim_all().values()
    params = {
        "outcomes": sql.outcomes._json_outcomes([succeeded(source)]),
        "channel": "unused",
        "result_channel": "unused",
    }

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workhorse_job, workhorse_job_dependency")  # plan under real statistics
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, BUFFERS OFF) " + sql.outcomes.RECORD_OUTCOMES_RELEASING, params)
        plan = [line for (line,) in cursor.fetchall()]

    text = "\n".join(plan)
    assert "workhorse_job_waiting_idx" not in text and "workhorse_job_lease_idx" not in text, text
    # Linear plans only. The quadratic one joined each of the 999 children against every waiting
    # step (about 20 million rows removed by its join filter); a plan that reads the 20,979 edges
    # once, or hashes the 21,000 jobs once, is linear, and which one the planner picks depends on
    # the server's version and statistics.
    removed = sum(int(n) for n in re.findall(r"Rows Removed by Join Filter: (\d+)", text))
    assert removed <= 2 * 21_000, text
    (released,) = [n for n, line in enumerate(plan) if line.strip() == "CTE released"]
    depth = len(plan[released]) - len(plan[released].lstrip())
    section = []  # the CTE's own subtree: the lines below it, indented deeper
    for line in plan[released + 1 :]:
        if len(line) - len(line.lstrip()) <= depth:
            break
        section.append(line)
    # The released children are updated by primary key (an index or bitmap scan per id), or through
    # one hash of the jobs; never by scanning the jobs once per child.
    for line in section:
        if "Seq Scan on workhorse_job " in line:
            assert re.search(r"loops=1\)", line), text
    assert Job.objects.filter(pk__in=jobs.values(), status=JobStatus.QUEUED).count() == 999
