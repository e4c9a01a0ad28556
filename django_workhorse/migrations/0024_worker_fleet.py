"""The worker registry learns what a fleet needs (issue 28): each worker's job types (its claims
take only those), what kind of process a row is (a worker, a supervisor, a supervisor's child), a
child's supervisor, and the state the process last reported. Nullable or constant defaults: no
table rewrite, and a worker of an older version still registers."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workhorse", "0023_ready_event"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerrecord",
            name="job_types",
            field=models.JSONField(
                blank=True,
                help_text="The job types this worker has handlers for: its claims take only those (NULL: not said).",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="workerrecord",
            name="kind",
            field=models.CharField(
                choices=[("worker", "Worker"), ("supervisor", "Supervisor"), ("child", "Child")],
                db_default="worker",
                default="worker",
                max_length=20,
            ),
        ),
        migrations.AddField(
            model_name="workerrecord",
            name="state",
            field=models.CharField(
                db_default="running",
                default="running",
                help_text="running, draining, recycling or waiting for the database, as the process last said.",
                max_length=20,
            ),
        ),
        migrations.AddField(
            model_name="workerrecord",
            name="supervisor",
            field=models.CharField(
                blank=True, db_default="", default="", help_text="A child's supervisor (its name).", max_length=255
            ),
        ),
    ]
