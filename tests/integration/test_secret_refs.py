"""SecretRef through the engine (issue 12, item 6): the reference is what is stored,
hashed and previewed; only the dispatching worker resolves it; a missing secret is a
terminal refusal before any send. Only references the contract declares resolve
(issue 19, item 11)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client

from effect_broker.domain.contracts import parse_contracts
from effect_broker.domain.errors import (
    InvalidSecretRefError,
    PayloadConflictError,
    SecretRefNotDeclaredError,
)
from effect_broker.domain.records import EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectEvent
from effect_broker.services import runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.services.secrets import SecretSource
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from tests.integration.engine.harness import CONTRACTS, TOOLS, Bench

SECRET = "sk_live_the_real_secret_4242"
#: What the bench's contracts declare for every tenant in the tests below.
DECLARED = [
    "env:STRIPE_KEY",
    "env:A",
    "env:B",
    "env:GONE",
    "env:K",
    "file:card-token",
    "file:theirs",
]


def declaring(refs: list[str], extra: str = "") -> str:
    """The bench's contracts, each declaring ``refs`` (and ``extra`` TOML lines)."""
    head = f"[[contract]]\nsecrets = {json.dumps(refs)}\n{extra}"
    return CONTRACTS.replace("[[contract]]\n", head)


@pytest.fixture
def bench(bench: Bench) -> Iterator[Bench]:
    registry = parse_contracts(declaring(DECLARED), source="secret-refs")
    with runtime.override(registry=registry):
        yield replace(bench, registry=registry)


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
    # The reason reaches the tenant (its history): it names no server path.
    reason = (
        EffectEvent.objects.filter(effect_id=refused.effect_id)
        .order_by("-sequence")[0]
        .metadata["reason"]
    )
    assert "the file theirs in this tenant's secrets directory cannot be read" in reason
    assert str(tmp_path) not in reason
    assert "/" not in reason


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


def post_effect(key: str, arguments: dict[str, object], operation_key: str):  # type: ignore[no-untyped-def]
    return Client().post(
        "/v1/effects",
        data=json.dumps(
            {
                "operation_key": operation_key,
                "tool": TOOLS[SafetyClass.UNSAFE],
                "arguments": arguments,
            }
        ),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


def test_an_undeclared_reference_is_refused_at_submit_the_same_whether_or_not_it_exists(
    bench: Bench,
) -> None:
    # Given a worker that holds PRESENT and not ABSENT, neither declared by the contract
    from effect_broker.models import EffectIntent

    key = create_tenant("prober")[1]
    worker = SecretSource(environ={"EFFECT_BROKER_SECRET_PRESENT": SECRET})
    answers = []
    with runtime.override(secrets=worker):
        for name in ("PRESENT", "ABSENT"):
            # When a tenant names each in its arguments
            response = post_effect(
                key, {"order": "1", "token": {"$secret": f"env:{name}"}}, "order:1:v1"
            )
            answers.append((response.status_code, response.json()))
    # Then both are refused at submit with one answer that does not tell them apart
    (status, body), (other_status, other_body) = answers
    assert status == other_status == 422
    assert body == other_body
    assert body["code"] == SecretRefNotDeclaredError.code
    assert body["field"] == "arguments.token"
    assert body["detail"] == (
        "arguments.token: this secret reference is not declared by contract "
        "t.unsafe@1 for this tenant; nothing was written"
    )
    assert SECRET not in json.dumps(body)
    # And nothing was written or scheduled
    assert EffectIntent.objects.count() == 0
    assert bench.scheduler.requests == []


def test_a_reference_declared_for_one_tenant_resolves_for_it_and_no_other(
    bench: Bench,
) -> None:
    # Given a contract declaring env:ACME_KEY for tenant "acme" only
    text = declaring([], extra='tenant_secrets = { acme = ["env:ACME_KEY"] }\n')
    registry = parse_contracts(text, source="per-tenant")
    capture = Capturing(bench, SafetyClass.UNSAFE)
    acme_key = create_tenant("acme")[1]
    other_key = create_tenant("globex")[1]
    arguments = {"order": "2", "token": {"$secret": "env:ACME_KEY"}}
    worker = SecretSource(environ={"EFFECT_BROKER_SECRET_ACME_KEY": SECRET})
    with runtime.override(registry=registry, secrets=worker):
        # When each tenant submits the same reference
        accepted = post_effect(acme_key, arguments, "order:2:v1")
        refused = post_effect(other_key, arguments, "order:2:v1")
        assert accepted.status_code == 202, accepted.content
        done = dispatch(accepted.json()["effect_id"], worker="w1")
    # Then acme's effect got the value; the other tenant was refused at submit
    assert done.status is EffectStatus.SUCCEEDED
    assert capture.seen == [{"order": "2", "token": SECRET}]
    assert refused.status_code == 422
    assert refused.json()["code"] == SecretRefNotDeclaredError.code


def test_dispatch_refuses_a_stored_reference_its_pinned_contract_does_not_declare(
    bench: Bench,
) -> None:
    # Given an effect stored while its contract declared env:STRIPE_KEY
    record = submit_with_ref(bench, "order:8", "env:STRIPE_KEY", SafetyClass.UNSAFE)
    # When the same contract version no longer declares it at dispatch
    registry = parse_contracts(CONTRACTS, source="undeclared")
    worker = SecretSource(environ={"EFFECT_BROKER_SECRET_STRIPE_KEY": SECRET})
    with runtime.override(registry=registry, secrets=worker):
        done = dispatch(record.effect.effect_id, worker="w1")
    # Then nothing is sent and the effect fails before any attempt
    assert done.status is EffectStatus.FAILED_FINAL
    assert bench.adapters[SafetyClass.UNSAFE].sends == []
    assert done.attempt_count == 0
    last = EffectEvent.objects.filter(effect_id=done.effect_id).order_by("-sequence")[0]
    assert last.event_type == "secret_unavailable"
    assert SecretRefNotDeclaredError.code in last.metadata["reason"]
