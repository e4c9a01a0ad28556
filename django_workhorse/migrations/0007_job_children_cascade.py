"""Rows that belong to a job (bindings, events, checkpoints, redrive records) go with it:
ON DELETE CASCADE on their foreign keys, so deleting jobs is one statement, in SQL and in the ORM.

The models say ``on_delete=DO_NOTHING`` (the database does the work, and the ORM collects nothing);
Django 5.2 cannot declare a database-level cascade, so the constraints are rewritten here, keeping
Django's names and its DEFERRABLE INITIALLY DEFERRED. Each foreign key is swapped in one
ALTER TABLE (a failure leaves it as it was) and added NOT VALID, then validated in its own
transaction, so the long scan holds no lock that blocks writes.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

# (table, column, Django's constraint name): the foreign keys of the job's children.
FOREIGN_KEYS = [
    ("workhorse_binding", "job_id", "workhorse_binding_job_id_e29b7542_fk_workhorse_job_id"),
    ("workhorse_job_event", "job_id", "workhorse_job_event_job_id_749d6908_fk_workhorse_job_id"),
    ("workhorse_checkpoint", "job_id", "workhorse_checkpoint_job_id_5b1b5f28_fk_workhorse_job_id"),
    ("workhorse_redrive", "source_id", "workhorse_redrive_source_id_b8c966c8_fk_workhorse_job_id"),
    ("workhorse_redrive", "new_job_id", "workhorse_redrive_new_job_id_c068f853_fk_workhorse_job_id"),
]
MODEL_FIELDS = [
    ("idempotencybinding", "job", "bindings"),
    ("jobevent", "job", "events"),
    ("checkpoint", "job", "checkpoints"),
    ("redrive", "source", "redrives"),
    ("redrive", "new_job", "redriven_from"),
]


def _swap(table: str, column: str, name: str, on_delete: str) -> str:
    return (
        f"ALTER TABLE {table} DROP CONSTRAINT {name}, ADD CONSTRAINT {name} FOREIGN KEY ({column}) "
        f"REFERENCES workhorse_job (id){on_delete} DEFERRABLE INITIALLY DEFERRED NOT VALID"
    )


def _rewrite(on_delete: str, undo: str) -> list[migrations.RunSQL]:
    """Swap every foreign key to ``on_delete`` (reversed by swapping it to ``undo``), then validate it."""
    return [
        migrations.RunSQL(
            [_swap(table, column, name, on_delete), f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}"],
            reverse_sql=[_swap(table, column, name, undo), f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}"],
        )
        for table, column, name in FOREIGN_KEYS
    ]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("workhorse", "0006_datetime_bounds")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=_rewrite(" ON DELETE CASCADE", ""),
            state_operations=[
                migrations.AlterField(
                    model_name=model,
                    name=field,
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.DO_NOTHING, related_name=related, to="workhorse.job"
                    ),
                )
                for model, field, related in MODEL_FIELDS
            ],
        )
    ]
