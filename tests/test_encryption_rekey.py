"""Key rotation (decision 0024, increment 6): ``workhorse_rekey`` and check workhorse.W005."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.test import override_settings

from django_workhorse import EnqueueOptions, EnqueueRequest, enqueue, enqueue_many, once
from django_workhorse import wait_for as wait_for_result
from django_workhorse.awaiting import listener as listeners
from django_workhorse.checks import check_encryption_keys_needed
from django_workhorse.encryption import envelope_key_id
from django_workhorse.encryption.jobs import CHECKPOINT_PREFIX, EVENT_ERROR, LAST_ERROR, PAYLOAD, RESULT, open_value
from django_workhorse.encryption.sealed_json import SEALED_FIELD
from django_workhorse.management.commands.workhorse_rekey import batch_size
from django_workhorse.models import Checkpoint, Job, JobEvent, JobStatus
from django_workhorse.operations.rekey import key_counts
from django_workhorse.sql import rekey as rekey_sql
from django_workhorse.tasks.registry import register
from django_workhorse.tasks.retry import RetryPolicy
from django_workhorse.worker import HandlerContext
from tests.encryption import encryption_setting, new_key
from tests.http_views import CONTROL, SEALED
from tests.test_encrypted_http import BY_SETTING, assert_replays_the_first, order, records
from tests.test_encrypted_http import new_key as http_key
from tests.test_http_idempotency import Client
from tests.worker_tasks import make_worker, run_worker, running, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

OLD, NEW = "2026_01", "2026_07"  # an underscore: the LIKE pattern must escape it
OLD_KEY, NEW_KEY, FINGERPRINT_KEY = new_key(), new_key(), new_key()
BEFORE = encryption_setting(keys={OLD: OLD_KEY}, active=OLD, fingerprint_key=FINGERPRINT_KEY)
ROTATING = encryption_setting(keys={OLD: OLD_KEY, NEW: NEW_KEY}, active=NEW, fingerprint_key=FINGERPRINT_KEY)
AFTER = encryption_setting(keys={NEW: NEW_KEY}, active=NEW, fingerprint_key=FINGERPRINT_KEY)
FAST_RETRY = RetryPolicy.fixed(timedelta(milliseconds=1))
SECRET = "quince-91b2-secret"


@register("tests.rekey.work")
def work(ctx: HandlerContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Checkpoint a stage when ``n`` is a multiple of 10; fail the first attempt when it is a multiple of 50."""
    stage = {"n": payload["n"], "secret": SECRET}
    if payload["n"] % 10 == 0:
        stage = ctx.checkpoint("stage", lambda: stage)
    if payload["n"] % 50 == 0 and ctx.attempt == 1:
        raise RuntimeError(f"first attempt of {payload['n']} fails ({SECRET})")
    return {"n": payload["n"], "stage": stage}


@pytest.fixture
def client_(live_server: Any) -> Iterator[Client]:
    CONTROL.reset()
    yield Client(live_server.url)
    CONTROL.reset()


@pytest.fixture(autouse=True)
def _result_listener() -> Iterator[None]:
    yield
    listeners.listener("default").stop()


def enqueue_jobs(count: int, *, start: int = 0) -> list[int]:
    options = EnqueueOptions(encrypted=True, retry_policy=FAST_RETRY, max_attempts=3)
    ids: list[int] = []
    for first in range(start, start + count, 1000):
        chunk = [
            EnqueueRequest("tests.rekey.work", {"n": n}, options)
            for n in range(first, min(first + 1000, start + count))
        ]
        ids += [result.job_id for result in enqueue_many(chunk)]
    return ids


def rekey(*args: str) -> tuple[int, str, str]:
    """Run ``workhorse_rekey``; return its exit status, output and errors."""
    out, err = StringIO(), StringIO()
    try:
        call_command("workhorse_rekey", "--no-progress", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), err.getvalue() + str(exc)
    return 0, out.getvalue(), err.getvalue()


def keys_in_use() -> dict[str, set[str]]:
    """The key ids of the stored envelopes, by table."""
    return {table: set(by_key) for table, by_key in key_counts().items() if by_key}


def summary(out: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.splitlines())


def numbers(line: str) -> tuple[int, ...]:
    """The four counts of a summary line: re-encrypted, already under the active key, not opened, locked."""
    return tuple(int(part.strip().split(" ", 1)[0]) for part in line.split(","))


