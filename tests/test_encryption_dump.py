"""No plaintext at rest (decision 0024): a dump of every table of the app, after encrypted jobs ran
and an encrypted once() result and @idempotent response were stored, holds none of it."""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps
from django.db import connection

from django_workhorse.encryption.jobs import CHECKPOINT_PREFIX, RESULT, open_value, opened_json
from django_workhorse.models import Checkpoint, EffectRecord, Job, JobEvent, JobStatus
from tests.encrypted_rows import FRAGMENTS, SCOPE, SECRET, store_encrypted_rows
from tests.encryption import encryption_setting

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def keys(settings: Any) -> dict[str, Any]:
    setting = encryption_setting()
    settings.WORKHORSE_ENCRYPTION = setting
    return setting


def app_tables() -> list[str]:
    """Every table of the app's models (proxies share their concrete model's table)."""
    models = apps.get_app_config("workhorse").get_models()
    return sorted({model._meta.db_table for model in models if not model._meta.proxy})


def dump(table: str) -> str:
    """Every row of ``table`` as PostgreSQL renders it in JSON (``bytea`` as hex)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT row_to_json(t)::text FROM {connection.ops.quote_name(table)} t")  # noqa: S608
        return "\n".join(row for (row,) in cursor.fetchall())


def test_no_table_of_the_app_holds_the_plaintext_of_encrypted_values(keys):
    rows = store_encrypted_rows()

    # What was stored is there, sealed, and opens to the plaintext.
    statuses = dict(Job.objects.filter(pk__in=[rows.succeeded, rows.dead, rows.staged]).values_list("pk", "status"))
    assert statuses == {
        rows.succeeded: JobStatus.SUCCEEDED,
        rows.dead: JobStatus.DEAD,
        rows.staged: JobStatus.SUCCEEDED,
    }
    succeeded = Job.objects.get(pk=rows.succeeded)
    salt = bytes(succeeded.cipher_salt)
    assert opened_json(succeeded.result, field=RESULT, salt=salt, job_id=succeeded.pk) == {"echo": {"secret": SECRET}}
    staged = Job.objects.get(pk=rows.staged)
    checkpoint = Checkpoint.objects.get(job=staged, name="charge")
    field = CHECKPOINT_PREFIX + "charge"
    assert SECRET in open_value(checkpoint.value, field=field, salt=bytes(staged.cipher_salt), job_id=staged.pk)
    assert (
        JobEvent.objects.filter(job_id__in=[rows.dead, rows.staged, rows.failed], details__has_key="error").count() >= 3
    )
    assert (
        EffectRecord.objects.filter(scope=SCOPE).count() == 1 and EffectRecord.objects.filter(kind="http").count() == 1
    )

    tables = app_tables()
    assert {"workhorse_job", "workhorse_job_event", "workhorse_checkpoint", "workhorse_effect"} <= set(tables)
    dumped = {table: dump(table) for table in tables}
    assert dumped["workhorse_job"] and dumped["workhorse_effect"] and dumped["workhorse_checkpoint"]
    for table, text in dumped.items():
        for fragment in FRAGMENTS:
            assert fragment not in text, f"{fragment!r} in {table}"
            assert fragment.encode().hex() not in text, f"{fragment!r} in a bytea column of {table}"
