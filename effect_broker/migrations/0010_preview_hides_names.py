"""Previews stop showing the names of arguments the contract does not allow (issue 12).

Before, a preview kept every top-level key and redacted the values it did not allow,
so a key that was itself sensitive (``{"4111111111111111": "x"}``) was shown and a
caller could make the preview as large as its arguments. Now a preview holds only
contract-allowed fields, and ``"$hidden_fields": N`` counts the rest
(``domain.payload_crypto.redacted_preview``).

This migration rewrites stored previews the same way: every member whose value is
the redaction marker is dropped and counted. The old row does not say which redacted
members the contract allowed (an allowed field with a long value was also redacted),
so those are counted too: the rewrite only ever shows less.

PRIVILEGED MAINTENANCE, as in 0007: a preview column is not part of an intent's
binding, but every intent update must bump the version with an event (0002, 0006)
and receipts are append-only (0002), so the fence, its commit-time check and the
receipts' append-only trigger are disabled for the rewrite and enabled again before
the transaction commits; no other session sees them off. One UPDATE per table.
"""

from __future__ import annotations

from django.db import migrations

MARKER = '"<redacted>"'

_REWRITE = """
UPDATE {table} AS t SET {column} = h.preview
FROM (
    SELECT id,
           COALESCE(jsonb_object_agg(k, v) FILTER (WHERE v <> '{marker}'::jsonb),
                    '{{}}'::jsonb)
           || jsonb_build_object(
                  '$hidden_fields',
                  count(*) FILTER (WHERE v = '{marker}'::jsonb)
                  + COALESCE(max(({column} ->> '$hidden_fields')::int), 0))
           AS preview
    FROM {table}, jsonb_each({column}) AS e(k, v)
    WHERE k <> '$hidden_fields'
      AND {column} @? '$.* ? (@ == "<redacted>")'
    GROUP BY id
) AS h
WHERE t.id = h.id
"""

_TRIGGERS = (
    ("effect_intents", "effect_intents_fence"),
    ("effect_intents", "effect_intents_event_at_version"),
    ("effect_receipts", "effect_receipts_append_only"),
)


def _sql(verb: str) -> list[str]:
    return [f"ALTER TABLE {table} {verb} TRIGGER {name}" for table, name in _TRIGGERS]


FORWARD = [
    *_sql("DISABLE"),
    _REWRITE.format(table="effect_intents", column="arguments_preview", marker=MARKER),
    _REWRITE.format(table="effect_receipts", column="result_preview", marker=MARKER),
    *_sql("ENABLE"),
]


class Migration(migrations.Migration):
    dependencies = [("effect_broker", "0009_effect_change_notify")]

    operations = [migrations.RunSQL(FORWARD, migrations.RunSQL.noop)]
