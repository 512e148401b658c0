"""Operator surfaces over HTTP: the REST endpoints (problem+json on every refusal) and
the Django admin actions and form. Both are thin glue over services.resolution (and
services.inspection for the history and receipt reads)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectEvent, EffectReceipt, Tenant
from effect_broker.services.dispatch import dispatch
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from effect_broker.store import load_effect_for_worker
from tests.integration.engine.harness import TOOLS, Bench

S = EffectStatus
PROOF = {"charge_id": "ch_9", "checked": "dashboard"}


@pytest.fixture
def caller(bench: Bench) -> tuple[Tenant, str]:
    """A tenant with an API key, on the bench runtime (simulated targets)."""
    return create_tenant("ops-api")


def effect(
    bench: Bench, tenant: Tenant, safety: SafetyClass, fault: Fault | None = None
) -> EffectRecord:
    """Reserve an effect for ``tenant``; with a fault, dispatch it into that fault."""
    key = f"op:{uuid.uuid4()}"
    record = submit(
        tenant,
        EffectRequest(
            operation_key=key, tool=TOOLS[safety], arguments={"amount_minor": 5, "k": key}
        ),
    ).effect
    if fault is None:
        return record
    bench.targets[safety].inject(fault)
    return dispatch(record.effect_id, worker="w1")


def call(
    client: Client, method: str, key: str | None, path: str, body: Any = None
) -> Any:
    headers: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    if method == "get":
        return client.get(path, **headers)
    return client.post(
        path, data=json.dumps(body or {}), content_type="application/json", **headers
    )


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert (body["status"], body["code"]) == (status, code)
    return body


def resolve_body(resolution: str, **extra: Any) -> dict[str, Any]:
    return {"resolution": resolution, "reason": "checked", "operator": "ann", **extra}


def state(record: EffectRecord) -> tuple[S, int]:
    now = load_effect_for_worker(record.effect_id)
    return now.status, now.version


# --- REST -------------------------------------------------------------------------


def test_resolve_succeeded_then_receipt_and_history(client, bench, caller) -> None:
    tenant, key = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    base = f"/v1/effects/{record.effect_id}"
    resolved = call(
        client,
        "post",
        key,
        f"{base}/resolve",
        resolve_body("succeeded", evidence=PROOF, external_id="ch_9"),
    )
    assert resolved.status_code == 200, resolved.content
    assert resolved.json()["status"] == "succeeded"
    receipt = call(client, "get", key, f"{base}/receipt")
    assert receipt.status_code == 200
    assert receipt.json()["result"] == PROOF
    assert receipt.json()["external_id"] == "ch_9"
    assert receipt.json()["receipt_id"] == resolved.json()["receipt_id"]
    history = call(client, "get", key, f"{base}/history").json()
    assert history["chain_verified"] is True
    assert [e["event_type"] for e in history["events"]][-2:] == [
        "operator_review_started",
        "resolved_succeeded",
    ]
    assert history["events"][-1]["actor"] == "ann"
    assert "charge_id" not in str(history["events"][-1]["metadata"])
    past = call(client, "get", key, f"{base}/history?at_sequence=3").json()
    assert (past["status"], past["at_sequence"], len(past["events"])) == (
        "outcome_unknown",
        3,
        3,
    )


def test_not_committed_requeues_over_http(client, bench, caller) -> None:
    tenant, key = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    body = resolve_body("not_committed", evidence={"export_rows": 0})
    response = call(client, "post", key, f"/v1/effects/{record.effect_id}/resolve", body)
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "prepared"
    assert bench.scheduler.requests[-1] == ("dispatch", record.effect_id, None)


def test_unsafe_not_committed_without_evidence_is_a_400_and_changes_nothing(
    client, bench, caller
) -> None:
    tenant, key = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    before = state(record)
    problem = assert_problem(
        call(
            client,
            "post",
            key,
            f"/v1/effects/{record.effect_id}/resolve",
            resolve_body("not_committed"),
        ),
        400,
        "invalid_request",
    )
    assert "proof of non-commit is required" in problem["detail"]
    assert state(record) == before


@pytest.mark.parametrize(
    "body",
    [
        resolve_body("retry_anyway", evidence=PROOF),
        {"resolution": "failed", "reason": "x"},
        {"resolution": "succeeded", "operator": "ann", "evidence": PROOF},
    ],
    ids=["no-retry-anyway", "missing-operator", "missing-reason"],
)
def test_malformed_resolutions_are_422(client, bench, caller, body) -> None:
    tenant, key = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    before = state(record)
    path = f"/v1/effects/{record.effect_id}/resolve"
    assert_problem(call(client, "post", key, path, body), 422, "invalid_request")
    assert state(record) == before


def test_resolving_a_prepared_effect_is_a_409(client, bench, caller) -> None:
    tenant, key = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE)
    problem = assert_problem(
        call(
            client,
            "post",
            key,
            f"/v1/effects/{record.effect_id}/resolve",
            resolve_body("failed"),
        ),
        409,
        "illegal_transition",
    )
    assert problem["refusal"] == "not_resolvable"
    assert state(record) == (S.PREPARED, 1)


def test_reconcile_defers_refuses_unsafe_and_is_a_no_op_otherwise(
    client, bench, caller
) -> None:
    tenant, key = caller
    idempotent = effect(bench, tenant, SafetyClass.IDEMPOTENT, Fault.LOSE_RESPONSE)
    deferred = call(client, "post", key, f"/v1/effects/{idempotent.effect_id}/reconcile")
    assert deferred.status_code == 202
    assert deferred.json()["reconcile_requested"] is True
    assert bench.scheduler.requests[-1] == ("reconcile", idempotent.effect_id, None)

    unsafe = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    jobs = len(bench.scheduler.requests)
    problem = assert_problem(
        call(client, "post", key, f"/v1/effects/{unsafe.effect_id}/reconcile"),
        409,
        "illegal_transition",
    )
    assert problem["refusal"] == "operator_required"
    assert "operator must resolve" in problem["detail"]
    assert len(bench.scheduler.requests) == jobs
    assert bench.targets[SafetyClass.UNSAFE].requests == 1

    prepared = effect(bench, tenant, SafetyClass.IDEMPOTENT)
    idle = call(client, "post", key, f"/v1/effects/{prepared.effect_id}/reconcile")
    assert idle.status_code == 200
    assert (idle.json()["reconcile_requested"], idle.json()["status"]) == (
        False,
        "prepared",
    )


def test_receipt_and_history_errors(client, bench, caller) -> None:
    tenant, key = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    base = f"/v1/effects/{record.effect_id}"
    problem = assert_problem(
        call(client, "get", key, f"{base}/receipt"), 404, "effect_not_found"
    )
    assert "no receipt" in problem["detail"]
    assert_problem(
        call(client, "get", key, f"{base}/history?at_sequence=99"),
        400,
        "invalid_request",
    )
    assert_problem(
        call(client, "get", key, f"{base}/history?at_sequence=abc"),
        422,
        "invalid_request",
    )


def test_operator_endpoints_are_tenant_scoped_and_authenticated(
    client, bench, caller
) -> None:
    tenant, _ = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    before = state(record)
    other_key = create_tenant("ops-other")[1]
    base = f"/v1/effects/{record.effect_id}"
    requests = [
        ("get", f"{base}/history", None),
        ("get", f"{base}/receipt", None),
        ("post", f"{base}/reconcile", None),
        ("post", f"{base}/resolve", resolve_body("succeeded", evidence=PROOF)),
        ("post", "/v1/effects/not-a-uuid/resolve", resolve_body("failed")),
    ]
    for method, path, body in requests:
        assert_problem(
            call(client, method, other_key, path, body), 404, "effect_not_found"
        )
        assert_problem(call(client, method, None, path, body), 401, "unauthenticated")
    assert state(record) == before


# --- admin ------------------------------------------------------------------------

CHANGELIST = "admin:effect_broker_effectintent_changelist"


def test_admin_list_flags_effects_that_need_an_operator(admin_client, bench) -> None:
    effect(bench, bench.tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "Needs operator" in page
    assert "resolve…" in page
    assert "Request reconciliation" in page
    assert "Resolve: mark failed" in page


def test_admin_bulk_reconcile_defers_and_refuses_unsafe(admin_client, bench) -> None:
    idempotent = effect(bench, bench.tenant, SafetyClass.IDEMPOTENT, Fault.LOSE_RESPONSE)
    unsafe = effect(bench, bench.tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    response = admin_client.post(
        reverse(CHANGELIST),
        {
            "action": "request_reconciliation",
            "_selected_action": [idempotent.effect_id, unsafe.effect_id],
            "index": "0",
        },
        follow=True,
    )
    text = response.content.decode()
    assert "Reconciliation requested for 1." in text
    assert "operator must resolve" in text
    reconciles = [eid for kind, eid, _ in bench.scheduler.requests if kind == "reconcile"]
    assert idempotent.effect_id in reconciles
    assert unsafe.effect_id not in reconciles


def test_admin_mark_failed_asks_for_a_reason_first(admin_client, bench) -> None:
    record = effect(bench, bench.tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    selected = {"action": "resolve_mark_failed", "_selected_action": [record.effect_id]}
    ask = admin_client.post(reverse(CHANGELIST), {**selected, "index": "0"})
    assert ask.status_code == 200
    assert "reason" in ask.content.decode()
    assert state(record)[0] is S.OUTCOME_UNKNOWN
    done = admin_client.post(
        reverse(CHANGELIST),
        {**selected, "apply": "yes", "reason": "refunded by hand"},
        follow=True,
    )
    assert "Marked 1 effect(s) failed." in done.content.decode()
    assert state(record)[0] is S.FAILED_FINAL
    last = EffectEvent.objects.filter(effect_id=record.effect_id).last()
    assert last is not None
    assert (last.event_type, last.actor) == ("resolved_failed", "admin")


def test_admin_resolve_form_needs_evidence_then_settles_with_a_receipt(
    admin_client, bench
) -> None:
    record = effect(bench, bench.tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    url = reverse("admin:effect_broker_effectintent_resolve", args=[record.effect_id])
    assert admin_client.get(url).status_code == 200
    refused = admin_client.post(
        url, {"resolution": "not_committed", "reason": "nothing there", "evidence": ""}
    )
    assert refused.status_code == 200
    assert "[invalid_request]" in refused.content.decode()
    assert state(record)[0] is S.OUTCOME_UNKNOWN
    bad_json = admin_client.post(
        url, {"resolution": "succeeded", "reason": "seen", "evidence": "{nope"}
    )
    assert bad_json.status_code == 200
    assert state(record)[0] is S.OUTCOME_UNKNOWN
    done = admin_client.post(
        url,
        {
            "resolution": "succeeded",
            "reason": "seen in dashboard",
            "evidence": '{"charge_id": "ch_9"}',
            "external_id": "ch_9",
        },
    )
    assert done.status_code == 302
    assert state(record)[0] is S.SUCCEEDED
    assert EffectReceipt.objects.get(effect_id=record.effect_id).external_id == "ch_9"


def test_admin_resolution_needs_the_change_permission(client, bench) -> None:
    record = effect(bench, bench.tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_effectintent"))
    client.force_login(viewer)
    page = client.get(reverse(CHANGELIST)).content.decode()
    assert "Resolve: mark failed" not in page
    url = reverse("admin:effect_broker_effectintent_resolve", args=[record.effect_id])
    assert client.get(url).status_code == 403
    forged = client.post(
        reverse(CHANGELIST),
        {
            "action": "resolve_mark_failed",
            "_selected_action": [record.effect_id],
            "apply": "yes",
            "reason": "x",
        },
    )
    assert forged.status_code in {200, 302}
    assert state(record)[0] is S.OUTCOME_UNKNOWN
