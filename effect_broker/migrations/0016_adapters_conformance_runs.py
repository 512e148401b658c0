"""``conformance_runs``: what ``contracts conform`` proved, per contract version
(issue 22, item 1). Read by ``doctor`` and by the start of ``worker`` / ``serve``."""

import uuid

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("effect_broker", "0015_tenancy_admin_login_failures"),
    ]

    operations = [
        migrations.CreateModel(
            name="ConformanceRun",
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
                ("contract_name", models.CharField(max_length=200)),
                ("contract_version", models.CharField(max_length=100)),
                ("safety", models.CharField(max_length=32)),
                ("target", models.CharField(max_length=300)),
                ("passed", models.BooleanField()),
                ("rows", models.JSONField()),
                ("effect_requests", models.IntegerField()),
                ("ran_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "db_table": "conformance_runs",
                "indexes": [
                    models.Index(
                        fields=["contract_name", "contract_version", "-ran_at"],
                        name="conformance_runs_latest",
                    )
                ],
            },
        ),
    ]
