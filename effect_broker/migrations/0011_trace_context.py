"""The submit span's W3C traceparent on each effect (issue 11, item 6).

A nullable column without a default: PostgreSQL adds it without rewriting the table.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("effect_broker", "0010_preview_hides_names"),
    ]

    operations = [
        migrations.AddField(
            model_name="effectintent",
            name="trace_context",
            field=models.TextField(blank=True, null=True),
        ),
    ]