def opened(job: Job, field: str, value: str) -> Any:
    return open_value(value, field=field, salt=bytes(job.cipher_salt), job_id=job.pk)


# -- rotation under a running worker ------------------------------------------------------------------


def test_ten_thousand_jobs_are_rekeyed_while_a_worker_runs_them_and_run_once_the_old_key_is_gone():
    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        ids = enqueue_jobs(10_000)
        run_worker(max_jobs=1000, concurrency=8, batch=50)  # results, errors and checkpoints under the old key
    with override_settings(WORKHORSE_ENCRYPTION=AFTER):  # the old key removed too early
        (warning,) = check_encryption_keys_needed(databases=["default"])
        assert f"key id(s) '{OLD}'" in warning.msg
    with override_settings(WORKHORSE_ENCRYPTION=ROTATING):
        with running(make_worker(concurrency=8, batch=50)) as handle:
            wait_for(lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() >= 1500, 60)
            status, out, err = rekey("--batch", "500")
            # Stop before the queue is empty: the jobs left run after the old key is gone.
        assert handle.error is None
        assert status == 0 and "cannot decrypt" not in err  # maybe "run workhorse_rekey again", if a row stayed locked
        counts = {table: numbers(line) for table, line in summary(out).items()}
        assert counts["workhorse_job"][0] >= 10_000  # every payload, and the results run before
        assert all(unopened == 0 for _, _, unopened, _ in counts.values())
        locked = sum(locked for *_, locked in counts.values())
        if locked:  # a row the worker held through the last pass: the next run takes it
            assert sum(rekeyed for rekeyed, *_ in map(numbers, summary(rekey()[1]).values())) == locked
        assert keys_in_use()["workhorse_job"] == {NEW}

    with override_settings(WORKHORSE_ENCRYPTION=AFTER):
        assert check_encryption_keys_needed(databases=["default"]) == []
        run_worker(concurrency=8, batch=50, timeout=100)
        assert Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == 10_000
        assert keys_in_use() == {
            "workhorse_job": {NEW},
            "workhorse_job_event": {NEW},
            "workhorse_checkpoint": {NEW},
        }
        for job in Job.objects.filter(pk__in=ids).iterator():
            n = json.loads(opened(job, PAYLOAD, job.payload))["n"]
            assert json.loads(opened(job, RESULT, job.result)) == {"n": n, "stage": {"n": n, "secret": SECRET}}
        assert wait_for_result(ids[50], timeout=5) == {"n": 50, "stage": {"n": 50, "secret": SECRET}}
        status, out, _ = rekey()
        assert status == 0 and all(line.startswith("0 re-encrypted") for line in summary(out).values())


# -- one of each value, rotated without a worker -------------------------------------------------------


def stored_everywhere() -> tuple[int, int]:
    """Under the active key: a job run to a failure then a success (payload, result, an event's error,
    a checkpoint), one that dies (payload, last_error, an event's error, a checkpoint), and a sealed
    once() result. Return the two jobs' ids."""
    retried = enqueue("tests.rekey.work", {"n": 100}, encrypted=True, retry_policy=FAST_RETRY)
    dead = enqueue("tests.rekey.work", {"n": 150}, encrypted=True, max_attempts=1)
    run_worker(max_jobs=3)
    assert Job.objects.get(pk=retried).status == JobStatus.SUCCEEDED
    once("charge", lambda: {"charged": SECRET}, scope="payments", encrypted=True)
    return retried, dead


def test_every_table_is_rekeyed_and_every_value_still_opens():
    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        job_id, dead_id = stored_everywhere()
        assert keys_in_use() == {
            "workhorse_job": {OLD},
            "workhorse_job_event": {OLD},
            "workhorse_checkpoint": {OLD},
            "workhorse_effect": {OLD},
        }
    with override_settings(WORKHORSE_ENCRYPTION=ROTATING):
        status, out, err = rekey("--batch", "1")
        assert (status, err) == (0, "")
        assert summary(out) == {
            "workhorse_job": "4 re-encrypted, 0 already under the active key, 0 could not be opened, 0 skipped as locked",
            "workhorse_job_event": "2 re-encrypted, 0 already under the active key, 0 could not be opened, 0 skipped as locked",
            "workhorse_checkpoint": "2 re-encrypted, 0 already under the active key, 0 could not be opened, 0 skipped as locked",
            "workhorse_effect": "1 re-encrypted, 0 already under the active key, 0 could not be opened, 0 skipped as locked",
        }
    with override_settings(WORKHORSE_ENCRYPTION=AFTER):
        assert set().union(*keys_in_use().values()) == {NEW}
        dead = Job.objects.get(pk=dead_id)
        assert "first attempt of 150 fails" in opened(dead, LAST_ERROR, dead.last_error)
        job = Job.objects.get(pk=job_id)
        event = JobEvent.objects.filter(job_id=job_id, details__has_key="error").get()
        assert "first attempt of 100 fails" in opened(job, EVENT_ERROR, event.details["error"])
        checkpoint = Checkpoint.objects.get(job_id=job_id)
        assert json.loads(opened(job, CHECKPOINT_PREFIX + "stage", checkpoint.value)) == {"n": 100, "secret": SECRET}
        assert wait_for_result(job_id, timeout=5) == {"n": 100, "stage": {"n": 100, "secret": SECRET}}
        assert once("charge", lambda: "never", scope="payments") == {"charged": SECRET}


