"""The admin login throttle's counter (effect_broker.admin_login; issue 19, item 12)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("effect_broker", "0014_notify_settling_changes_only"),
    ]

    operations = [
        migrations.CreateModel(
            name="AdminLoginFailure",
            fields=[
                (
                    "key",
                    models.CharField(max_length=64, primary_key=True, serialize=False),
                ),
                ("failures", models.PositiveIntegerField()),
                ("window_started_at", models.DateTimeField()),
            ],
            options={
                "db_table": "admin_login_failures",
            },
        ),
    ]
