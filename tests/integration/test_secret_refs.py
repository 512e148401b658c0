"""SecretRef through the engine (issue 12, item 6): the reference is what is stored,
hashed and previewed; only the dispatching worker resolves it; a missing secret is a
terminal refusal before any send."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client

from effect_broker.domain.errors import InvalidSecretRefError, PayloadConflictError
from effect_broker.domain.records import EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectEvent
from effect_broker.services import runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.services.secrets import SecretSource
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from tests.integration.engine.harness import TOOLS, Bench

SECRET = "sk_live_the_real_secret_4242"


class Capturing:
    """Records the arguments each dispatch handed to the adapter."""

    def __init__(self, bench: Bench, safety: SafetyClass) -> None:
        self.seen: list[dict] = []
        adapter = bench.adapters[safety]
        inner_dispatch = adapter.dispatch

        def capture(request):  # type: ignore[no-untyped-def]
            self.seen.append(dict(request.arguments))
            return inner_dispatch(request)

        adapter.dispatch = capture  # type: ignore[method-assign]


def submit_with_ref(bench: Bench, key: str, ref: str, safety: SafetyClass):  # type: ignore[no-untyped-def]
    request = EffectRequest(
        operation_key=key,
        tool=TOOLS[safety],
        arguments={"amount_minor": 100, "api_key": {"$secret": ref}},
    )
    return submit(bench.tenant, request)


def test_the_ledger_holds_the_reference_and_the_adapter_gets_the_value(
    bench: Bench,
) -> None:
    capture = Capturing(bench, SafetyClass.IDEMPOTENT)
    with runtime.override(
        secrets=SecretSource(environ={"EFFECT_BROKER_SECRET_STRIPE_KEY": SECRET})
    ):
        effect = submit_with_ref(
            bench, "order:1:charge", "env:STRIPE_KEY", SafetyClass.IDEMPOTENT
        ).effect
        done = dispatch(effect.effect_id, worker="w1")
    assert done.status is EffectStatus.SUCCEEDED
    assert capture.seen == [{"amount_minor": 100, "api_key": SECRET}]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT string_agg(t::text, '') FROM ("
            " SELECT row_to_json(i) FROM effect_intents i UNION ALL"
            " SELECT row_to_json(e) FROM effect_events e UNION ALL"
            " SELECT row_to_json(a) FROM effect_attempts a UNION ALL"
            " SELECT row_to_json(r) FROM effect_receipts r) AS t"
        )
        (dump,) = cur.fetchone()
    assert SECRET not in dump


def test_the_request_hash_binds_the_reference_not_the_value(bench: Bench) -> None:
    first = submit_with_ref(bench, "order:2:charge", "env:A", SafetyClass.IDEMPOTENT)
    again = submit_with_ref(bench, "order:2:charge", "env:A", SafetyClass.IDEMPOTENT)
    assert again.replayed
    assert again.effect.effect_id == first.effect.effect_id
    with pytest.raises(PayloadConflictError):
        submit_with_ref(bench, "order:2:charge", "env:B", SafetyClass.IDEMPOTENT)


@pytest.mark.parametrize(
    "safety", [SafetyClass.IDEMPOTENT, SafetyClass.UNSAFE, SafetyClass.TRANSACTIONAL]
)
def test_a_missing_secret_fails_the_effect_before_anything_is_sent(
    bench: Bench, safety: SafetyClass
) -> None:
    with runtime.override(secrets=SecretSource(environ={})):
        effect = submit_with_ref(bench, f"order:3:{safety}", "env:GONE", safety).effect
        done = dispatch(effect.effect_id, worker="w1")
    assert done.status is EffectStatus.FAILED_FINAL
    assert bench.adapters[safety].sends == []
    assert done.attempt_count == 0
    event = EffectEvent.objects.filter(effect_id=effect.effect_id).order_by("-sequence")[
        0
    ]
    assert event.event_type == "secret_unavailable"
    assert "EFFECT_BROKER_SECRET_GONE is not set" in event.metadata["reason"]


def test_a_missing_secret_after_an_attempt_in_doubt_goes_to_an_operator(
    bench: Bench,
) -> None:
    # Idempotent, first attempt's answer lost: the redispatch must resolve the secret
    # again; if it is gone now, the first attempt may still have charged, so this is
    # manual review, never failed_final (issue 9, defect 3).
    record = submit_with_ref(bench, "order:4:charge", "env:K", SafetyClass.IDEMPOTENT)
    with runtime.override(
        secrets=SecretSource(environ={"EFFECT_BROKER_SECRET_K": SECRET})
    ):
        from effect_broker.adapters.simulated_adapter import Fault

        bench.targets[SafetyClass.IDEMPOTENT].inject(Fault.LOSE_RESPONSE)
        lost = dispatch(record.effect.effect_id, worker="w1")
    assert lost.status is EffectStatus.OUTCOME_UNKNOWN
    from effect_broker.services.reconcile import reconcile

    with runtime.override(secrets=SecretSource(environ={})):
        after = reconcile(lost.effect_id, worker="w2")
    assert after.status is EffectStatus.MANUAL_REVIEW
    last = EffectEvent.objects.filter(effect_id=after.effect_id).order_by("-sequence")[0]
    assert "secret_unavailable" in last.metadata["reason"]


def test_file_secrets_are_read_from_the_tenants_own_directory(
    bench: Bench, tmp_path: Path
) -> None:
    capture = Capturing(bench, SafetyClass.UNSAFE)
    mine = tmp_path / str(bench.tenant.id)
    mine.mkdir()
    (mine / "card-token").write_text("tok_mine\n")
    other = create_tenant("other")[0]
    (tmp_path / str(other.id)).mkdir()
    (tmp_path / str(other.id) / "theirs").write_text("tok_theirs")
    with runtime.override(secrets=SecretSource(directory=tmp_path)):
        ok = submit_with_ref(bench, "order:5", "file:card-token", SafetyClass.UNSAFE)
        assert dispatch(ok.effect.effect_id, worker="w1").status is EffectStatus.SUCCEEDED
        # Another tenant's file is not this tenant's secret: unavailable, not read.
        theirs = submit_with_ref(bench, "order:6", "file:theirs", SafetyClass.UNSAFE)
        refused = dispatch(theirs.effect.effect_id, worker="w1")
    assert capture.seen == [{"amount_minor": 100, "api_key": "tok_mine"}]
    assert refused.status is EffectStatus.FAILED_FINAL


def test_a_malformed_reference_is_a_422_naming_the_field_and_nothing_is_stored(
    db: None,
) -> None:
    key = create_tenant("refs")[1]
    response = Client().post(
        "/v1/effects",
        data=json.dumps(
            {
                "operation_key": "order:7:charge:v1",
                "tool": "charge_card",
                "arguments": {"order": "7", "token": {"$secret": "file:../../etc/x"}},
            }
        ),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 422
    assert response.json()["code"] == InvalidSecretRefError.code
    assert response.json()["field"] == "arguments.token"
    from effect_broker.models import EffectIntent

    assert EffectIntent.objects.count() == 0
