"""The fair queues' ready index: (queue, partition_key, priority DESC, run_at, id) over queued jobs
with a partition key, for the loose index scan a fair claim does over the keys with ready work.

Built with CREATE INDEX CONCURRENTLY (as 0014 and 0017), so enqueues and workers go on while it is
built; hence ``atomic = False``. An interrupted build leaves an invalid index, which the reverse
migration (DROP INDEX CONCURRENTLY IF EXISTS) removes.
"""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("workhorse", "0018_rate_limits_fair_share")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.F("partition_key"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                models.F("id"),
                condition=models.Q(("partition_key__isnull", False), ("status", "queued")),
                name="workhorse_job_fair_ready_idx",
            ),
        ),
    ]
