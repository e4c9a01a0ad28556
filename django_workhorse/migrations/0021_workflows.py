"""Workflows (decision 0022): the workflow table, the dependency edges between jobs, and on
workhorse_job the step's workflow and name, its count of unsatisfied parents, the awaited flag and
the status ``waiting``.

Nothing here rewrites or scans workhorse_job: its new columns are NULL or have a constant default,
and its new foreign key and CHECK constraints (the status check replaced to allow ``waiting``) are
added NOT VALID, as 0016 does (a brief lock, no scan). 0022 validates them and builds the step
indexes concurrently, outside this transaction, while enqueues and workers go on.

The foreign keys to a job or a workflow delete with it (ON DELETE CASCADE), as 0007 sets for the
job's other children, keeping Django's names and its DEFERRABLE INITIALLY DEFERRED; the models say
DO_NOTHING, since Django 5.2 cannot declare a database-level cascade.
"""

from __future__ import annotations

import django.db.models.deletion
import django.db.models.functions.text
import django.db.models.lookups
from django.db import migrations, models

# Django's names for the foreign keys (as it would create them), kept so that later migrations
# Django writes find them as its own.
CHILD_FK = "workhorse_job_dependency_child_id_34a0508a_fk_workhorse_job_id"
PARENT_FK = "workhorse_job_dependency_parent_id_7eea35bf_fk_workhorse_job_id"
WORKFLOW_FK = "workhorse_job_workflow_id_db4f9aa3_fk_workhorse_workflow_id"
OLD_STATUSES = "'queued', 'running', 'succeeded', 'dead', 'cancelled'"
STATUSES = "'waiting', 'queued', 'running', 'succeeded', 'dead', 'cancelled'"


def _edge(column: str, name: str) -> str:
    return (
        f"ADD COLUMN {column} bigint NOT NULL CONSTRAINT {name} REFERENCES workhorse_job (id) "
        "ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED"
    )


def _octet_length(field: str) -> models.Func:
    return models.Func(models.F(field), function="octet_length", output_field=models.IntegerField())