def test_a_second_run_is_a_no_op_and_counts_what_is_already_under_the_active_key():
    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        stored_everywhere()
    with override_settings(WORKHORSE_ENCRYPTION=ROTATING):
        assert rekey()[0] == 0
        status, out, _ = rekey()
    assert status == 0
    assert summary(out)["workhorse_job"] == (
        "0 re-encrypted, 4 already under the active key, 0 could not be opened, 0 skipped as locked"
    )
    assert all(line.startswith("0 re-encrypted") for line in summary(out).values())


def test_dry_run_says_which_values_no_configured_key_opens():
    from types import MappingProxyType

    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        enqueue_jobs(2)
    with override_settings(WORKHORSE_ENCRYPTION=AFTER):
        enqueue_jobs(1, start=2)
        status, out, _ = rekey("--dry-run")
    assert status == 0
    assert out.splitlines()[:2] == [
        f"workhorse_job: key {OLD}: 2 value(s) (key not configured: cannot be opened)",
        f"workhorse_job: key {NEW}: 1 value(s) (active key)",
    ]
    # A setting given as another mapping than a dict reads its key ids alike.
    with override_settings(WORKHORSE_ENCRYPTION=MappingProxyType(ROTATING)):
        assert check_encryption_keys_needed(databases=["default"]) == []
    with override_settings(WORKHORSE_ENCRYPTION=MappingProxyType(AFTER)):
        (warning,) = check_encryption_keys_needed(databases=["default"])
        assert f"key id(s) '{OLD}'" in warning.msg and "(at least 2)" in warning.msg


def test_dry_run_counts_by_table_and_key_id_and_writes_nothing():
    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        enqueue_jobs(3)
    with override_settings(WORKHORSE_ENCRYPTION=ROTATING):
        enqueue_jobs(2, start=3)
        before = list(Job.objects.order_by("pk").values_list("payload", flat=True))
        status, out, _ = rekey("--dry-run")
    assert status == 0
    assert out.splitlines() == [
        f"workhorse_job: key {OLD}: 3 value(s) (would be re-encrypted)",
        f"workhorse_job: key {NEW}: 2 value(s) (active key)",
        "workhorse_job_event: no encrypted values",
        "workhorse_checkpoint: no encrypted values",
        "workhorse_effect: no encrypted values",
    ]
    assert list(Job.objects.order_by("pk").values_list("payload", flat=True)) == before


def test_a_value_that_does_not_open_is_reported_and_the_rest_is_rekeyed_with_exit_status_1():
    with override_settings(WORKHORSE_ENCRYPTION=encryption_setting(keys={"lost": new_key()}, active="lost")):
        (lost,) = enqueue_jobs(1)
    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        tampered, fine = enqueue_jobs(2, start=1)
    payload = Job.objects.get(pk=tampered).payload
    Job.objects.filter(pk=tampered).update(payload=payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1])
    with override_settings(WORKHORSE_ENCRYPTION=ROTATING):
        status, out, err = rekey()
    assert status == 1
    assert f"workhorse_job row {lost} payload: cannot decrypt payload of workhorse_job row {lost}: key id 'lost'" in err
    assert f"workhorse_job row {tampered} payload: cannot decrypt" in err
    assert "2 value(s) could not be opened" in err
    assert summary(out)["workhorse_job"] == (
        "1 re-encrypted, 0 already under the active key, 2 could not be opened, 0 skipped as locked"
    )
    assert envelope_key_id(Job.objects.get(pk=fine).payload) == NEW
    assert envelope_key_id(Job.objects.get(pk=lost).payload) == "lost"


