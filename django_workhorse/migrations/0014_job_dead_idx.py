"""A partial index of the dead letters, by queue and newest first.

The gauges and the dashboard count dead jobs by queue; the only index over them was the finished
jobs' (every terminal job: the whole history), so the count read every finished job. This one
holds the dead letters only: small, and written only when a job dies.

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
    dependencies = [("workhorse", "0013_job_trace_context")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(status="dead"), fields=["queue", "-finished_at"], name="workhorse_job_dead_idx"
            ),
        ),
    ]
