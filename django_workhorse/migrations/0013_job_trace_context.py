"""Jobs keep the W3C trace context of the enqueue that created them (the otel extra).

A nullable column without a default: adding it rewrites nothing, whatever the table's size. It is
not part of the request fingerprint, so a replay from another trace still replays.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("workhorse", "0012_http_records")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                editable=False,
                help_text="The W3C trace context (traceparent, tracestate) of the traced enqueue that created the job.",
                null=True,
            ),
        ),
    ]
