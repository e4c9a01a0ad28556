"""Enqueue of one keyed request runs in a PL/pgSQL function (decision 0014).

The function looks the key up first and runs the statement that inserts only when the key is not
seen, so a replay costs one index probe. The body is this version's (``sql.enqueue``); every
``migrate`` replaces it with the installed code's body afterwards (``post_migrate``), so later
releases that change it need no migration. Reversing drops it.
"""

from __future__ import annotations

from django.db import migrations

from django_workhorse.sql.enqueue import CREATE_ENQUEUE_ONE_FUNCTION, DROP_ENQUEUE_ONE_FUNCTION


class Migration(migrations.Migration):
    dependencies = [("workhorse", "0010_job_vacuum_settings")]

    operations = [migrations.RunSQL(CREATE_ENQUEUE_ONE_FUNCTION, DROP_ENQUEUE_ONE_FUNCTION)]