class Migration(migrations.Migration):
    dependencies = [
        ("workhorse", "0020_rate_budget_reserved_until"),
    ]

    operations = [
        migrations.CreateModel(
            name="Workflow",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=200)),
                ("fingerprint", models.BinaryField(help_text="The SHA-256 of the graph.", max_length=32)),
                ("scope", models.CharField(blank=True, max_length=256, null=True)),
                ("key_hash", models.BinaryField(blank=True, max_length=32, null=True)),
                ("key_preview", models.CharField(blank=True, max_length=16, null=True)),
                ("step_count", models.IntegerField()),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "db_table": "workhorse_workflow",
                "constraints": [
                    models.CheckConstraint(
                        condition=django.db.models.lookups.GreaterThanOrEqual(
                            django.db.models.functions.text.Length("name"), 1
                        ),
                        name="workhorse_workflow_name_check",
                    ),
                    models.CheckConstraint(
                        condition=django.db.models.lookups.Exact(_octet_length("fingerprint"), 32),
                        name="workhorse_workflow_fingerprint_check",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(
                                ("key_hash__isnull", True), ("key_preview__isnull", True), ("scope__isnull", True)
                            ),
                            models.Q(
                                ("key_hash__isnull", False), ("key_preview__isnull", False), ("scope__isnull", False)
                            ),
                            _connector="OR",
                        ),
                        name="workhorse_workflow_key_check",
                    ),
                    models.CheckConstraint(
                        condition=django.db.models.lookups.Exact(_octet_length("key_hash"), 32),
                        name="workhorse_workflow_key_hash_check",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            django.db.models.lookups.GreaterThanOrEqual(_octet_length("scope"), 1),
                            django.db.models.lookups.LessThanOrEqual(_octet_length("scope"), 256),
                        ),
                        name="workhorse_workflow_scope_check",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("step_count__gte", 1), ("step_count__lte", 10000)),
                        name="workhorse_workflow_step_count_check",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="JobDependency",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("allow_failure", models.BooleanField(default=False)),
            ],
            options={"verbose_name_plural": "job dependencies", "db_table": "workhorse_job_dependency"},
        ),
        # Django would add these foreign keys without the cascade; the table is new and empty, so
        # they are valid at once.
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f"ALTER TABLE workhorse_job_dependency {_edge('child_id', CHILD_FK)}, {_edge('parent_id', PARENT_FK)}",
                    "ALTER TABLE workhorse_job_dependency DROP COLUMN child_id, DROP COLUMN parent_id",
                ),
            ],
            state_operations=[
                migrations.AddField(
                    model_name="jobdependency",
                    name="child",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="parent_edges",
                        to="workhorse.job",
                    ),
                ),
                migrations.AddField(
                    model_name="jobdependency",
                    name="parent",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="child_edges",
                        to="workhorse.job",
                    ),
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="jobdependency",
            index=models.Index(fields=["parent"], include=("child", "allow_failure"), name="workhorse_dep_parent_idx"),
        ),
        migrations.AddConstraint(
            model_name="jobdependency",
            constraint=models.UniqueConstraint(
                fields=("child", "parent"), name="workhorse_dependency_child_parent_uniq"
            ),
        ),
        migrations.AddConstraint(
            model_name="jobdependency",
            constraint=models.CheckConstraint(
                condition=models.Q(("child", models.F("parent")), _negated=True),
                name="workhorse_dependency_not_self_check",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="awaited",
            field=models.BooleanField(db_default=False, editable=False, help_text="A caller waits for its outcome."),
        ),
        migrations.AddField(
            model_name="job",
            name="pending_parents",
            field=models.IntegerField(
                db_default=0,
                editable=False,
                help_text="Dependencies not yet satisfied; the step waits while it is above 0.",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="step_name",
            field=models.CharField(blank=True, editable=False, max_length=200, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("waiting", "Waiting"),
                    ("queued", "Queued"),
                    ("running", "Running"),
                    ("succeeded", "Succeeded"),
                    ("dead", "Dead"),
                    ("cancelled", "Cancelled"),
                ],
                default="queued",
                max_length=16,
            ),
        ),
        # NOT VALID: checked for every new or updated row at once, the existing ones by 0022.
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE workhorse_job ADD COLUMN workflow_id bigint NULL, "
                    f"ADD CONSTRAINT {WORKFLOW_FK} FOREIGN KEY (workflow_id) REFERENCES workhorse_workflow (id) "
                    "ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED NOT VALID",
                    "ALTER TABLE workhorse_job DROP COLUMN workflow_id",
                ),
                # Back: the old check, validated (so a waiting job makes going back fail, not the table wrong).
                migrations.RunSQL(
                    "ALTER TABLE workhorse_job DROP CONSTRAINT workhorse_job_status_check, "
                    f"ADD CONSTRAINT workhorse_job_status_check CHECK (status IN ({STATUSES})) NOT VALID",
                    "ALTER TABLE workhorse_job DROP CONSTRAINT workhorse_job_status_check, "
                    f"ADD CONSTRAINT workhorse_job_status_check CHECK (status IN ({OLD_STATUSES}))",
                ),
                migrations.RunSQL(
                    "ALTER TABLE workhorse_job ADD CONSTRAINT workhorse_job_workflow_step_check "
                    "CHECK ((step_name IS NULL AND workflow_id IS NULL) "
                    "OR (step_name IS NOT NULL AND workflow_id IS NOT NULL)) NOT VALID",
                    "ALTER TABLE workhorse_job DROP CONSTRAINT workhorse_job_workflow_step_check",
                ),
                migrations.RunSQL(
                    "ALTER TABLE workhorse_job ADD CONSTRAINT workhorse_job_pending_parents_check "
                    "CHECK (pending_parents >= 0 AND pending_parents <= 10000) NOT VALID",
                    "ALTER TABLE workhorse_job DROP CONSTRAINT workhorse_job_pending_parents_check",
                ),
                migrations.RunSQL(
                    "ALTER TABLE workhorse_job ADD CONSTRAINT workhorse_job_waiting_check "
                    "CHECK (NOT (status = 'waiting') OR pending_parents > 0) NOT VALID",
                    "ALTER TABLE workhorse_job DROP CONSTRAINT workhorse_job_waiting_check",
                ),
            ],
            state_operations=[
                migrations.AddField(
                    model_name="job",
                    name="workflow",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        editable=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="jobs",
                        to="workhorse.workflow",
                    ),
                ),
                migrations.RemoveConstraint(model_name="job", name="workhorse_job_status_check"),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            ("status__in", ["waiting", "queued", "running", "succeeded", "dead", "cancelled"])
                        ),
                        name="workhorse_job_status_check",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("step_name__isnull", True), ("workflow__isnull", True)),
                            models.Q(("step_name__isnull", False), ("workflow__isnull", False)),
                            _connector="OR",
                        ),
                        name="workhorse_job_workflow_step_check",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("pending_parents__gte", 0), ("pending_parents__lte", 10000)),
                        name="workhorse_job_pending_parents_check",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("status", "waiting"), _negated=True), ("pending_parents__gt", 0), _connector="OR"
                        ),
                        name="workhorse_job_waiting_check",
                    ),
                ),
            ],
        ),
    ]