def test_rekey_needs_the_setting():
    with override_settings(WORKHORSE_ENCRYPTION=None):
        status, _, err = rekey()
    assert status == 2 and "WORKHORSE_ENCRYPTION is not set" in err


# -- a stored HTTP response --------------------------------------------------------------------------------


def test_a_sealed_http_record_is_rekeyed_and_still_replays(client_, settings):
    settings.WORKHORSE_ENCRYPTION = {**BEFORE, "encrypted_scopes": [SEALED]}
    key = http_key()
    first = client_.send(BY_SETTING, order("rotated"), key=key)
    settings.WORKHORSE_ENCRYPTION = {**ROTATING, "encrypted_scopes": [SEALED]}
    status, out, _ = rekey()
    assert status == 0
    assert summary(out)["workhorse_effect"].startswith("2 re-encrypted, 0 already")  # the body and the headers
    settings.WORKHORSE_ENCRYPTION = {**AFTER, "encrypted_scopes": [SEALED]}
    (record,) = records()
    assert envelope_key_id(bytes(record.response_body).decode("ascii")) == NEW
    assert envelope_key_id(record.response_headers[SEALED_FIELD]) == NEW
    assert_replays_the_first(first, client_.send(BY_SETTING, order("rotated"), key=key))


# -- the guarded update and the lock ---------------------------------------------------------------------


def test_an_update_guarded_by_a_stale_value_changes_nothing():
    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        (job_id,) = enqueue_jobs(1)
    stored = Job.objects.get(pk=job_id).payload
    slot = rekey_sql.JOBS.slots[0]
    assert rekey_sql.update_slot("default", rekey_sql.JOBS, slot, [(job_id, stored + "x", "wh1:other:AAAA")]) == 0
    assert Job.objects.get(pk=job_id).payload == stored
    assert rekey_sql.update_slot("default", rekey_sql.JOBS, slot, [(job_id, stored, "replaced")]) == 1
    assert Job.objects.get(pk=job_id).payload == "replaced"


def test_rows_another_transaction_holds_are_skipped_and_reported_as_locked():
    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        held, free = enqueue_jobs(2)
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute("SELECT id FROM workhorse_job WHERE id = %s FOR UPDATE", [held])
        with override_settings(WORKHORSE_ENCRYPTION=ROTATING):
            status, out, err = rekey()
        assert status == 0
        assert summary(out)["workhorse_job"] == (
            "1 re-encrypted, 0 already under the active key, 0 could not be opened, 1 skipped as locked"
        )
        assert err == "1 value(s) are in rows other transactions held: run workhorse_rekey again.\n"
    finally:
        other.rollback()
        other.close()
    with override_settings(WORKHORSE_ENCRYPTION=ROTATING):
        assert summary(rekey()[1])["workhorse_job"].startswith("1 re-encrypted, 1 already")
    assert {envelope_key_id(Job.objects.get(pk=pk).payload) for pk in (held, free)} == {NEW}


def test_the_like_pattern_escapes_the_wildcards_of_a_key_id():
    assert rekey_sql.like_prefix("a_b%c") == "wh1:a\\_b\\%c:%"


# -- check workhorse.W005 ---------------------------------------------------------------------------------


def test_the_check_warns_while_values_need_a_removed_key_and_not_after_the_rekey():
    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        stored_everywhere()
    with override_settings(WORKHORSE_ENCRYPTION=AFTER):
        (warning,) = check_encryption_keys_needed(databases=["default"])
        assert warning.id == "workhorse.W005"
        assert f"key id(s) '{OLD}'" in warning.msg and "(at least 9)" in warning.msg
        assert OLD_KEY not in warning.msg + warning.hint and NEW_KEY not in warning.msg + warning.hint
    with override_settings(WORKHORSE_ENCRYPTION=ROTATING):
        assert check_encryption_keys_needed(databases=["default"]) == []
        assert rekey()[0] == 0
    with override_settings(WORKHORSE_ENCRYPTION=AFTER):
        assert check_encryption_keys_needed(databases=["default"]) == []
    with override_settings(WORKHORSE_ENCRYPTION=None):
        (warning,) = check_encryption_keys_needed(databases=["default"])
        assert f"key id(s) '{NEW}'" in warning.msg


