"""The fence as a database fact (issue 9, defect 9; docs/fencing.md).

0002's row triggers refuse an intent update that does not bump ``version`` by one, but
a write that bumps it and appends no event (``queryset.update(version=F(...) + 1)``,
raw SQL) passed, and so did a receipt inserted with no transition to SUCCEEDED. Two
constraint triggers close that, checked at COMMIT (DEFERRABLE INITIALLY DEFERRED), so
the store's one-statement writes - and several of them inside a caller's transaction -
are judged on what they commit, not on the order of rows inside a statement:

* every intent row inserted or updated must have the event whose ``sequence`` (and
  ``version``) is the row's ``version``; for an update, that event's ``new_status``
  must be the row's ``status`` (an insert is checked for the event only: the bench
  seeder, examples/bench/scale.py, loads synthetic ledgers whose rows sit in many
  statuses over one ``reserved`` event);
* a receipt row must belong to an effect that has an event into ``succeeded`` and
  whose ``receipt_id`` names this receipt.

Existing rows are not re-checked by this migration; only writes from now on are.
Who can still bypass it (table owner, superuser, ``session_replication_role =
replica``, TRUNCATE) is written down in docs/fencing.md.

The model options make the fenced manager Django's base manager too (the manager that
``Model._base_manager`` and Django's internals use), so no ORM path gets a plain one.
"""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION effect_broker_intent_has_its_event() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    event_status text;
BEGIN
    SELECT e.new_status INTO event_status
    FROM effect_events e
    WHERE e.effect_id = NEW.id AND e.sequence = NEW.version AND e.version = NEW.version;
    IF NOT FOUND THEN
        RAISE EXCEPTION
            'effect-broker: effect % is at version % but has no event at sequence %',
            NEW.id, NEW.version, NEW.version
            USING ERRCODE = 'EB004',
                  HINT = 'ledger rows are written only by effect_broker.store';
    END IF;
    IF TG_OP = 'UPDATE' AND event_status IS DISTINCT FROM NEW.status THEN
        RAISE EXCEPTION
            'effect-broker: effect % is % but its event % says %',
            NEW.id, NEW.status, NEW.version, event_status
            USING ERRCODE = 'EB004',
                  HINT = 'ledger rows are written only by effect_broker.store';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER effect_intents_event_at_version
    AFTER INSERT OR UPDATE ON effect_intents
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION effect_broker_intent_has_its_event();

CREATE OR REPLACE FUNCTION effect_broker_receipt_of_a_success() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    named uuid;
BEGIN
    SELECT i.receipt_id INTO named FROM effect_intents i WHERE i.id = NEW.effect_id;
    IF named IS DISTINCT FROM NEW.id OR NOT EXISTS (
        SELECT 1 FROM effect_events e
        WHERE e.effect_id = NEW.effect_id AND e.new_status = 'succeeded'
    ) THEN
        RAISE EXCEPTION
            'effect-broker: receipt % is refused: effect % never reached succeeded '
            'with it (its receipt_id is %)', NEW.id, NEW.effect_id, named
            USING ERRCODE = 'EB005',
                  HINT = 'a receipt commits only with the transition to succeeded';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER effect_receipts_of_a_success
    AFTER INSERT ON effect_receipts
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION effect_broker_receipt_of_a_success();
"""

REVERSE = r"""
DROP TRIGGER IF EXISTS effect_receipts_of_a_success ON effect_receipts;
DROP TRIGGER IF EXISTS effect_intents_event_at_version ON effect_intents;
DROP FUNCTION IF EXISTS effect_broker_receipt_of_a_success();
DROP FUNCTION IF EXISTS effect_broker_intent_has_its_event();
"""


class Migration(migrations.Migration):
    dependencies = [("effect_broker", "0005_operator_authority")]

    operations = [
        migrations.AlterModelOptions(
            name="effectattempt",
            options={"base_manager_name": "objects"},
        ),
        migrations.AlterModelOptions(
            name="effectevent",
            options={"base_manager_name": "objects", "ordering": ["effect", "sequence"]},
        ),
        migrations.AlterModelOptions(
            name="effectintent",
            options={
                "base_manager_name": "objects",
                # Kept from 0005 (AlterModelOptions replaces the whole set).
                "permissions": [
                    ("resolve_effect", "Can resolve or fork effects as an operator")
                ],
            },
        ),
        migrations.AlterModelOptions(
            name="effectreceipt",
            options={"base_manager_name": "objects"},
        ),
        migrations.AlterModelOptions(
            name="stalewrite",
            options={"base_manager_name": "objects"},
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
