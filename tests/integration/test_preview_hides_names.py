"""A preview shows only contract-allowed fields; other names are counted, never shown
(issue 12, item 5), for new effects and, through migration 0010, for stored ones."""

from __future__ import annotations

import importlib
import json

import pytest
from django.db import connection

from effect_broker.domain.records import EffectRequest
from effect_broker.models import EffectIntent
from effect_broker.services.submission import submit

migration = importlib.import_module("effect_broker.migrations.0010_preview_hides_names")

pytestmark = pytest.mark.django_db


def test_a_secret_used_as_an_argument_name_never_reaches_the_preview(tenant) -> None:
    record = submit(
        tenant,
        EffectRequest(
            operation_key="order:9:charge:v1",
            tool="charge_card",
            arguments={
                "order": "9",
                "amount_minor": 100,
                "currency": "EUR",
                "4111111111111111": "x",
            },
        ),
    ).effect
    preview = EffectIntent.objects.get(pk=record.effect_id).arguments_preview
    assert preview == {
        "order": "9",
        "amount_minor": 100,
        "currency": "EUR",
        "$hidden_fields": 1,
    }
    with connection.cursor() as cur:
        cur.execute("SELECT row_to_json(e)::text FROM effect_intents e")
        (dump,) = cur.fetchone()
    assert "4111111111111111" not in dump


def test_migration_0010_rewrites_a_stored_preview_to_show_less(tenant) -> None:
    record = submit(
        tenant,
        EffectRequest(
            operation_key="order:10:charge:v1",
            tool="charge_card",
            arguments={"order": "10", "amount_minor": 100, "currency": "EUR"},
        ),
    ).effect
    old_style = {
        "order": "10",
        "amount_minor": 100,
        "4111111111111111": "<redacted>",
        "card_cvc": "<redacted>",
    }
    with connection.cursor() as cur:
        # The test runs in one transaction: settle the submit's deferred checks first,
        # as its own commit would have (ALTER TABLE refuses with checks pending).
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        # A row as written before 0010 (the fence is off only for this statement).
        cur.execute("ALTER TABLE effect_intents DISABLE TRIGGER effect_intents_fence")
        cur.execute(
            "UPDATE effect_intents SET arguments_preview = %s::jsonb WHERE id = %s",
            [json.dumps(old_style), record.effect_id],
        )
        cur.execute("ALTER TABLE effect_intents ENABLE TRIGGER effect_intents_fence")
        for statement in migration.FORWARD:
            cur.execute(statement)
    preview = EffectIntent.objects.get(pk=record.effect_id).arguments_preview
    assert preview == {"order": "10", "amount_minor": 100, "$hidden_fields": 2}


def test_migration_0010_leaves_a_preview_without_redactions_alone(tenant) -> None:
    record = submit(
        tenant,
        EffectRequest(
            operation_key="order:11:charge:v1",
            tool="charge_card",
            arguments={"order": "11", "amount_minor": 100, "currency": "EUR"},
        ),
    ).effect
    before = EffectIntent.objects.get(pk=record.effect_id)
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for statement in migration.FORWARD:
            cur.execute(statement)
    after = EffectIntent.objects.get(pk=record.effect_id)
    assert after.arguments_preview == before.arguments_preview
    assert after.version == before.version
