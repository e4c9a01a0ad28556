"""Dedup made visible: live bindings per scope from PostgreSQL, and the duplicates the keys saved
and the conflicts, per scope and per minute, from the metrics' counters, on the dashboard and in
``workhorse_status``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from django_workhorse import EnqueueIdempotencyConflictError, Idempotency, Unique, enqueue
from django_workhorse.admin import dashboard
from django_workhorse.models import IdempotencyBinding, Job, JobStatus
from django_workhorse.observability import keyed_rates
from django_workhorse.operations import stats
from tests.processes import ROOT, subprocess_database_url
from tests.worker_tasks import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def keyed_traffic(scope: str, *, replays: int, conflicts: int) -> None:
    """One accepted request, ``replays`` replays of it and ``conflicts`` conflicting requests."""
    key = Idempotency("k-1", scope=scope)
    enqueue("tests.record", {"n": 1}, idempotency=key)
    for _ in range(replays):
        enqueue("tests.record", {"n": 1}, idempotency=key)
    for n in range(conflicts):
        with pytest.raises(EnqueueIdempotencyConflictError):
            enqueue("tests.record", {"n": 2 + n}, idempotency=key)


def test_live_bindings_are_counted_per_scope_as_the_orm_sees_them():
    for n in range(3):
        enqueue("tests.record", {"n": n}, idempotency=Idempotency(f"a-{n}", scope="v-many"))
    enqueue("tests.record", {"n": 1}, idempotency=Idempotency("b-1", scope="v-few"))
    done = enqueue("tests.record", {"n": 1}, unique=Unique("u-1", scope="v-few"))
    Job.objects.filter(pk=done).update(status=JobStatus.SUCCEEDED, finished_at=timezone.now())  # frees the key
    expired = enqueue("tests.record", {"n": 1}, idempotency=Idempotency("c-1", scope="v-gone", ttl=timedelta(hours=1)))
    IdempotencyBinding.objects.filter(job_id=expired).update(expires_at=timezone.now() - timedelta(seconds=1))

    counted = {line.scope: line.live for line in stats.live_bindings()}

    live = IdempotencyBinding.objects.live()
    assert counted == {scope: live.filter(scope=scope).count() for scope in ("v-many", "v-few")}
    assert counted == {"v-many": 3, "v-few": 1}  # the freed and the expired keys are not live
    assert [line.scope for line in stats.live_bindings(limit=1)] == ["v-many"]


def test_two_readings_give_what_each_scope_saved_and_its_conflicts_per_minute():
    enqueue("tests.record", {"n": 1}, unique=Unique("u-1", scope="v-rate"))
    first = keyed_rates.read()
    assert first is not None
    keyed_traffic("v-rate", replays=3, conflicts=1)
    enqueue("tests.record", {"n": 1}, unique=Unique("u-1", scope="v-rate"))  # coalesced
    second = keyed_rates.read()
    assert second is not None

    rate = keyed_rates.between(first, second)["v-rate"]

    assert (rate.saved, rate.conflicts) == (4, 1)
    assert rate.seconds == second.at - first.at > 0
    assert rate.saved_per_minute == 4 * 60 / rate.seconds
    assert rate.conflicts_per_minute == 60 / rate.seconds


@pytest.fixture
def staff_client() -> Client:
    user = get_user_model().objects.create_user("dedup-staff", password="x", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def fresh_readings(monkeypatch) -> Iterator[None]:
    monkeypatch.setattr(dashboard, "RECENT_KEYED", keyed_rates.RecentTotals())
    yield


def scope_row(html: str, scope: str) -> dict[str, str]:
    row = re.search(rf'<tr data-scope="{re.escape(scope)}">(.*?)</tr>', html, re.S)
    assert row is not None, f"no row for {scope}"
    return dict(re.findall(r'data-field="([a-z-]+)">([^<]*)<', row.group(1)))


def test_the_dashboard_shows_live_bindings_and_what_the_keys_saved_since_its_last_reading(staff_client, fresh_readings):
    url = "/admin/workhorse/job/dashboard/"
    keyed_traffic("v-dash", replays=1, conflicts=0)
    first = staff_client.get(url).content.decode()
    keyed_traffic("v-dash", replays=0, conflicts=0)  # k-1 again: one more replay
    enqueue("tests.record", {"n": 9}, idempotency=Idempotency("k-2", scope="v-dash"))
    for _ in range(2):
        enqueue("tests.record", {"n": 9}, idempotency=Idempotency("k-2", scope="v-dash"))
    with pytest.raises(EnqueueIdempotencyConflictError):
        enqueue("tests.record", {"n": 10}, idempotency=Idempotency("k-2", scope="v-dash"))
    second = staff_client.get(url).content.decode()

    assert scope_row(first, "v-dash") == {"live": "1"}  # no earlier reading yet: no rates
    row = scope_row(second, "v-dash")
    assert (row["live"], row["saved"], row["conflicts"]) == ("2", "3", "1")
    assert float(row["saved-per-minute"]) > 0 and float(row["conflicts-per-minute"]) > 0


def test_the_dashboard_without_live_bindings_says_so(staff_client, fresh_readings):
    html = staff_client.get("/admin/workhorse/job/dashboard/").content.decode()
    assert "No live bindings." in html


def status(*args: str) -> str:
    out = StringIO()
    call_command("workhorse_status", *args, stdout=out)
    return out.getvalue()


def test_status_lists_live_bindings_per_scope_and_says_what_rates_need():
    keyed_traffic("v-status", replays=2, conflicts=0)
    text = status()
    section = text[text.index("Idempotency keys by scope") :]
    assert re.search(r"^v-status\s+1$", section, re.M)
    assert "need PROMETHEUS_MULTIPROC_DIR" in section
    report = json.loads(status("--json"))
    assert {"scope": "v-status", "live_bindings": 1, "rate": None} in report["scopes"]


@pytest.mark.parametrize(
    ("window", "valid"), [("0", True), ("300", True), ("300.001", False), ("-1", False), ("x", False)]
)
def test_the_rate_window_is_held_to_its_bounds(window, valid):
    if valid:
        assert "Idempotency keys by scope" in status("--rate-window", window)  # no shared counters: no wait
    else:
        with pytest.raises(CommandError, match=r"--rate-window must be a number of seconds in 0\.\.300"):
            status("--rate-window", window)


REPLAYING = """
import django, sys
django.setup()
from django_workhorse import Idempotency, enqueue
key = Idempotency("k-loop", scope="v-multi")
enqueue("tests.record", {"n": 1}, idempotency=key)
while True:  # replays until the test stops this process
    enqueue("tests.record", {"n": 1}, idempotency=key)
