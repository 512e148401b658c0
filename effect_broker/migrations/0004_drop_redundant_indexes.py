"""Drop indexes another index already leads with (tenant on intents, effect on events
and attempts), and keep only rows with a next action in the due index: every fenced
write updates each index of effect_intents, so fewer indexes is less work per write
(docs/benchmarks.md).

The three foreign-key indexes are dropped with plain SQL while the model state records
``db_index=False``: Django's own AlterField would drop and re-create each foreign-key
constraint, re-validating every existing row under a lock that blocks writes. Every
index change runs CONCURRENTLY (hence ``atomic = False``), so a live ledger keeps
accepting writes while it migrates.
"""

import django.db.models.deletion
from django.contrib.postgres.operations import (
    AddIndexConcurrently,
    RemoveIndexConcurrently,
)
from django.db import migrations, models

# (table, column, index name Django gave the foreign key's index in 0001)
_FK_INDEXES = (
    ("effect_attempts", "effect_id", "effect_attempts_effect_id_1d18b6ad"),
    ("effect_events", "effect_id", "effect_events_effect_id_d87cf13c"),
    ("effect_intents", "tenant_id", "effect_intents_tenant_id_db0320a3"),
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("effect_broker", "0003_lease_index"),
    ]

    operations = [
        RemoveIndexConcurrently(
            model_name="effectintent",
            name="effect_intents_due_idx",
        ),
        AddIndexConcurrently(
            model_name="effectintent",
            index=models.Index(
                condition=models.Q(("next_action_at__isnull", False)),
                fields=["status", "next_action_at"],
                name="effect_intents_due_idx",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    sql=f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"',
                    reverse_sql=(
                        f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{name}" '
                        f'ON "{table}" ("{column}")'
                    ),
                )
                for table, column, name in _FK_INDEXES
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="effectattempt",
                    name="effect",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="attempts",
                        to="effect_broker.effectintent",
                    ),
                ),
                migrations.AlterField(
                    model_name="effectevent",
                    name="effect",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="events",
                        to="effect_broker.effectintent",
                    ),
                ),
                migrations.AlterField(
                    model_name="effectintent",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="effects",
                        to="effect_broker.tenant",
                    ),
                ),
            ],
        ),
    ]
