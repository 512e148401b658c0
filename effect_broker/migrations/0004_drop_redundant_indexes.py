"""Drop indexes another index already leads with (tenant on intents, effect on events
and attempts), and keep only rows with a next action in the due index: every fenced
write updates each index of effect_intents, so fewer indexes is less work per write
(docs/benchmarks.md)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("effect_broker", "0003_lease_index"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="effectintent",
            name="effect_intents_due_idx",
        ),
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
        migrations.AddIndex(
            model_name="effectintent",
            index=models.Index(
                condition=models.Q(("next_action_at__isnull", False)),
                fields=["status", "next_action_at"],
                name="effect_intents_due_idx",
            ),
        ),
    ]