"""


def test_status_reads_the_rates_every_process_of_the_multiprocess_directory_counted(tmp_path, monkeypatch):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": subprocess_database_url(),
        "PYTHONPATH": str(ROOT),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    producer = subprocess.Popen([sys.executable, "-c", REPLAYING], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    try:

        def replayed() -> float:
            totals = keyed_rates.read()
            return 0.0 if totals is None else totals.counts.get(("v-multi", "replayed"), 0.0)

        assert wait_for(lambda: replayed() > 0, timeout=60, what="the producer's first replays")
        report = json.loads(status("--json", "--rate-window", "1"))
        text = status("--rate-window", "0.5")
    finally:
        producer.kill()
        producer.wait(timeout=30)

    [line] = [line for line in report["scopes"] if line["scope"] == "v-multi"]
    assert line["live_bindings"] == 1
    assert line["rate"]["saved"] > 0 and line["rate"]["conflicts"] == 0
    assert line["rate"]["seconds"] >= 1
    assert line["rate"]["saved_per_minute"] == pytest.approx(line["rate"]["saved"] * 60 / line["rate"]["seconds"], 1e-3)
    assert re.search(r"^v-multi\s+1\s+\d+\s+[\d.]+\s+0\s+0\.0$", text, re.M)


def test_a_scope_left_out_of_a_full_listing_is_uncounted_not_zero():
    rate = keyed_rates.ScopeRate("other", saved=2, conflicts=0, seconds=60.0)
    listed = [stats.ScopeBindings("a", 5), stats.ScopeBindings("b", 3)]

    full = keyed_rates.by_scope(listed, {"other": rate, "a": rate}, limit=2)
    not_full = keyed_rates.by_scope(listed, {"other": rate}, limit=3)

    assert [(line.scope, line.live_bindings, line.rate) for line in full] == [
        ("a", 5, rate),
        ("b", 3, None),
        ("other", None, rate),
    ]
    assert [(line.scope, line.live_bindings) for line in not_full] == [("a", 5), ("b", 3), ("other", 0)]
    assert rate.saved_per_minute == 2.0