def test_the_check_counts_up_to_its_cap_and_runs_only_with_database_checks(monkeypatch):
    from django.core.checks import Tags

    from django_workhorse import checks

    monkeypatch.setattr(checks, "UNKNOWN_KEY_COUNT_CAP", 2)
    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        enqueue_jobs(5)
    with override_settings(WORKHORSE_ENCRYPTION=AFTER):
        (warning,) = check_encryption_keys_needed(databases=["default"])
        assert "(at least 2)" in warning.msg
        assert check_encryption_keys_needed(databases=[]) == []
    assert Tags.database in check_encryption_keys_needed.tags


def test_the_worker_and_the_scheduler_leave_the_check_out_and_check_database_runs_it():
    from django_workhorse.checks import stored_keys_left_out
    from django_workhorse.management.commands.workhorse_worker import Command as WorkerCommand

    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        enqueue_jobs(1)
    with override_settings(WORKHORSE_ENCRYPTION=AFTER):
        with stored_keys_left_out():
            assert check_encryption_keys_needed(databases=["default"]) == []
        (warning,) = check_encryption_keys_needed(databases=["default"])
        assert warning.id == "workhorse.W005"
        out = StringIO()
        call_command("check", databases=["default"], stdout=out, stderr=out)
        assert "workhorse.W005" in out.getvalue()
        out = StringIO()
        WorkerCommand(stdout=out, stderr=out).check(databases=["default"], display_num_errors=True)
        assert "workhorse.W005" not in out.getvalue() and "System check identified no issues" in out.getvalue()


def _plan_nodes(statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with connections["default"].cursor() as cursor:
        cursor.execute("ANALYZE workhorse_job")
        cursor.execute("ANALYZE workhorse_checkpoint")
        cursor.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        nodes, found = [cursor.fetchone()[0][0]["Plan"]], []
    while nodes:
        node = nodes.pop()
        found.append(node)
        nodes.extend(node.get("Plans", []))
    return found


def test_the_check_reads_the_encrypted_jobs_through_their_index_not_the_clear_history():
    clear = [EnqueueRequest("tests.rekey.work", {"n": n}) for n in range(1000)]
    for _ in range(20):
        enqueue_many(clear)
    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        enqueue_jobs(5)
    params = {"ids": [NEW], "cap": 100}
    for table in (rekey_sql.JOBS, rekey_sql.CHECKPOINTS):
        nodes = _plan_nodes(rekey_sql.unknown_statement(table), params)
        assert any(node.get("Index Name") == "workhorse_job_encrypted_idx" for node in nodes), (table.name, nodes)
        assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "workhorse_job"]
    with override_settings(WORKHORSE_ENCRYPTION=AFTER):
        (warning,) = check_encryption_keys_needed(databases=["default"])
        assert "(at least 5)" in warning.msg


def test_the_check_skips_a_database_not_migrated_yet_and_leaves_its_connection_usable(monkeypatch):
    missing = rekey_sql.Table("workhorse_not_migrated", "", "TRUE", "t.id", (rekey_sql.Slot("value", "t.value", ""),))
    monkeypatch.setattr(rekey_sql, "TABLES", (missing,))
    with override_settings(WORKHORSE_ENCRYPTION=AFTER):
        assert check_encryption_keys_needed(databases=["default"]) == []
    assert Job.objects.count() == 0


def test_the_check_is_silent_without_encrypted_values_and_with_a_malformed_setting():
    enqueue("tests.rekey.work", {"n": 1})
    assert check_encryption_keys_needed(databases=["default"]) == []
    with override_settings(WORKHORSE_ENCRYPTION={"keys": {}}):
        assert check_encryption_keys_needed(databases=["default"]) == []


# -- --batch bounds -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1", "10000"])
def test_batch_takes_its_bounds(text):
    assert batch_size(text) == int(text)
    with override_settings(WORKHORSE_ENCRYPTION=BEFORE):
        enqueue_jobs(3)
    with override_settings(WORKHORSE_ENCRYPTION=ROTATING):
        status, out, _ = rekey("--batch", text)
    assert status == 0 and summary(out)["workhorse_job"].startswith("3 re-encrypted")


@pytest.mark.parametrize("text", ["0", "10001", "x"])
def test_batch_out_of_bounds_is_an_error_with_exit_status_2(text, capsys):
    from django.core.management import ManagementUtility

    with pytest.raises(SystemExit) as caught:
        ManagementUtility(["manage.py", "workhorse_rekey", "--batch", text]).execute()
    assert caught.value.code == 2
    assert "argument --batch: must be an integer in 1..10000" in capsys.readouterr().err
