"""Prometheus metrics: scraped from the endpoint through a real server, parsed with prometheus-client.

Each test reads the metrics before and after what it does and checks the difference, so the
counts of other tests (one registry per process) do not matter.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.core.checks import Error
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from django_workhorse import (
    Debounce,
    EnqueueIdempotencyConflictError,
    EnqueueOptions,
    EnqueueRequest,
    EnqueueValidationError,
    Idempotency,
    Unique,
    conf,
    enqueue,
    enqueue_due_schedules,
    enqueue_many,
)
from django_workhorse.checks import check_settings
from tests.processes import ROOT, subprocess_database_url
from tests.test_http_idempotency import session_cookie
from tests.worker_tasks import run_worker

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "t" * conf.MIN_METRICS_TOKEN_CHARS
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Scraper:
    """GETs the metrics endpoint of the live server with a plain HTTP client."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "localhost", parts.port or 80

    def get(self, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request("GET", "/metrics/", headers=headers or {})
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
        finally:
            conn.close()

    def samples(self) -> Samples:
        status, _, text = self.get({"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, text
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


@pytest.fixture
def scraper(live_server) -> Iterator[Scraper]:
    with override_settings(WORKHORSE_METRICS_TOKEN=TOKEN):
        yield Scraper(live_server.url)


def changes(before: Samples, after: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The label sets of ``name`` whose value changed, and by how much."""
    keys = {labels for sample, labels in after if sample == name}
    deltas = {labels: after[(name, labels)] - before.get((name, labels), 0.0) for labels in keys}
    return {labels: delta for labels, delta in deltas.items() if delta}


def labels(**values: str) -> frozenset[tuple[str, str]]:
    return frozenset(values.items())


def per_job(job_type: str = "", **values: str) -> frozenset[tuple[str, str]]:
    """The labels of a per-job metric: job_type is empty unless WORKHORSE_METRICS_JOB_TYPE_LABEL is on."""
    return labels(job_type=job_type, **values)


REQUESTS = "workhorse_enqueue_requests_total"
KEYED = "workhorse_keyed_requests_total"


def test_each_enqueue_outcome_is_counted_once_under_its_queue_mode_and_outcome(scraper):
    before = scraper.samples()
    enqueue("tests.record", {"n": 1}, queue="m-plain")
    key = Idempotency("order-1", scope="metrics")
    enqueue("tests.record", {"n": 1}, queue="m-keyed", idempotency=key)
    enqueue("tests.record", {"n": 1}, queue="m-keyed", idempotency=key)  # replayed
    with pytest.raises(EnqueueIdempotencyConflictError):
        enqueue("tests.record", {"n": 2}, queue="m-keyed", idempotency=key)
    enqueue("tests.record", {"n": 1}, queue="m-unique", unique=Unique("u-1", scope="metrics"))
    enqueue("tests.record", {"n": 1}, queue="m-unique", unique=Unique("u-1", scope="metrics"))  # coalesced
    window = timedelta(minutes=5)
    enqueue("tests.record", {"n": 1}, queue="m-debounce", debounce=Debounce("d-1", window, scope="metrics"))
    enqueue("tests.record", {"n": 2}, queue="m-debounce", debounce=Debounce("d-1", window, scope="metrics"))
    # A debounce request on a key another mode owns cannot replace its job.
    enqueue("tests.record", {"n": 1}, queue="m-keyed", debounce=Debounce("order-1", window, scope="metrics"))
    with pytest.raises(EnqueueValidationError):
        enqueue("tests.record", {"n": 1}, queue="m-plain", priority=10**6)
    after = scraper.samples()

    assert changes(before, after, REQUESTS) == {
        per_job(queue="m-plain", mode="none", outcome="accepted"): 1,
        per_job(queue="m-keyed", mode="idempotency", outcome="accepted"): 1,
        per_job(queue="m-keyed", mode="idempotency", outcome="replayed"): 1,
        per_job(queue="m-keyed", mode="idempotency", outcome="conflict"): 1,
        per_job(queue="m-unique", mode="unique", outcome="accepted"): 1,
        per_job(queue="m-unique", mode="unique", outcome="coalesced"): 1,
        per_job(queue="m-debounce", mode="debounce", outcome="accepted"): 1,
        per_job(queue="m-debounce", mode="debounce", outcome="replaced"): 1,
        per_job(queue="m-keyed", mode="debounce", outcome="non_replaceable"): 1,
        per_job(queue="", mode="", outcome="invalid"): 1,
    }
    # The keyed requests again, by scope: what the keys saved (replayed, coalesced, replaced) and
    # the key reused for other work (conflict).
    assert changes(before, after, KEYED) == {
        labels(scope="metrics", outcome="accepted"): 3,
        labels(scope="metrics", outcome="replayed"): 1,
        labels(scope="metrics", outcome="conflict"): 1,
        labels(scope="metrics", outcome="coalesced"): 1,
        labels(scope="metrics", outcome="replaced"): 1,
        labels(scope="metrics", outcome="non_replaceable"): 1,
    }
    # One duration per call that was settled: eight single calls (the refused ones are not timed).
    durations = changes(before, after, "workhorse_enqueue_duration_seconds_count")
    assert sum(durations.values()) == 8
    assert durations[labels(mode="idempotency")] == 2


def test_encryption_asked_for_without_the_setting_is_counted_invalid(scraper):
    from django_workhorse import EncryptionNotConfiguredError

    before = scraper.samples()
    with override_settings(WORKHORSE_ENCRYPTION=None):
        with pytest.raises(EncryptionNotConfiguredError):
            enqueue("tests.record", {"n": 1}, queue="m-sealed", encrypted=True)
        with pytest.raises(EncryptionNotConfiguredError):
            enqueue_many([EnqueueRequest("tests.record", {"n": 1}, EnqueueOptions(encrypted=True))])
    assert changes(before, scraper.samples(), REQUESTS) == {per_job(queue="", mode="", outcome="invalid"): 2}


def test_a_workflow_counts_each_step_under_the_mode_workflow_and_its_key_once(scraper):
    from django_workhorse import WorkflowDefinitionError
    from django_workhorse.workflows import Workflow

    def fulfil(amount: int) -> Workflow:
        wf = Workflow("m", idempotency=Idempotency("wf-1", scope="metrics-wf"))
        charge = wf.add("charge", EnqueueRequest("tests.record", {"n": amount}, EnqueueOptions(queue="m-wf-a")))
        wf.add("pack", EnqueueRequest("tests.record", {"n": 1}, EnqueueOptions(queue="m-wf-b")), after=[charge])
        wf.add("mail", EnqueueRequest("tests.record", {"n": 2}, EnqueueOptions(queue="m-wf-b")), after=[charge])
        return wf

    before = scraper.samples()
    fulfil(5).enqueue()
    fulfil(5).enqueue()  # replayed
    with pytest.raises(EnqueueIdempotencyConflictError):
        fulfil(6).enqueue()
    with pytest.raises(WorkflowDefinitionError):
        Workflow("m").enqueue()  # no step
    after = scraper.samples()

    assert changes(before, after, REQUESTS) == {
        per_job(queue="m-wf-a", mode="workflow", outcome="accepted"): 1,
        per_job(queue="m-wf-b", mode="workflow", outcome="accepted"): 2,
        per_job(queue="m-wf-a", mode="workflow", outcome="replayed"): 1,
        per_job(queue="m-wf-b", mode="workflow", outcome="replayed"): 2,
        per_job(queue="", mode="workflow", outcome="conflict"): 1,
        per_job(queue="", mode="", outcome="invalid"): 1,
    }
    assert changes(before, after, KEYED) == {
        labels(scope="metrics-wf", outcome="accepted"): 1,
        labels(scope="metrics-wf", outcome="replayed"): 1,
        labels(scope="metrics-wf", outcome="conflict"): 1,
    }
    assert changes(before, after, "workhorse_enqueue_duration_seconds_count") == {labels(mode="workflow"): 2}


def test_a_batch_is_counted_per_request_and_timed_once_as_a_batch(scraper):
    before = scraper.samples()
    plain = EnqueueOptions(queue="m-batch")
    keyed = EnqueueOptions(queue="m-batch", idempotency=Idempotency("b-1", scope="metrics"))
    enqueue_many(
        [EnqueueRequest("tests.record", {"n": n}, plain) for n in range(3)]
        + [EnqueueRequest("tests.record", {"n": 9}, keyed)] * 2
    )
    after = scraper.samples()

    assert changes(before, after, REQUESTS) == {
        per_job(queue="m-batch", mode="none", outcome="accepted"): 3,
        per_job(queue="m-batch", mode="idempotency", outcome="accepted"): 1,
        per_job(queue="m-batch", mode="idempotency", outcome="replayed"): 1,
    }
    assert changes(before, after, KEYED) == {
        labels(scope="metrics", outcome="accepted"): 1,
        labels(scope="metrics", outcome="replayed"): 1,
    }
    assert changes(before, after, "workhorse_enqueue_duration_seconds_count") == {labels(mode="batch"): 1}


def test_the_job_type_is_a_label_only_when_the_setting_is_on(scraper):
    before = scraper.samples()
    enqueue("tests.record", {"n": 1}, queue="m-types")
    with override_settings(WORKHORSE_METRICS_JOB_TYPE_LABEL=True):
        enqueue("tests.record", {"n": 2}, queue="m-types")
        enqueue("tests.always_fail", {"n": 3}, queue="m-types", max_attempts=1)
        run_worker(queues=["m-types"])
    after = scraper.samples()

    assert changes(before, after, REQUESTS) == {
        per_job(queue="m-types", mode="none", outcome="accepted"): 1,
        per_job("tests.record", queue="m-types", mode="none", outcome="accepted"): 1,
        per_job("tests.always_fail", queue="m-types", mode="none", outcome="accepted"): 1,
    }
    assert changes(before, after, "workhorse_attempts_finished_total") == {
        per_job("tests.record", queue="m-types", status="succeeded", outcome="succeeded"): 2,
        per_job("tests.always_fail", queue="m-types", status="dead", outcome="dead"): 1,
    }
    assert changes(before, after, "workhorse_wait_duration_seconds_count") == {
        per_job("tests.record", queue="m-types"): 2,
        per_job("tests.always_fail", queue="m-types"): 1,
    }


def test_the_wait_is_timed_from_run_at_to_the_start_of_the_attempt(scraper):
    from django.utils import timezone

    late = timezone.now() - timedelta(minutes=10)
    enqueue("tests.record", {"n": 1}, queue="m-wait", run_at=late)
    before = scraper.samples()
    run_worker(queues=["m-wait"])
    after = scraper.samples()

    assert changes(before, after, "workhorse_wait_duration_seconds_count") == {per_job(queue="m-wait"): 1}
    waited = changes(before, after, "workhorse_wait_duration_seconds_sum")[per_job(queue="m-wait")]
    assert waited >= 600  # ten minutes overdue; the histogram puts it above its 300 s bucket
    buckets = changes(before, after, "workhorse_wait_duration_seconds_bucket")
    assert per_job(queue="m-wait", le="300.0") not in buckets
    assert buckets[per_job(queue="m-wait", le="900.0")] == 1


def test_a_redrive_is_counted_once_whatever_the_number_of_repeats(scraper):
    from django_workhorse import redrive

    dead = enqueue("tests.always_fail", {"n": 1}, queue="m-redrive", max_attempts=1)
    run_worker(queues=["m-redrive"])
    before = scraper.samples()
    first = redrive(dead, request_id="metrics-1")
    assert redrive(dead, request_id="metrics-1") == first  # a repeat of the same redrive
    after = scraper.samples()

    assert changes(before, after, "workhorse_redrives_total") == {labels(queue="m-redrive"): 1}


def test_schedule_ticks_are_counted_by_schedule_and_outcome(scraper):
    from tests.test_scheduler import T0, entry, minutes

    schedules = {"m-every": entry(), "m-late": entry(catch_up="skip")}
    with override_settings(WORKHORSE_SCHEDULES=schedules):
        enqueue_due_schedules(T0 + minutes(5))  # the first evaluation: no ticks
        before = scraper.samples()
        enqueue_due_schedules(T0 + minutes(10))  # one tick each
        enqueue_due_schedules(T0 + minutes(25))  # m-late's tick at 20 min is over 60 s late: skipped
        after = scraper.samples()

    assert changes(before, after, "workhorse_schedule_ticks_total") == {
        labels(schedule="m-every", outcome="accepted"): 2,
        labels(schedule="m-late", outcome="accepted"): 1,
        labels(schedule="m-late", outcome="skipped"): 1,
    }


MULTIPROCESS = """
import django
django.setup()
from django_workhorse import enqueue
for n in range(2):
    enqueue("tests.record", {"n": n}, queue="m-multi")
"""


def test_in_multiprocess_mode_the_endpoint_adds_up_every_process(scraper, tmp_path, monkeypatch):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": subprocess_database_url(),
        "PYTHONPATH": str(ROOT),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    producers = [
        subprocess.Popen([sys.executable, "-c", MULTIPROCESS], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for producer in producers:
        _, stderr = producer.communicate(timeout=120)
        assert producer.returncode == 0, stderr
    assert len(list(tmp_path.glob("*.db"))) >= 2  # each process wrote its own files

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    samples = scraper.samples()

    assert samples[(REQUESTS, per_job(queue="m-multi", mode="none", outcome="accepted"))] == 4
    assert samples[("workhorse_enqueue_duration_seconds_count", labels(mode="none"))] == 4
    assert any(name == "workhorse_workers_alive" for name, _ in samples)  # the gauges are served too


def test_a_worker_counts_finished_attempts_by_status_and_times_handlers_and_claims(scraper):
    enqueue("tests.record", {"n": 1}, queue="m-work")
    enqueue("tests.record", {"n": 2}, queue="m-work")
    enqueue("tests.always_fail", {"n": 3}, queue="m-work", max_attempts=1)
    before = scraper.samples()
    run_worker(queues=["m-work"])
    after = scraper.samples()

    assert changes(before, after, "workhorse_attempts_finished_total") == {
        per_job(queue="m-work", status="succeeded", outcome="succeeded"): 2,
        per_job(queue="m-work", status="dead", outcome="dead"): 1,
    }
    assert changes(before, after, "workhorse_dead_letters_total") == {labels(queue="m-work"): 1}
    assert changes(before, after, "workhorse_handler_duration_seconds_count") == {per_job(queue="m-work"): 3}
    claims = changes(before, after, "workhorse_claim_duration_seconds_count")
    assert claims[frozenset()] >= 1


def test_the_endpoint_refuses_anonymous_requests_and_a_wrong_token(scraper):
    anonymous = scraper.get()
    wrong = scraper.get({"Authorization": "Bearer " + "x" * len(TOKEN)})
    not_bearer = scraper.get({"Authorization": f"Basic {TOKEN}"})
    right = scraper.get({"Authorization": f"Bearer {TOKEN}"})

    for status, headers, body in (anonymous, wrong, not_bearer):
        assert (status, headers["www-authenticate"]) == (401, 'Bearer realm="workhorse-metrics"')
        assert "workhorse_" not in body
    assert right[0] == 200
    assert right[1]["content-type"].startswith("text/plain; version=")
    assert "workhorse_enqueue_requests" in right[2]


def session_of(user: Any) -> dict[str, str]:
    return {"Cookie": session_cookie(user)}


def test_staff_read_the_endpoint_and_other_users_are_forbidden(scraper):
    users = get_user_model().objects
    staff = users.create_user("metrics-staff", password="x", is_staff=True)
    other = users.create_user("metrics-user", password="x")
    inactive = users.create_user("metrics-gone", password="x", is_staff=True, is_active=False)

    assert scraper.get(session_of(staff))[0] == 200
    assert scraper.get(session_of(other))[0] == 403
    assert scraper.get(session_of(inactive))[0] == 401  # an inactive user's session logs nobody in


def test_without_a_token_setting_only_staff_get_in(live_server):
    with override_settings(WORKHORSE_METRICS_TOKEN=None):
        status, _, _ = Scraper(live_server.url).get({"Authorization": "Bearer None"})
    assert status == 401


@pytest.mark.parametrize(
    ("token", "valid"),
    [
        (None, True),
        ("a" * conf.MIN_METRICS_TOKEN_CHARS, True),
        ("a" * (conf.MIN_METRICS_TOKEN_CHARS - 1), False),
        ("a" * conf.MAX_METRICS_TOKEN_CHARS, True),
        ("a" * (conf.MAX_METRICS_TOKEN_CHARS + 1), False),
        ("a" * 15 + " secret", False),
        ("a" * 15 + "é", False),
        (12345678901234567, False),
    ],
    ids=["unset", "16 chars", "15 chars", "512 chars", "513 chars", "a space", "not ASCII", "not a string"],
)
def test_the_token_setting_is_held_to_its_bounds_and_never_echoed(token, valid):
    with override_settings(WORKHORSE_METRICS_TOKEN=token):
        errors = [e for e in check_settings() if e.id == "workhorse.E301"]
    if valid:
        assert errors == []
    else:
        assert len(errors) == 1 and isinstance(errors[0], Error)
        assert "WORKHORSE_METRICS_TOKEN must be None or 16..512 visible ASCII characters" in errors[0].msg
        assert not isinstance(token, str) or token not in errors[0].msg


BLOCKED = """
import sys, importlib.abc

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("prometheus_client", "opentelemetry"):
            raise ImportError(f"{name} is not installed")
        return None

sys.meta_path.insert(0, Absent())
import django
django.setup()
from django_workhorse import Idempotency, enqueue
from django_workhorse.observability import instruments
from django_workhorse.observability import tracing
from django_workhorse.models import Job
assert instruments._metrics is None and not tracing.INSTALLED
first = enqueue("tests.record", {"n": 1}, idempotency=Idempotency("absent-1"))
assert enqueue("tests.record", {"n": 1}, idempotency=Idempotency("absent-1")) == first
from tests.worker_tasks import run_worker
stats = run_worker()
job = Job.objects.get(pk=first)
assert (job.status, job.trace_context) == ("succeeded", None), stats
try:
    import django_workhorse.observability.metrics.urls
except Exception as exc:
    print(type(exc).__name__, exc)
from django.core.management import call_command
from django.core.management.base import CommandError
try:
    call_command("workhorse_worker", "--burst", "--metrics-port", "9")
except CommandError as exc:
    print("CommandError", exc)
"""


def test_everything_works_without_the_extras_installed():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": subprocess_database_url(),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "ImproperlyConfigured django_workhorse.observability.metrics needs prometheus-client" in done.stdout
    assert "CommandError --metrics-port needs prometheus-client" in done.stdout


@pytest.fixture
def gauges() -> Iterator[Any]:
    from django_workhorse.observability.metrics.views import GAUGES

    ttl = GAUGES.ttl
    GAUGES.ttl = 3600.0  # a period no test outlasts: a test says when it is over (forget)
    GAUGES.forget()
    yield GAUGES
    GAUGES.ttl = ttl
    GAUGES.forget()


def gauge_values(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


def test_the_gauges_match_what_the_database_holds(scraper, gauges):
    from django.utils import timezone

    from django_workhorse.models import Job, JobStatus, WorkerRecord
    from tests.factories import JobFactory, WaitingStepFactory

    now = timezone.now()
    WaitingStepFactory.create_batch(3, queue="g-a")
    JobFactory(queue="g-a", run_at=now - timedelta(minutes=2))
    JobFactory(queue="g-a", run_at=now - timedelta(seconds=1))
    JobFactory(queue="g-a", run_at=now + timedelta(hours=1))
    JobFactory(
        queue="g-b", status=JobStatus.RUNNING, attempt=1, started_at=now, lease_expires_at=now + timedelta(minutes=5)
    )
    JobFactory(queue="g-b", status=JobStatus.DEAD, attempt=1, finished_at=now)
    JobFactory(queue="g-b", status=JobStatus.SUCCEEDED, attempt=1, finished_at=now)
    for name, heartbeat in (("alive", now), ("stale", now - timedelta(hours=1))):
        WorkerRecord.objects.create(
            name=name, host="h", pid=1, queues=["g-a"], concurrency=1, started_at=heartbeat, heartbeat_at=heartbeat
        )
    samples = scraper.samples()

    def orm(queue: str, state: str) -> int:
        jobs = Job.objects.filter(queue=queue)
        return {
            "waiting": jobs.filter(status=JobStatus.WAITING),
            "ready": jobs.filter(status=JobStatus.QUEUED, run_at__lte=now),
            "scheduled": jobs.filter(status=JobStatus.QUEUED, run_at__gt=now),
            "running": jobs.filter(status=JobStatus.RUNNING),
            "dead": jobs.filter(status=JobStatus.DEAD),
        }[state].count()

    expected = {
        labels(queue=queue, state=state): float(orm(queue, state))
        for queue in ("g-a", "g-b")
        for state in ("waiting", "ready", "scheduled", "running", "dead")
    }
    assert gauge_values(samples, "workhorse_jobs") == expected
    assert expected[labels(queue="g-a", state="ready")] == 2  # the ORM side is not empty either
    assert expected[labels(queue="g-a", state="waiting")] == 3
    ages = gauge_values(samples, "workhorse_oldest_ready_age_seconds")
    assert ages[labels(queue="g-a")] >= 120 and ages[labels(queue="g-b")] == 0
    assert gauge_values(samples, "workhorse_workers_alive") == {frozenset(): 1.0}


def test_the_workflows_gauge_counts_workflows_by_state(scraper, gauges):
    from django.utils import timezone

    from tests.test_workflow_admin import workflows_in_each_state

    expected = workflows_in_each_state(timezone.now())

    samples = scraper.samples()

    assert gauge_values(samples, "workhorse_workflows") == {labels(state=s): float(n) for s, n in expected.items()}
    assert (
        gauge_values(samples, "workhorse_jobs")[labels(queue="default", state="waiting")] == 9.0
    )  # b, c, d of three diamonds


def test_the_gauges_are_read_once_per_cache_period(scraper, gauges):
    from tests.factories import JobFactory

    JobFactory(queue="g-cache")
    first = gauge_values(scraper.samples(), "workhorse_jobs")[labels(queue="g-cache", state="ready")]
    JobFactory(queue="g-cache")
    cached = gauge_values(scraper.samples(), "workhorse_jobs")[labels(queue="g-cache", state="ready")]
    gauges.forget()  # the period is over
    fresh = gauge_values(scraper.samples(), "workhorse_jobs")[labels(queue="g-cache", state="ready")]
    assert (first, cached, fresh) == (1, 1, 2)


def metrics_of_port(port: int) -> Samples | None:
    """The samples a worker's --metrics-port serves, or None while nothing answers there."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    except OSError:
        return None
    finally:
        conn.close()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_worker_serves_its_own_metrics_on_its_metrics_port(tmp_path):
    from tests.pgbouncer import _free_port
    from tests.processes import worker_spawner
    from tests.test_worker_processes import COMMON, WORKER_MAIN
    from tests.worker_tasks import wait_for

    port = _free_port()
    command = [sys.executable, str(WORKER_MAIN), *COMMON, "--queues", "m-port", "--metrics-port", str(port)]
    with worker_spawner(tmp_path, command) as start:
        start()
        for n in range(3):
            enqueue("tests.record", {"n": n}, queue="m-port")
        succeeded = (
            "workhorse_attempts_finished_total",
            per_job(queue="m-port", status="succeeded", outcome="succeeded"),
        )

        def counted() -> float:
            samples = metrics_of_port(port)
            return 0.0 if samples is None else samples.get(succeeded, 0.0)

        assert wait_for(lambda: counted() == 3, timeout=60, what="three attempts on the worker's port")
        samples = metrics_of_port(port)
        assert samples is not None
        assert samples[("workhorse_handler_duration_seconds_count", per_job(queue="m-port"))] == 3
        assert not any(name == "workhorse_jobs" for name, _ in samples)  # the gauges are the web endpoint's


def test_in_multiprocess_mode_the_endpoint_adds_up_two_worker_processes(scraper, tmp_path, monkeypatch):
    from django_workhorse.models import Job
    from tests.processes import worker_spawner
    from tests.test_worker_processes import COMMON, WORKER_MAIN
    from tests.worker_tasks import wait_for

    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    command = [sys.executable, str(WORKER_MAIN), *COMMON, "--queues", "m-mp", "--concurrency", "2"]
    with worker_spawner(tmp_path, command, env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}) as start:
        workers = [start(), start()]
        enqueue_many([EnqueueRequest("tests.record", {"n": n}, EnqueueOptions(queue="m-mp")) for n in range(40)])
        done = Job.objects.filter(queue="m-mp", status="succeeded")
        assert wait_for(lambda: done.count() == 40, timeout=120, what="40 jobs done by two workers")
        for worker in workers:
            worker.terminate()
            worker.popen.wait(60)
    pids = {path.stem.rsplit("_", 1)[-1] for path in metrics_dir.glob("*.db")}

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    samples = scraper.samples()

    assert len(pids) == 2  # each worker process wrote its own files
    assert (
        samples[("workhorse_attempts_finished_total", per_job(queue="m-mp", status="succeeded", outcome="succeeded"))]
        == 40
    )
    assert samples[("workhorse_handler_duration_seconds_count", per_job(queue="m-mp"))] == 40


def test_a_metrics_port_that_is_taken_stops_the_worker_with_a_clear_error():
    import socket

    from django.core.management import call_command
    from django.core.management.base import CommandError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"--metrics-port: cannot serve on 127.0.0.1:{port}"):
            call_command("workhorse_worker", "--burst", "--metrics-port", str(port))


@pytest.mark.parametrize("port", ["0", "65536", "x"])
def test_the_metrics_port_is_held_to_its_bounds(port):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="must be an integer in 1..65535"):
        call_command("workhorse_worker", "--burst", "--metrics-port", port)


def test_worker_and_enqueue_log_records_carry_the_jobs_fields(caplog):
    import logging

    caplog.set_level(logging.DEBUG, logger="django_workhorse")
    ok = enqueue("tests.record", {"n": 1}, queue="m-logs")
    bad = enqueue("tests.always_fail", {"n": 2}, queue="m-logs", max_attempts=1)
    run_worker(queues=["m-logs"])

    def fields(record: logging.LogRecord) -> tuple[Any, ...]:
        return tuple(getattr(record, name, None) for name in ("job_id", "job_type", "queue", "attempt"))

    enqueued = [fields(r) for r in caplog.records if r.getMessage().startswith("Enqueue id=")]
    finished = {
        fields(r) + (r.status,)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "django_workhorse.worker.execution" and hasattr(r, "status")  # finished, failed or dead
    }
    assert enqueued == [(ok, "tests.record", "m-logs", 0), (bad, "tests.always_fail", "m-logs", 0)]
    assert finished == {(ok, "tests.record", "m-logs", 1, "succeeded"), (bad, "tests.always_fail", "m-logs", 1, "dead")}


def test_while_the_database_cannot_be_read_the_counters_are_served_without_the_gauges(scraper, gauges, monkeypatch):
    from django.db import DatabaseError

    from django_workhorse.observability.metrics import gauges as gauges_module
    from tests.factories import JobFactory

    JobFactory(queue="g-down")
    enqueue("tests.record", {"n": 1}, queue="g-counted")

    def unreadable() -> Any:
        raise DatabaseError("the database is away")

    monkeypatch.setattr(gauges_module, "_read", unreadable)
    down = scraper.samples()
    monkeypatch.undo()
    gauges.forget()
    back = scraper.samples()

    assert not gauge_values(down, "workhorse_jobs") and not gauge_values(down, "workhorse_workers_alive")
    assert down[(REQUESTS, per_job(queue="g-counted", mode="none", outcome="accepted"))] >= 1  # counters still answer
    assert gauge_values(back, "workhorse_jobs")[labels(queue="g-down", state="ready")] == 1


def documented_metrics() -> set[str]:
    """The metric names of docs/observability.md's tables (their first column)."""
    import re

    text = (ROOT / "docs" / "observability.md").read_text()
    return set(re.findall(r"^\| `(workhorse_[a-z_]+)` \|", text, re.M))


def test_every_metric_served_is_documented_and_every_documented_one_served(scraper, gauges):
    status, _, text = scraper.get({"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    served = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in text_string_to_metric_families(text)
        # prometheus-client also writes when each unlabelled metric was created: not a metric of ours
        if family.name.startswith("workhorse_") and not family.name.endswith("_created")
    }
    assert served == documented_metrics()
