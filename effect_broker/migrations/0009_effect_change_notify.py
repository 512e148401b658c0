"""NOTIFY on every transition: a waiter (the MCP proxy tools) wakes on a state change.

Issue 10, item 3: a proxy tool call waits a bounded time for a terminal state, woken by
PostgreSQL LISTEN/NOTIFY rather than by polling. Every transition of an effect appends
exactly one row to ``effect_events`` in the statement that changes the row (STYLE,
"one write path"), so a trigger there sees every change - fenced CAS writes, the
reservation, operator resolutions - without touching any write path's SQL.

The payload is the effect id only: never arguments, results or keys. NOTIFY is
transactional: it is delivered at commit, and dropped with a rollback, so a waiter never
wakes to a change that did not happen. Waiters re-read the row on waking; the payload
only says which effect to re-read.
"""

from django.db import migrations

CHANNEL = "effect_broker_effect_changed"

CREATE = f"""
CREATE FUNCTION effect_broker_notify_effect_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', NEW.effect_id::text);
    RETURN NULL;
END;
$$;
CREATE TRIGGER effect_events_notify_changed
AFTER INSERT ON effect_events
FOR EACH ROW EXECUTE FUNCTION effect_broker_notify_effect_changed();
"""

DROP = """
DROP TRIGGER IF EXISTS effect_events_notify_changed ON effect_events;
DROP FUNCTION IF EXISTS effect_broker_notify_effect_changed();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("effect_broker", "0008_outcome_in_doubt"),
    ]

    operations = [migrations.RunSQL(CREATE, DROP)]
