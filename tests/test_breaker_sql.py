"""The breaker statements at their edges, on real PostgreSQL: the claim's verdicts (held count,
canary slots, a wedged half-open breaker), the sliding window, the cooldown's cap, and the closing
write's lock order."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_workhorse import Breaker, enqueue, reset_breaker
from django_workhorse.admission.recording import record_attempts
from django_workhorse.models import Breaker as BreakerRow
from django_workhorse.models import Job, JobEvent
from django_workhorse.sql import breakers as breaker_sql
from django_workhorse.sql import claims
from tests.conftest import connect_directly

POLICY = Breaker(
    failures=3, within=timedelta(seconds=60), cooldown=timedelta(seconds=10), max_cooldown=timedelta(seconds=15)
)
LEASE = timedelta(seconds=30)


def row(key: str = "k", **fields) -> BreakerRow:
    defaults = {
        "state": "closed",
        "cooldown": POLICY.cooldown,
        "probes": POLICY.probes,
        "policy": POLICY.to_json(),
        "changed_at": timezone.now(),
    }
    return BreakerRow.objects.create(key=key, **{**defaults, **fields})


def claim(limit: int = 10) -> claims.Claimed:
    return claims.claim("default", queues=["default"], limit=limit, lease=LEASE, worker="w")


def verdicts(key: str, *, failures: int = 0, succeeded: bool = False) -> list[breaker_sql.Transition]:
    entry = {"key": key, "failures": failures, "succeeded": succeeded, "policy": POLICY.to_json()}
    return breaker_sql.record_verdicts("default", [entry])


@pytest.mark.django_db
def test_a_claim_reports_the_jobs_it_held_and_admits_the_rest():
    row(state="open", open_until=timezone.now() + timedelta(hours=1))
    held = [enqueue("tests.record", {}, breaker_key="k", priority=9) for _ in range(3)]
    plain = enqueue("tests.record", {}, priority=1)

    first = claim(limit=3)
    assert (list(first), first.held) == ([], 3)
    second = claim(limit=3)
    assert ([job.id for job in second], second.held) == ([plain], 0)
    assert JobEvent.objects.filter(kind="held", job_id__in=held).count() == 3
    assert set(Job.objects.filter(pk__in=held).values_list("attempt", flat=True)) == {0}


@pytest.mark.django_db
def test_one_canary_per_breaker_per_claim_and_the_others_held_for_a_cooldown():
    row(state="open", open_until=timezone.now() - timedelta(seconds=1), probes=5)
    ids = [enqueue("tests.record", {}, breaker_key="k") for _ in range(4)]

    got = claim()

    assert [job.id for job in got] == ids[:1] and got[0].half_opened and got.held == 3
    breaker = BreakerRow.objects.get(key="k")
    assert (breaker.state, breaker.probes_admitted) == ("half_open", 1)
    for job in Job.objects.filter(pk__in=ids[1:]):
        assert job.run_at > timezone.now() + POLICY.cooldown - timedelta(seconds=5)
    # A job of a closed breaker (or none) is admitted as ever.
    other = enqueue("tests.record", {}, breaker_key="other")
    assert [job.id for job in claim()] == [other]


@pytest.mark.django_db
def test_a_half_open_breaker_without_a_verdict_for_its_cooldown_and_a_lease_admits_a_new_round():
    long_ago = timezone.now() - POLICY.cooldown - LEASE - timedelta(seconds=1)
    row(state="half_open", probes_admitted=1, changed_at=long_ago)
    job_id = enqueue("tests.record", {}, breaker_key="k")
    got = claim()
    assert [job.id for job in got] == [job_id] and not got[0].half_opened
    assert BreakerRow.objects.get(key="k").probes_admitted == 1

    recent = row(key="recent", state="half_open", probes_admitted=1)
    waiting = enqueue("tests.record", {}, breaker_key=recent.key)
    got = claim()
    assert (list(got), got.held) == ([], 1)
    assert Job.objects.get(pk=waiting).held_since is not None


@pytest.mark.django_db
def test_the_window_is_exact_failures_outside_it_do_not_open_the_breaker():
    now = time.time()
    row(recent_failures=[now - 120, now - 119])
    assert verdicts("k", failures=1) == []
    breaker = BreakerRow.objects.get(key="k")
    assert breaker.state == "closed" and len(breaker.recent_failures) == 3
    assert breaker.recent_failures[:2] == [now - 120, now - 119]
    # Two more within the minute: the last three are all within it.
    [opened] = verdicts("k", failures=2)
    assert (opened.from_state, opened.to_state, opened.cooldown_seconds) == ("closed", "open", 10.0)
    breaker = BreakerRow.objects.get(key="k")
    assert breaker.state == "open" and len(breaker.recent_failures) == POLICY.failures


@pytest.mark.django_db
def test_a_new_key_opens_after_exactly_failures_in_one_batch_or_several():
    assert verdicts("a", failures=2) == []
    assert BreakerRow.objects.get(key="a").state == "closed"
    [opened] = verdicts("a", failures=1)
    assert opened.to_state == "open"
    [opened] = verdicts("b", failures=3)
    assert opened.to_state == "open"
    assert verdicts("c", succeeded=True) == [] and not BreakerRow.objects.filter(key="c").exists()


@pytest.mark.django_db
def test_a_failed_canary_doubles_the_cooldown_up_to_max_cooldown():
    row(state="half_open", cooldown=timedelta(seconds=10))
    [reopened] = verdicts("k", failures=1)
    assert (reopened.to_state, reopened.cooldown_seconds, reopened.reason) == ("open", 15.0, "a canary failed")
    BreakerRow.objects.filter(key="k").update(state="half_open")
    [reopened] = verdicts("k", failures=1)
    assert reopened.cooldown_seconds == 15.0
    [closed] = verdicts("k", succeeded=True)
    assert (closed.from_state, closed.to_state) == ("open", "closed")


@pytest.mark.django_db
def test_record_attempts_runs_nothing_without_a_breaker_key(django_assert_num_queries):
    job = claims.ClaimedJob(1, "tests.record", "default", {}, 1, 5, {}, None, None, None, 1)
    with django_assert_num_queries(0):
        assert record_attempts("default", [(job, "queued", "retry", "RuntimeError: down")]) == []


@pytest.mark.django_db
def test_closing_gives_back_held_jobs_through_the_partial_index():
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + breaker_sql.RESET_BREAKER, {"key": "k", "reason": "r"})
        plan = "\n".join(line for (line,) in cursor.fetchall())
    assert "workhorse_job_breaker_held_idx" in plan


@pytest.mark.django_db(transaction=True)
def test_closing_skips_a_held_job_a_claim_has_locked_rather_than_wait_for_it():
    row(state="open", open_until=timezone.now() + timedelta(hours=1))
    locked, free = (enqueue("tests.record", {}, breaker_key="k") for _ in range(2))
    assert claim().held == 2
    other = connect_directly(autocommit=False)
    try:
        other.execute("SELECT id FROM workhorse_job WHERE id = %s FOR UPDATE", [locked])
        # Waiting here for the locked job could deadlock with a claim (which locks jobs, then the breaker).
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")
        assert reset_breaker("k").released == 1
    finally:
        other.rollback()
        other.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert Job.objects.get(pk=free).held_since is None
    assert Job.objects.get(pk=locked).held_since is not None


@pytest.mark.django_db
def test_the_opening_transition_says_why():
    verdicts("k", failures=3)
    assert BreakerRow.objects.get(key="k").transitions[-1]["reason"] == "3 failures within 60 s"
