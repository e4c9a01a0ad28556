"""Validate 0021's foreign key and CHECK constraints on workhorse_job and build the workflow steps'
indexes, while enqueues and workers go on.

VALIDATE CONSTRAINT reads the table under a lock that lets reads and writes through; CREATE INDEX
CONCURRENTLY builds each partial index (workflow steps only: plain jobs never enter them) without
blocking writes. Neither can share a transaction with 0021's ALTER TABLE, hence ``atomic = False``.
The unique index of a step's original job is a UniqueConstraint in the models, which Django would
build in a transaction, so it is created here by hand (SeparateDatabaseAndState). An interrupted
build leaves an invalid index, which the reverse migration (DROP INDEX CONCURRENTLY IF EXISTS) removes.
"""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

VALIDATED = [
    "workhorse_job_workflow_id_db4f9aa3_fk_workhorse_workflow_id",
    "workhorse_job_status_check",
    "workhorse_job_workflow_step_check",
    "workhorse_job_pending_parents_check",
    "workhorse_job_waiting_check",
]


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("workhorse", "0021_workflows")]

    operations = [
        *(
            migrations.RunSQL(f"ALTER TABLE workhorse_job VALIDATE CONSTRAINT {name}", migrations.RunSQL.noop)
            for name in VALIDATED
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    "CREATE UNIQUE INDEX CONCURRENTLY workhorse_job_workflow_step_uniq "
                    "ON workhorse_job (workflow_id, step_name) WHERE root_id IS NULL AND workflow_id IS NOT NULL",
                    "DROP INDEX CONCURRENTLY IF EXISTS workhorse_job_workflow_step_uniq",
                ),
            ],
            state_operations=[
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("root_id__isnull", True), ("workflow__isnull", False)),
                        fields=("workflow", "step_name"),
                        name="workhorse_job_workflow_step_uniq",
                    ),
                ),
            ],
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("workflow__isnull", False)),
                fields=["workflow", "step_name", "id"],
                name="workhorse_job_workflow_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "waiting")),
                fields=["workflow"],
                include=("queue",),
                name="workhorse_job_waiting_idx",
            ),
        ),
    ]
