"""Operator authority (issue 9, defect 5): the ``resolve_effect`` permission, operator
tokens owned by staff users, and the append-only fork link between two effects.

The fork link is ledger evidence like events and receipts, so the trigger of 0002
refuses to update or delete it.
"""

import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("effect_broker", "0004_drop_redundant_indexes"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="effectintent",
            options={
                "permissions": [
                    ("resolve_effect", "Can resolve or fork effects as an operator")
                ]
            },
        ),
        migrations.CreateModel(
            name="EffectFork",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("operator", models.TextField()),
                ("created_at", models.DateTimeField()),
                (
                    "new_effect",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="forked_from",
                        to="effect_broker.effectintent",
                    ),
                ),
                (
                    "old_effect",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="fork",
                        to="effect_broker.effectintent",
                    ),
                ),
            ],
            options={
                "db_table": "effect_forks",
            },
        ),
        migrations.CreateModel(
            name="OperatorToken",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=uuid.uuid4,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("name", models.CharField(max_length=200)),
                ("token_hash", models.CharField(max_length=64, unique=True)),
                ("scope", models.CharField(default="operator", max_length=64)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="operator_tokens",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "db_table": "operator_tokens",
            },
        ),
        migrations.RunSQL(
            sql=(
                "CREATE TRIGGER effect_forks_append_only "
                "BEFORE UPDATE OR DELETE ON effect_forks "
                "FOR EACH ROW EXECUTE FUNCTION effect_broker_refuse_change();"
            ),
            reverse_sql="DROP TRIGGER IF EXISTS effect_forks_append_only ON effect_forks;",
        ),
    ]
