"""The ``awaiting_approval`` status (issue 24): its choice, its change notifications and
its rows in the waiting-effects index.

* ``status`` gains the choice ``awaiting_approval`` (an effect reserved for an
  operator's approval before anything is sent);
* an event into ``awaiting_approval`` NOTIFYs like the other states a waiter stops in
  (``services.awaiting.settled_for_caller``: only an operator moves it on), so an MCP
  proxy call answers "awaiting approval" at once instead of at its deadline;
* the partial index the /metrics scrape reads (0012) also holds the effects awaiting
  approval, whose count and oldest age it exports. Rebuilt CONCURRENTLY, so a large
  ledger keeps taking writes (hence a non-atomic migration).
"""

from django.contrib.postgres.operations import (
    AddIndexConcurrently,
    RemoveIndexConcurrently,
)
from django.db import migrations, models

#: Every status a waiter may stop in (0014's list plus ``awaiting_approval``).
SETTLING_STATUSES = (
    "succeeded",
    "failed_final",
    "compensated",
    "manual_review",
    "outcome_unknown",
    "awaiting_approval",
)
_PREVIOUS = SETTLING_STATUSES[:-1]


def _trigger(statuses: tuple[str, ...]) -> str:
    listed = ", ".join(f"'{status}'" for status in statuses)
    # One RunSQL text: the drop and the create are one implicit transaction.
    return f"""
DROP TRIGGER IF EXISTS effect_events_notify_changed ON effect_events;
CREATE TRIGGER effect_events_notify_changed
AFTER INSERT ON effect_events
FOR EACH ROW WHEN (NEW.new_status IN ({listed}))
EXECUTE FUNCTION effect_broker_notify_effect_changed();
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("effect_broker", "0016_adapters_conformance_runs"),
    ]

    operations = [
        migrations.AlterField(
            model_name="effectintent",
            name="status",
            field=models.CharField(
                choices=[
                    ("prepared", "prepared"),
                    ("dispatching", "dispatching"),
                    ("retryable", "retryable"),
                    ("outcome_unknown", "outcome_unknown"),
                    ("reconciling", "reconciling"),
                    ("succeeded", "succeeded"),
                    ("failed_final", "failed_final"),
                    ("manual_review", "manual_review"),
                    ("compensated", "compensated"),
                    ("awaiting_approval", "awaiting_approval"),
                ],
                max_length=20,
            ),
        ),
        migrations.RunSQL(_trigger(SETTLING_STATUSES), _trigger(_PREVIOUS)),
        RemoveIndexConcurrently(
            model_name="effectintent", name="effect_intents_awaiting_idx"
        ),
        AddIndexConcurrently(
            model_name="effectintent",
            index=models.Index(
                condition=models.Q(
                    status__in=["outcome_unknown", "manual_review", "awaiting_approval"]
                ),
                fields=["status"],
                name="effect_intents_awaiting_idx",
            ),
        ),
    ]
