"""Queue control: pause, resume, drain and list, against real PostgreSQL.

The service functions (idempotent, bounded, transactional), the claim that leaves a paused queue
out (worker threads here; three worker processes in ``test_queue_control_processes.py``), the
resume's NOTIFY, and ``manage.py workhorse_queue`` (drain run as a real subprocess).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connections, transaction
from django.db.transaction import TransactionManagementError

from django_workhorse import (
    DrainTimeoutError,
    InvalidArgumentError,
    drain_queue,
    enqueue,
    pause_queue,
    paused_queues,
    resume_queue,
)
from django_workhorse.conf import MAX_QUEUE_CHARS, MAX_REQUESTED_BY_CHARS
from django_workhorse.models import Job, JobStatus, QueueState
from django_workhorse.operations.queues import DrainProgress
from tests.conftest import connect_directly
from tests.factories import JobFactory
from tests.processes import ROOT, subprocess_database_url
from tests.test_admin import body, login, messages_of
from tests.worker_tasks import GATE, make_worker, run_worker, running, wait_for

# -- pause and resume ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_pause_is_idempotent_and_keeps_when_and_who_first_paused():
    first = pause_queue("billing", by="alice")
    again = pause_queue("billing", by="bob")

    assert (first.queue, first.paused, first.changed, first.changed_by) == ("billing", True, True, "alice")
    assert (again.paused, again.changed, again.changed_by, again.changed_at) == (True, False, "alice", first.changed_at)
    row = QueueState.objects.get(pk="billing")
    assert (row.paused, row.changed_by, row.changed_at) == (True, "alice", first.changed_at)


@pytest.mark.django_db
def test_resume_is_idempotent_and_records_who_resumed():
    pause_queue("billing", by="alice")

    resumed = resume_queue("billing", by="bob")
    again = resume_queue("billing", by="carol")

    assert (resumed.paused, resumed.changed, resumed.changed_by) == (False, True, "bob")
    assert (again.paused, again.changed, again.changed_by) == (False, False, "bob")
    assert paused_queues() == []
    assert QueueState.objects.get(pk="billing").changed_by == "bob"


@pytest.mark.django_db
def test_resuming_a_queue_never_paused_records_a_row_that_runs():
    change = resume_queue("never-paused", by="ops")

    assert (change.paused, change.changed) == (False, True)
    assert list(QueueState.objects.values_list("queue", "paused")) == [("never-paused", False)]


@pytest.mark.django_db
def test_paused_queues_lists_only_paused_ones_by_name():
    for queue in ("zeta", "alpha", "mid"):
        pause_queue(queue)
    resume_queue("mid")

    assert [state.queue for state in paused_queues()] == ["alpha", "zeta"]


@pytest.mark.django_db
def test_queue_names_at_the_bound_pass_and_one_past_fails():
    longest = "q" * MAX_QUEUE_CHARS
    assert pause_queue(longest).paused
    assert resume_queue(longest).changed

    for function in (pause_queue, resume_queue):
        with pytest.raises(InvalidArgumentError) as raised:
            function("q" * (MAX_QUEUE_CHARS + 1))
        assert (raised.value.field, raised.value.bound) == ("queue", f"1..{MAX_QUEUE_CHARS} characters")
    assert QueueState.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("queue", "bound"),
    [
        ("", f"1..{MAX_QUEUE_CHARS} characters"),
        ("bil\x00ling", "text without NUL characters or lone surrogates"),
        ("bil\ud800ling", "text without NUL characters or lone surrogates"),
        (None, "a string"),
        (b"billing", "a string"),
    ],
)
def test_bad_queue_names_are_refused_as_enqueue_refuses_them(queue, bound):
    for function in (pause_queue, resume_queue):
        with pytest.raises(InvalidArgumentError) as raised:
            function(queue)
        assert (raised.value.field, raised.value.bound) == ("queue", bound)
    with pytest.raises(InvalidArgumentError) as from_enqueue:
        enqueue("tests.record", {}, queue=queue)
    assert (from_enqueue.value.field, from_enqueue.value.bound) == ("queue", bound)
    assert QueueState.objects.count() == 0


@pytest.mark.django_db
def test_who_paused_is_bounded():
    assert pause_queue("a", by="x" * MAX_REQUESTED_BY_CHARS).changed_by == "x" * MAX_REQUESTED_BY_CHARS
    with pytest.raises(InvalidArgumentError) as raised:
        pause_queue("b", by="x" * (MAX_REQUESTED_BY_CHARS + 1))
    assert raised.value.field == "by"
    with pytest.raises(InvalidArgumentError):
        pause_queue("b", by="nul\x00")
    assert list(QueueState.objects.values_list("queue", flat=True)) == ["a"]


@pytest.mark.django_db
def test_a_refused_name_leaves_the_callers_transaction_usable():
    with transaction.atomic():
        with pytest.raises(InvalidArgumentError):
            pause_queue("bad\x00")
        assert pause_queue("good").changed
    assert [state.queue for state in paused_queues()] == ["good"]


@pytest.mark.django_db(transaction=True)
def test_a_pause_in_a_transaction_that_rolls_back_pauses_nothing(other_connection):
    with pytest.raises(RuntimeError), transaction.atomic():
        pause_queue("billing")
        assert other_connection.execute("SELECT count(*) FROM workhorse_queue").fetchone() == (0,)
        raise RuntimeError("roll back")

    assert paused_queues() == []


@pytest.mark.django_db(transaction=True)
def test_a_pause_in_a_transaction_is_seen_by_workers_on_commit(other_connection):
    with transaction.atomic():
        pause_queue("billing")
        assert other_connection.execute("SELECT count(*) FROM workhorse_queue").fetchone() == (0,)
    assert other_connection.execute("SELECT queue, paused FROM workhorse_queue").fetchall() == [("billing", True)]


# -- what a pause does to claims -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueue_into_a_paused_queue_works_and_the_work_waits_for_the_resume():
    pause_queue("billing")
    held = enqueue("tests.record", {"n": 1}, queue="billing")
    other = enqueue("tests.record", {"n": 2}, queue="default")

    stats = run_worker(queues=["billing", "default"])

    assert stats.claimed == 1
    assert Job.objects.get(pk=other).status == JobStatus.SUCCEEDED
    job = Job.objects.get(pk=held)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 0)

    resume_queue("billing")
    assert run_worker(queues=["billing", "default"]).claimed == 1
    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.SUCCEEDED, 1)


@pytest.mark.django_db(transaction=True)
def test_a_polling_worker_obeys_a_pause_at_its_next_claim():
    worker = make_worker(queues=["billing", "other"], concurrency=2)
    with running(worker):
        first = enqueue("tests.record", {}, queue="billing")
        wait_for(lambda: Job.objects.get(pk=first).status == JobStatus.SUCCEEDED, what="the first job to run")
        pause_queue("billing")
        held = enqueue("tests.record", {}, queue="billing")
        # Enqueued after the held job, in a queue the same claims read: once it ran, a claim that
        # could have taken both (two slots free) took only it.
        later = enqueue("tests.record", {}, queue="other")
        wait_for(lambda: Job.objects.get(pk=later).status == JobStatus.SUCCEEDED, what="the other queue's job")
        assert Job.objects.get(pk=held).status == JobStatus.QUEUED
        resume_queue("billing")
        wait_for(lambda: Job.objects.get(pk=held).status == JobStatus.SUCCEEDED, what="the held job to run")


@pytest.mark.django_db(transaction=True)
def test_eager_mode_ignores_a_pause(settings):
    settings.WORKHORSE_EAGER = True
    pause_queue("billing")

    job_id = enqueue("tests.record", {"eager": True}, queue="billing")

    assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_a_resume_wakes_a_listening_worker_without_waiting_for_its_poll():
    pause_queue("billing")
    held = enqueue("tests.record", {}, queue="billing")
    worker = make_worker(queues=["billing"], listen_using="default", poll_interval=300)
    with running(worker):
        assert worker.wait_until_listening(30)
        resume_queue("billing")
        wait_for(lambda: Job.objects.get(pk=held).status == JobStatus.SUCCEEDED, 30, what="the resumed job to run")


@pytest.mark.django_db(transaction=True)
def test_resume_notifies_on_the_work_channel_on_commit(listener):
    pause_queue("billing")
    with transaction.atomic():
        resume_queue("billing")
        assert listener(0.2) == []
    assert listener(5, 1) == ["billing"]


# -- drain -----------------------------------------------------------------------------------------


@pytest.fixture
def gate() -> Iterator[None]:
    GATE.reset()
    yield
    GATE.open("drain")


@pytest.mark.django_db(transaction=True)
def test_drain_returns_only_after_the_running_job_ends(gate):
    job_id = enqueue("tests.gated", {"label": "drain", "timeout": 60}, queue="billing")
    queued = enqueue("tests.record", {}, queue="billing")  # behind it, on the worker's one thread
    drained = threading.Event()
    checks = []

    def drain() -> None:
        try:
            drain_queue("billing", timeout=60, poll=0.05, by="deploy", on_progress=checks.append)
            drained.set()
        finally:
            connections.close_all()  # this thread's connection

    with running(make_worker(queues=["billing"], concurrency=1)):
        wait_for(lambda: GATE.in_flight("drain") == 1, what="the gated job to run")
        thread = threading.Thread(target=drain)
        thread.start()
        wait_for(lambda: len(checks) >= 3, what="the drain to check a few times")
        assert not drained.is_set()
        assert checks[-1].running == [job_id]
        GATE.let_out("drain")
        assert drained.wait(30)
        thread.join(30)
    assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED
    assert Job.objects.get(pk=queued).status == JobStatus.QUEUED  # paused: not claimed after the gated job
    assert checks[-1].drained and QueueState.objects.get(pk="billing").paused


@pytest.mark.django_db(transaction=True)
def test_drain_times_out_with_a_typed_error_and_the_queue_stays_paused(gate):
    job_id = enqueue("tests.gated", {"label": "drain", "timeout": 60}, queue="billing")
    with running(make_worker(queues=["billing"])):
        wait_for(lambda: GATE.in_flight("drain") == 1, what="the gated job to run")
        with pytest.raises(DrainTimeoutError) as raised:
            drain_queue("billing", timeout=0.3, poll=0.05)
        GATE.let_out("drain")
    assert (raised.value.queue, raised.value.running) == ("billing", (job_id,))
    assert "did not drain within 0.3 s" in str(raised.value)
    assert QueueState.objects.get(pk="billing").paused


@pytest.mark.django_db(transaction=True)
def test_drain_waits_for_transactions_older_than_its_pause():
    # A claim in such a transaction may have read the queue before the pause and not committed yet.
    older = connect_directly(autocommit=False)
    older.execute("SELECT 1")  # its transaction is open
    checks: list[DrainProgress] = []
    drained = threading.Event()

    def drain() -> None:
        try:
            drain_queue("idle", timeout=60, poll=0.02, on_progress=checks.append)
            drained.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=drain)
    thread.start()
    try:
        wait_for(lambda: len(checks) >= 3, what="the drain to check a few times")
        assert not drained.is_set()
        assert checks[-1].running == [] and checks[-1].waiting_transactions >= 1
    finally:
        older.commit()
        older.close()
    assert drained.wait(30)
    thread.join(30)
    assert checks[-1].drained


@pytest.mark.django_db(transaction=True)
def test_drain_of_an_idle_queue_returns_at_once():
    progress = drain_queue("idle", timeout=0, poll=0.01)
    assert progress.drained and [state.queue for state in paused_queues()] == ["idle"]


@pytest.mark.django_db
def test_drain_refuses_to_run_inside_a_transaction():
    with pytest.raises(TransactionManagementError):
        drain_queue("billing", timeout=1)
    assert not QueueState.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [("timeout", -0.001), ("timeout", 86_400.001), ("timeout", float("nan")), ("timeout", True), ("poll", 0.0099)],
)
def test_drain_bounds(field, value):
    arguments = {"timeout": 1.0, "poll": 0.5, field: value}
    with pytest.raises(InvalidArgumentError) as raised:
        drain_queue("billing", **arguments)
    assert raised.value.field == field
    assert not QueueState.objects.exists()


# -- manage.py workhorse_queue ---------------------------------------------------------------------


def command(*arguments: str) -> str:
    out = StringIO()
    call_command("workhorse_queue", *arguments, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_the_command_pauses_lists_and_resumes():
    assert command("list") == "No queue is paused.\n"
    assert command("pause", "billing", "--by", "ops") == "Queue billing is paused.\n"
    assert "was paused already" in command("pause", "billing")
    listed = command("list")
    assert listed.startswith("billing  paused since ") and listed.endswith(" UTC by ops\n")
    assert command("resume", "billing") == "Queue billing is resumed.\n"
    assert command("resume", "billing") == "Queue billing was not paused.\n"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("pause",), "pause needs a queue."),
        (("list", "billing"), "list takes no queue."),
        (("resume", "billing", "--wait"), "--wait goes with pause or drain, not resume."),
        (("pause", "q" * (MAX_QUEUE_CHARS + 1)), f"queue must be 1..{MAX_QUEUE_CHARS} characters"),
    ],
)
def test_the_command_refuses_bad_requests(arguments, message):
    from django.core.management import CommandError

    with pytest.raises(CommandError, match=message.replace(".", r"\.")):
        command(*arguments)
    assert not QueueState.objects.exists()


def command_environment() -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": subprocess_database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}


def run_command(*arguments: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "workhorse_queue", *arguments],
        cwd=ROOT,
        env=command_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.django_db(transaction=True)
def test_drain_command_exits_0_once_the_running_job_ended(gate):
    job_id = enqueue("tests.gated", {"label": "drain", "timeout": 60}, queue="billing")
    with running(make_worker(queues=["billing"])):
        wait_for(lambda: GATE.in_flight("drain") == 1, what="the gated job to run")
        process = subprocess.Popen(
            [sys.executable, "manage.py", "workhorse_queue", "drain", "billing", "--poll", "0.05", "--timeout", "60"],
            cwd=ROOT,
            env=command_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: QueueState.objects.filter(pk="billing", paused=True).exists(), 60, what="the pause")
            assert process.poll() is None  # still waiting: the job runs
            GATE.let_out("drain")
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0, err
    assert out.startswith("Queue billing is paused and drained")
    assert f"Draining billing: 1 running ({job_id})" in err
    assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_drain_command_exits_1_on_timeout_and_says_how_to_resume(gate):
    job_id = enqueue("tests.gated", {"label": "drain", "timeout": 60}, queue="billing")
    with running(make_worker(queues=["billing"])):
        wait_for(lambda: GATE.in_flight("drain") == 1, what="the gated job to run")
        done = run_command("pause", "billing", "--wait", "--timeout", "0.5", "--poll", "0.05")
        GATE.let_out("drain")
    assert done.returncode == 1, done.stderr
    assert f"did not drain within 0.5 s: 1 job(s) still running ({job_id})" in done.stderr
    assert "manage.py workhorse_queue resume billing" in done.stderr
    assert QueueState.objects.get(pk="billing").paused


@pytest.mark.django_db(transaction=True)
def test_drain_command_refuses_a_bad_timeout_with_exit_2():
    done = run_command("drain", "billing", "--timeout", "-1")
    assert done.returncode == 2
    assert "must be a number of seconds in 0..86400" in done.stderr


# -- the admin -------------------------------------------------------------------------------------

QUEUES = "/admin/workhorse/queuestate/"


def queue_row(page: str, queue: str) -> str:
    found = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', page, re.DOTALL)
    assert found is not None, f"no row for queue {queue}"
    return found.group(1)


@pytest.fixture
def queues_world() -> None:
    JobFactory.create_batch(3, queue="billing", status=JobStatus.QUEUED)
    JobFactory(queue="billing", status=JobStatus.RUNNING, attempt=1)
    JobFactory(queue="mail", status=JobStatus.QUEUED)
    pause_queue("billing", by="ops")
    resume_queue("empty-resumed", by="ops")  # a row, no job


@pytest.mark.django_db
def test_the_queues_page_lists_every_queue_with_jobs_or_a_row(client, django_user_model, queues_world):
    login(client, django_user_model, "viewer", ("view_job",))

    page = body(client.get(QUEUES))

    billing = queue_row(page, "billing")
    assert '"queued">3<' in billing and '"running">1<' in billing and ">paused<" in billing and ">ops<" in billing
    assert ">running<" in queue_row(page, "mail") and '"queued">1<' in queue_row(page, "mail")
    assert ">running<" in queue_row(page, "empty-resumed")
    assert 'value="pause"' not in page and 'value="resume"' not in page  # no permission, no button


@pytest.mark.django_db
def test_pause_and_resume_each_need_their_own_permission(client, django_user_model, queues_world):
    login(client, django_user_model, "viewer", ("view_job",))
    assert client.post(QUEUES, {"action": "pause", "queue": "mail"}).status_code == 403
    assert client.post(QUEUES, {"action": "resume", "queue": "billing"}).status_code == 403
    assert [state.queue for state in paused_queues()] == ["billing"]

    client.logout()
    login(client, django_user_model, "pauser", ("view_job", "pause_queue"))
    page = body(client.get(QUEUES))
    assert 'value="pause"' in queue_row(page, "mail") and 'value="resume"' not in page
    assert client.post(QUEUES, {"action": "resume", "queue": "billing"}).status_code == 403
    done = client.post(QUEUES, {"action": "pause", "queue": "mail"}, follow=True)
    assert messages_of(done) == ["Queue mail is paused: no worker claims its jobs."]
    assert QueueState.objects.get(pk="mail").changed_by == "admin:pauser"

    client.logout()
    login(client, django_user_model, "resumer", ("view_job", "resume_queue"))
    page = body(client.get(QUEUES))
    assert 'value="resume"' in queue_row(page, "mail") and 'value="pause"' not in page
    assert client.post(QUEUES, {"action": "pause", "queue": "empty-resumed"}).status_code == 403
    done = client.post(QUEUES, {"action": "resume", "queue": "mail"}, follow=True)
    assert messages_of(done) == ["Queue mail is resumed: workers claim its jobs again."]
    assert [state.queue for state in paused_queues()] == ["billing"]


@pytest.mark.django_db
def test_the_queues_page_is_refused_without_a_view_permission(client, django_user_model, queues_world):
    login(client, django_user_model, "nobody", ("pause_queue",))
    assert client.get(QUEUES).status_code == 403
    assert client.post(QUEUES, {"action": "pause", "queue": "mail"}).status_code == 403
    assert not QueueState.objects.filter(pk="mail").exists()


@pytest.mark.django_db
def test_a_bad_queue_name_posted_is_a_readable_error(client, django_user_model):
    login(client, django_user_model, "pauser", ("view_job", "pause_queue"))
    done = client.post(QUEUES, {"action": "pause", "queue": "q" * (MAX_QUEUE_CHARS + 1)}, follow=True)
    [message] = messages_of(done)
    assert message.startswith(f"queue must be 1..{MAX_QUEUE_CHARS} characters, got ")
    assert not QueueState.objects.exists()


@pytest.mark.django_db
def test_a_jobs_page_says_its_queue_is_paused(client, django_user_model):
    login(client, django_user_model, "viewer", ("view_job",))
    job = JobFactory(queue="billing", status=JobStatus.QUEUED)
    url = f"/admin/workhorse/job/{job.pk}/change/"
    assert 'id="workhorse-queue-paused"' not in body(client.get(url))

    pause_queue("billing", by="ops")
    timeline = body(client.get(url)).split('id="workhorse-events"')[1]

    assert "<strong>Queue billing is paused</strong>" in timeline and "by ops" in timeline
    assert "this job waits, in its place, until the queue is resumed" in timeline


@pytest.mark.django_db
def test_the_dashboard_marks_paused_queues(client, django_user_model, queues_world):
    login(client, django_user_model, "viewer", ("view_job",))

    page = body(client.get("/admin/workhorse/job/dashboard/"))

    assert 'data-field="paused"' in queue_row(page, "billing")
    assert 'data-field="paused"' not in queue_row(page, "mail")
    assert "(no worker claims their jobs): " in page and "billing</span> (3 queued)" in page


# -- status and metrics ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_status_lists_paused_queues_and_warns_of_their_queued_jobs(queues_world):
    out = StringIO()
    call_command("workhorse_status", stdout=out)
    text = out.getvalue()

    assert (
        "Queued jobs in paused queues (no worker claims them until the queue is resumed) (1): billing (3 queued)"
        in text
    )
    paused = text.split("Paused queues (times in UTC)\n")[1].split("\n\n")[0].splitlines()
    assert paused[0].split() == ["queue", "paused", "since", "by", "queued"]
    assert paused[2].startswith("billing ") and paused[2].split()[-2:] == ["ops", "3"]
    assert len(paused) == 3

    out = StringIO()
    call_command("workhorse_status", "--json", stdout=out)
    report = json.loads(out.getvalue())
    [entry] = report["paused_queues"]
    assert entry == {
        "queue": "billing",
        "since": QueueState.objects.get(pk="billing").changed_at.isoformat(),
        "by": "ops",
        "queued": 3,
    }
    warning = next(w for w in report["warnings"] if w["kind"] == "paused_queue_with_jobs")
    assert warning["names"] == [{"name": "billing", "jobs": 3}]


@pytest.mark.django_db
def test_status_says_nothing_of_pauses_when_none_is_paused():
    resume_queue("billing")
    out = StringIO()
    call_command("workhorse_status", stdout=out)
    assert "Paused queues" not in out.getvalue() and "paused queues" not in out.getvalue()


@pytest.mark.django_db
def test_the_paused_gauge_is_1_for_paused_0_for_resumed_and_read_in_one_query(django_assert_num_queries):
    pytest.importorskip("prometheus_client")
    from django_workhorse.operations import stats

    pause_queue("billing")
    pause_queue("mail")
    resume_queue("mail")
    with django_assert_num_queries(1):
        pauses = stats.queue_pauses()
    assert pauses == [("billing", True), ("mail", False)]

    from django_workhorse.observability.metrics.gauges import DatabaseGauges

    [family] = [m for m in DatabaseGauges(ttl=0).collect() if m.name == "workhorse_queue_paused"]
    assert {sample.labels["queue"]: sample.value for sample in family.samples} == {"billing": 1.0, "mail": 0.0}
