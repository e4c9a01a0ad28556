"""A partial index of the dead letters, newest first, covering their queue.

The gauges and the dashboard count dead jobs by queue, and the dashboard lists the newest ten;
the only index over them was the finished jobs' (every terminal job: the whole history), so both
read finished jobs by the thousand to find the dead ones. This one holds the dead letters only:
small, written only when a job dies, and the count is read from it alone.

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
                condition=models.Q(status="dead"),
                fields=["-finished_at", "-id"],
                include=["queue"],
                name="workhorse_job_dead_idx",
            ),
        ),
    ]
