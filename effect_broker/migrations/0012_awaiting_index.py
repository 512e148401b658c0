"""A partial index over effects waiting on an unknown outcome or an operator.

The /metrics scrape counts them and finds the oldest per contract on every scrape
(effect_broker.observability.collectors); with this index that reads the waiting rows
only, not the whole ledger. Built CONCURRENTLY so a large ledger keeps taking writes.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("effect_broker", "0011_trace_context"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="effectintent",
            index=models.Index(
                condition=models.Q(status__in=["outcome_unknown", "manual_review"]),
                fields=["status"],
                name="effect_intents_awaiting_idx",
            ),
        ),
    ]
