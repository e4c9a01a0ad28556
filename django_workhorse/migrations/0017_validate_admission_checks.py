"""Validate 0016's CHECK constraints on workhorse_job and build the index of held jobs, while
enqueues and workers go on.

VALIDATE CONSTRAINT reads the table under a lock that lets reads and writes through; CREATE
INDEX CONCURRENTLY builds the partial index of jobs a circuit breaker holds (few rows) without
blocking writes. Neither can share a transaction with 0016's ALTER TABLE, hence a migration of its
own with ``atomic = False``; an interrupted index build leaves an invalid index, which the reverse
migration (DROP INDEX CONCURRENTLY IF EXISTS) removes.
"""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("workhorse", "0016_admission_snoozes_queues_breakers")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE workhorse_job VALIDATE CONSTRAINT workhorse_job_snoozes_check",
            migrations.RunSQL.noop,
        ),
        migrations.RunSQL(
            "ALTER TABLE workhorse_job VALIDATE CONSTRAINT workhorse_job_breaker_key_check",
            migrations.RunSQL.noop,
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("held_since__isnull", False), ("status", "queued")),
                fields=["breaker_key"],
                name="workhorse_job_breaker_held_idx",
            ),
        ),
    ]
