"""NOTIFY only the changes a waiter can stop on (issue 13: commits per effect).

Migration 0009 notified every ``effect_events`` insert. PostgreSQL (15 here) wakes
every backend of the database that LISTENs on any channel for each NOTIFY, and each
wake-up is a committed transaction on that backend: every worker's procrastinate
listener paid one for the claim (-> dispatching) and one for the outcome of every
effect, whether or not anyone waited. The only listener of this channel
(``services.awaiting``) stops waiting only in a final state or one only an operator
can leave (``settled_for_caller``); a claim, a retry or a lease extension never ends
a wait, and its waiter re-reads anyway at the next notification, re-check or
deadline. So only changes into these states notify now.

``tests/unit/test_change_notify_states.py`` fails if ``settled_for_caller`` can be
true in a state this list lacks.
"""

from django.db import migrations

#: Every status a waiter may stop in (a superset of ``awaiting.settled_for_caller``:
#: outcome_unknown settles only for unsafe effects, and notifies for all).
SETTLING_STATUSES = (
    "succeeded",
    "failed_final",
    "compensated",
    "manual_review",
    "outcome_unknown",
)
_IN = ", ".join(f"'{status}'" for status in SETTLING_STATUSES)

FORWARD = f"""
DROP TRIGGER IF EXISTS effect_events_notify_changed ON effect_events;
CREATE TRIGGER effect_events_notify_changed
AFTER INSERT ON effect_events
FOR EACH ROW WHEN (NEW.new_status IN ({_IN}))
EXECUTE FUNCTION effect_broker_notify_effect_changed();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS effect_events_notify_changed ON effect_events;
CREATE TRIGGER effect_events_notify_changed
AFTER INSERT ON effect_events
FOR EACH ROW EXECUTE FUNCTION effect_broker_notify_effect_changed();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("effect_broker", "0013_fetch_plan_statistics"),
    ]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
