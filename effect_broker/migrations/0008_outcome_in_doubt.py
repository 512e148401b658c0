"""``outcome_in_doubt``: set when an attempt may have reached the target unanswered.

Issue "correctness at the edges", defect 3: once any attempt may have left, no later
refusal, terminal answer or retry exhaustion may end the effect ``failed_final`` (the
target may hold the charge). ``db_default`` so the reservation statement, which does
not name the column, writes FALSE; adding a column with a constant default does not
rewrite the table.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("effect_broker", "0007_keyed_request_hash"),
    ]

    operations = [
        migrations.AddField(
            model_name="effectintent",
            name="outcome_in_doubt",
            field=models.BooleanField(db_default=False),
        ),
    ]
