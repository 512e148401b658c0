"""Operator controls (issue 24, item 7): ``dispatch_pauses`` and ``contract_limits``.

A pause row is an audit record: never deleted, resumed at most once, and nothing but
its resume is ever written to it (a trigger refuses anything else, so raw SQL cannot
rewrite who paused what or why). Row triggers do not fire on TRUNCATE, which stays
the privileged escape hatch (test flush), as for the ledger (migration 0002).

Numbered 0018 after 0017 (the approval state, issue 24, items 1-6, built alongside);
it depends only on 0016 until both are merged.
"""

import uuid

import django.db.models.deletion
from django.db import migrations, models

PAUSE_AUDIT = r"""
CREATE OR REPLACE FUNCTION effect_broker_pause_audit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'effect-broker: DELETE on dispatch_pauses is refused: a pause '
            'is an audit record; resume it instead' USING ERRCODE = 'EB001';
    END IF;
    IF OLD.resumed_at IS NOT NULL THEN
        RAISE EXCEPTION 'effect-broker: pause % is already resumed', OLD.id
            USING ERRCODE = 'EB001';
    END IF;
    IF NEW.resumed_at IS NULL OR NEW.resumed_by IS NULL
       OR (NEW.id, NEW.tool, NEW.contract_name, NEW.contract_version, NEW.tenant_id,
           NEW.reason, NEW.paused_by, NEW.paused_at)
          IS DISTINCT FROM
          (OLD.id, OLD.tool, OLD.contract_name, OLD.contract_version, OLD.tenant_id,
           OLD.reason, OLD.paused_by, OLD.paused_at)
    THEN
        RAISE EXCEPTION 'effect-broker: a pause is only ever resumed (by someone), '
            'never rewritten' USING ERRCODE = 'EB003';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER dispatch_pauses_audit
    BEFORE UPDATE OR DELETE ON dispatch_pauses
    FOR EACH ROW EXECUTE FUNCTION effect_broker_pause_audit();
"""

PAUSE_AUDIT_REVERSE = r"""
DROP TRIGGER IF EXISTS dispatch_pauses_audit ON dispatch_pauses;
DROP FUNCTION IF EXISTS effect_broker_pause_audit();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("effect_broker", "0017_awaiting_approval"),
    ]

    operations = [
        migrations.CreateModel(
            name="ContractLimitState",
            fields=[
                ("contract_name", models.TextField(primary_key=True, serialize=False)),
                ("tokens", models.FloatField()),
                ("refilled_at", models.DateTimeField()),
                ("next_wake_at", models.DateTimeField()),
            ],
            options={
                "db_table": "contract_limits",
            },
        ),
        migrations.CreateModel(
            name="DispatchPause",
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
                ("tool", models.TextField(blank=True, null=True)),
                ("contract_name", models.TextField(blank=True, null=True)),
                ("contract_version", models.TextField(blank=True, null=True)),
                ("reason", models.TextField()),
                ("paused_by", models.TextField()),
                ("paused_at", models.DateTimeField()),
                ("resumed_by", models.TextField(blank=True, null=True)),
                ("resumed_at", models.DateTimeField(blank=True, null=True)),
                ("resume_reason", models.TextField(blank=True, default="")),
                (
                    "tenant",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="dispatch_pauses",
                        to="effect_broker.tenant",
                    ),
                ),
            ],
            options={
                "db_table": "dispatch_pauses",
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("resumed_at__isnull", True)),
                        fields=("tool", "contract_name", "contract_version", "tenant"),
                        name="dispatch_pauses_one_active_per_scope",
                        nulls_distinct=False,
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("tool__isnull", False),
                            ("contract_name__isnull", False),
                            ("tenant__isnull", False),
                            _connector="OR",
                        ),
                        name="dispatch_pauses_has_scope",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("contract_version__isnull", True),
                            ("contract_name__isnull", False),
                            _connector="OR",
                        ),
                        name="dispatch_pauses_version_needs_name",
                    ),
                ],
            },
        ),
        migrations.RunSQL(PAUSE_AUDIT, PAUSE_AUDIT_REVERSE),
    ]
