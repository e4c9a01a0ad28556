"""Vacuum the job table by how much of it is dead, not by how much history it holds.

A claim reads ``workhorse_job_ready_idx`` from its start. Every job claimed since the last vacuum
leaves a dead entry there (and in ``workhorse_job_lease_idx`` once it finishes), so a claim reads
about one more index page per 200 jobs processed until VACUUM removes them. PostgreSQL's default
triggers autovacuum when 20% of the table is dead: with 10 million finished jobs in the table,
after about a million more jobs, by which time each claim reads some 5,000 pages instead of 16.
Here autovacuum runs once 10,000 row versions are dead, whatever the size of the history, and always
cleans the indexes: with few dead rows in a large table, VACUUM otherwise skips index cleanup
(INDEX_CLEANUP AUTO), which would leave the claim's dead entries where they are.

Measured (docs/benchmarks.md, "Flat as tables grow"): with 10M finished jobs, 200,000 jobs
processed took a claim from 16 to 1,027 pages; VACUUM of the table took 0.9 s and brought it back
to 15. Operators may set their own values with ALTER TABLE workhorse_job SET (...); ALTER TABLE
... SET of these options takes a SHARE UPDATE EXCLUSIVE lock, which does not block reads or writes.
"""

from __future__ import annotations

from django.db import migrations

OPTIONS = "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000, vacuum_index_cleanup = on"


class Migration(migrations.Migration):
    dependencies = [("workhorse", "0009_lease")]

    operations = [
        migrations.RunSQL(
            f"ALTER TABLE workhorse_job SET ({OPTIONS})",
            "ALTER TABLE workhorse_job RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, "
            "vacuum_index_cleanup)",
        )
    ]
