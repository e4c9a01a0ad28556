"""A partial index of the encrypted jobs (decision 0024), by id.

Check workhorse.W005 and ``workhorse_rekey``'s census look for stored values sealed under a given
key id; every such value belongs to an encrypted job (``cipher_salt`` set) or to its events and
checkpoints. Without an index they read the whole job history (0.33 s per million clear jobs at
every ``migrate``); with this one they read the encrypted jobs only, nothing in a project that
encrypts nothing. Clear jobs never enter it.

Built with CREATE INDEX CONCURRENTLY, so enqueues and workers go on while it is built: PostgreSQL
still reads the whole table once to build it. Such a build cannot run in a transaction, hence
``atomic = False``; if it is interrupted it leaves an invalid index, which the reverse migration
(DROP INDEX CONCURRENTLY IF EXISTS) removes.
"""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("workhorse", "0025_job_cipher_salt")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(cipher_salt__isnull=False), fields=["id"], name="workhorse_job_encrypted_idx"
            ),
        ),
    ]
