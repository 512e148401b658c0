"""Database-side guards: append-only receipts/events, fenced intents, closed attempts.

The ORM already refuses these writes (effect_broker.models); the triggers make raw SQL
refuse them too, so the guarantee does not depend on every caller using our code. Row
triggers do not fire on TRUNCATE, which stays the privileged escape hatch (test flush).
"""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION effect_broker_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'effect-broker: % on % is refused: rows are append-only',
        TG_OP, TG_TABLE_NAME USING ERRCODE = 'EB001';
END $$;

CREATE TRIGGER effect_receipts_append_only
    BEFORE UPDATE OR DELETE ON effect_receipts
    FOR EACH ROW EXECUTE FUNCTION effect_broker_refuse_change();
CREATE TRIGGER effect_events_append_only
    BEFORE UPDATE OR DELETE ON effect_events
    FOR EACH ROW EXECUTE FUNCTION effect_broker_refuse_change();
CREATE TRIGGER effect_stale_writes_append_only
    BEFORE UPDATE OR DELETE ON effect_stale_writes
    FOR EACH ROW EXECUTE FUNCTION effect_broker_refuse_change();

CREATE OR REPLACE FUNCTION effect_broker_fence_intent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'effect-broker: DELETE on effect_intents is refused'
            USING ERRCODE = 'EB001';
    END IF;
    IF NEW.version IS DISTINCT FROM OLD.version + 1 THEN
        RAISE EXCEPTION
            'effect-broker: update of effect % must bump version by one (% -> %)',
            OLD.id, OLD.version, NEW.version USING ERRCODE = 'EB002';
    END IF;
    -- The binding of an intent (spec: payload binding) never changes after reservation.
    IF (NEW.id, NEW.tenant_id, NEW.operation_key, NEW.tool, NEW.request_hash,
        NEW.arguments_ciphertext, NEW.arguments_key_id, NEW.contract_name,
        NEW.contract_version, NEW.safety_class, NEW.downstream_key, NEW.created_at)
       IS DISTINCT FROM
       (OLD.id, OLD.tenant_id, OLD.operation_key, OLD.tool, OLD.request_hash,
        OLD.arguments_ciphertext, OLD.arguments_key_id, OLD.contract_name,
        OLD.contract_version, OLD.safety_class, OLD.downstream_key, OLD.created_at)
    THEN
        RAISE EXCEPTION 'effect-broker: the binding of effect % is immutable', OLD.id
            USING ERRCODE = 'EB003';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER effect_intents_fence
    BEFORE UPDATE OR DELETE ON effect_intents
    FOR EACH ROW EXECUTE FUNCTION effect_broker_fence_intent();

CREATE OR REPLACE FUNCTION effect_broker_close_attempt_once() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'effect-broker: DELETE on effect_attempts is refused'
            USING ERRCODE = 'EB001';
    END IF;
    IF OLD.ended_at IS NOT NULL THEN
        RAISE EXCEPTION 'effect-broker: attempt % is closed', OLD.id USING ERRCODE = 'EB001';
    END IF;
    IF (NEW.id, NEW.effect_id, NEW.ordinal, NEW.worker, NEW.fencing_version, NEW.started_at)
       IS DISTINCT FROM
       (OLD.id, OLD.effect_id, OLD.ordinal, OLD.worker, OLD.fencing_version, OLD.started_at)
    THEN
        RAISE EXCEPTION 'effect-broker: attempt % identity is immutable', OLD.id
            USING ERRCODE = 'EB003';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER effect_attempts_close_once
    BEFORE UPDATE OR DELETE ON effect_attempts
    FOR EACH ROW EXECUTE FUNCTION effect_broker_close_attempt_once();
"""

REVERSE = r"""
DROP TRIGGER IF EXISTS effect_attempts_close_once ON effect_attempts;
DROP TRIGGER IF EXISTS effect_intents_fence ON effect_intents;
DROP TRIGGER IF EXISTS effect_stale_writes_append_only ON effect_stale_writes;
DROP TRIGGER IF EXISTS effect_events_append_only ON effect_events;
DROP TRIGGER IF EXISTS effect_receipts_append_only ON effect_receipts;
DROP FUNCTION IF EXISTS effect_broker_close_attempt_once();
DROP FUNCTION IF EXISTS effect_broker_fence_intent();
DROP FUNCTION IF EXISTS effect_broker_refuse_change();
"""


class Migration(migrations.Migration):
    dependencies = [("effect_broker", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
