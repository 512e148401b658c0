"""Operator surfaces over HTTP: the REST endpoints (problem+json on every refusal) and
the Django admin actions and forms. Both are thin glue over services.resolution (and
services.inspection for the history and receipt reads).

Issue 9, defect 5: resolution and forks take an operator token (``ebop_...``, owned by
a staff user holding ``effect_broker.resolve_effect``); a tenant's API key is refused
there, and the operator in the events is the token's user, never a body field."""

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
from effect_broker.models import (
    EffectEvent,
    EffectFork,
    EffectIntent,
    EffectReceipt,
    Tenant,
)
from effect_broker.services import operators
from effect_broker.services.dispatch import dispatch
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from effect_broker.store import load_effect_for_worker
from tests.integration.conftest import make_operator
from tests.integration.engine.harness import TOOLS, Bench

S = EffectStatus
PROOF = {"source": "dashboard", "reference": "ch_9", "charge_id": "ch_9"}
NOT_THERE = {"source": "target export", "checked_at": "2026-12-03T21:00:00Z"}


@pytest.fixture
def caller(bench: Bench) -> tuple[Tenant, str]:
    """A tenant with an API key, on the bench runtime (simulated targets)."""
    return create_tenant("ops-api")


@pytest.fixture
def op_token(operator: Any) -> str:
    """An operator token owned by the staff user 'ann' (holds resolve_effect)."""
    return operators.create_token(operator.get_username())[1]


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
    return {"resolution": resolution, "reason": "checked", **extra}


def state(record: EffectRecord) -> tuple[S, int]:
    now = load_effect_for_worker(record.effect_id)
    return now.status, now.version


# --- REST -------------------------------------------------------------------------


def test_resolve_succeeded_then_receipt_and_history(
    client, bench, caller, op_token
) -> None:
    tenant, key = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    base = f"/v1/effects/{record.effect_id}"
    resolved = call(
        client,
        "post",
        op_token,
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


def test_not_committed_requeues_over_http(client, bench, caller, op_token) -> None:
    # A reconcilable effect whose settlement deadline has passed on the DB clock
    # (the bench moves it: send margin + the contract's 2 s bound, and then some)
    tenant, _ = caller
    record = effect(bench, tenant, SafetyClass.RECONCILABLE, Fault.TIMEOUT_BEFORE_COMMIT)
    bench.advance(10)
    body = resolve_body("not_committed", evidence=NOT_THERE)
    path = f"/v1/effects/{record.effect_id}/resolve"
    response = call(client, "post", op_token, path, body)
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "prepared"
    assert bench.scheduler.requests[-1] == ("dispatch", record.effect_id, None)


def test_unsafe_not_committed_is_a_409_and_nothing_is_requeued(
    client, bench, caller, op_token
) -> None:
    tenant, _ = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    before, jobs = state(record), len(bench.scheduler.requests)
    body = resolve_body("not_committed", evidence=NOT_THERE)
    path = f"/v1/effects/{record.effect_id}/resolve"
    problem = assert_problem(
        call(client, "post", op_token, path, body), 409, "illegal_transition"
    )
    assert problem["refusal"] == "unsafe_never_requeued"
    assert "fork it" in problem["detail"]
    assert state(record) == before
    assert len(bench.scheduler.requests) == jobs
    assert bench.targets[SafetyClass.UNSAFE].requests == 1


def test_unsafe_not_committed_without_evidence_is_a_400_and_changes_nothing(
    client, bench, caller, op_token
) -> None:
    tenant, _ = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    before = state(record)
    problem = assert_problem(
        call(
            client,
            "post",
            op_token,
            f"/v1/effects/{record.effect_id}/resolve",
            resolve_body("not_committed"),
        ),
        400,
        "invalid_request",
    )
    assert "proof of non-commit is required" in problem["detail"]
    assert problem["missing"] == "source,checked_at"
    assert state(record) == before


def test_success_evidence_without_a_reference_is_a_400_naming_it(
    client, bench, caller, op_token
) -> None:
    tenant, _ = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    before = state(record)
    body = resolve_body("succeeded", evidence={"source": "dashboard"})
    path = f"/v1/effects/{record.effect_id}/resolve"
    problem = assert_problem(
        call(client, "post", op_token, path, body), 400, "invalid_request"
    )
    assert problem["missing"] == "reference"
    assert "'reference'" in problem["detail"]
    assert state(record) == before


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (resolve_body("retry_anyway", evidence=PROOF), "invalid_request"),
        # issue 12: an unknown field has its own code
        (resolve_body("failed", operator="mallory"), "unknown_field"),
        ({"resolution": "succeeded", "evidence": PROOF}, "invalid_request"),
    ],
    ids=["no-retry-anyway", "operator-in-body", "missing-reason"],
)
def test_malformed_resolutions_are_422(
    client, bench, caller, op_token, body, code
) -> None:
    # The operator is the token's user: a body naming one is refused, not obeyed
    tenant, _ = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    before = state(record)
    path = f"/v1/effects/{record.effect_id}/resolve"
    assert_problem(call(client, "post", op_token, path, body), 422, code)
    assert state(record) == before


def test_resolving_a_prepared_effect_is_a_409(client, bench, caller, op_token) -> None:
    tenant, _ = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE)
    problem = assert_problem(
        call(
            client,
            "post",
            op_token,
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


def test_tenant_endpoints_are_tenant_scoped_and_authenticated(
    client, bench, caller
) -> None:
    tenant, _ = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    before = state(record)
    other_key = create_tenant("ops-other")[1]
    base = f"/v1/effects/{record.effect_id}"
    requests = [
        ("get", base, None),
        ("get", f"{base}/history", None),
        ("get", f"{base}/receipt", None),
        ("post", f"{base}/reconcile", None),
    ]
    for method, path, body in requests:
        assert_problem(
            call(client, method, other_key, path, body), 404, "effect_not_found"
        )
        assert_problem(call(client, method, None, path, body), 401, "unauthenticated")
    assert state(record) == before


def test_a_tenant_key_cannot_resolve_or_fork_even_its_own_effects(
    client, bench, caller
) -> None:
    # Given an agent holding its tenant's submit key, and its own unsafe unknown effect
    tenant, key = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    before, jobs = state(record), len(bench.scheduler.requests)
    effects_before = EffectIntent.objects.count()
    other_key = create_tenant("ops-other")[1]
    base = f"/v1/effects/{record.effect_id}"
    requests = [
        (f"{base}/resolve", resolve_body("not_committed", evidence=NOT_THERE)),
        (f"{base}/resolve", resolve_body("succeeded", evidence=PROOF)),
        (f"{base}/resolve", resolve_body("failed")),
        (
            f"{base}/fork",
            {"new_operation_key": "k2", "reason": "r", "evidence": NOT_THERE},
        ),
        ("/v1/effects/not-a-uuid/resolve", resolve_body("failed")),
    ]
    # When it calls the operator routes with its key (or another's, or none)
    for path, body in requests:
        for credential in (key, other_key, None):
            assert_problem(
                call(client, "post", credential, path, body), 401, "unauthenticated"
            )
    # Then nothing was written, deferred or sent
    assert state(record) == before
    assert len(bench.scheduler.requests) == jobs
    assert EffectIntent.objects.count() == effects_before
    assert bench.targets[SafetyClass.UNSAFE].requests == 1


def test_an_operator_token_does_nothing_on_tenant_routes(
    client, bench, caller, op_token
) -> None:
    tenant, _ = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    effects_before = EffectIntent.objects.count()
    submit_body = {"operation_key": "op:x", "tool": TOOLS[SafetyClass.UNSAFE]}
    requests = [
        ("post", "/v1/effects", {**submit_body, "arguments": {"amount_minor": 1}}),
        ("get", "/v1/effects", None),
        ("get", f"/v1/effects/{record.effect_id}", None),
        ("post", f"/v1/effects/{record.effect_id}/reconcile", None),
    ]
    for method, path, body in requests:
        assert_problem(call(client, method, op_token, path, body), 401, "unauthenticated")
    assert EffectIntent.objects.count() == effects_before
    assert not [r for r in bench.scheduler.requests if r[0] == "reconcile"]


def test_the_operator_is_the_tokens_user_re_checked_on_every_call(
    client, bench, caller, operator, op_token
) -> None:
    tenant, _ = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    path = f"/v1/effects/{record.effect_id}/resolve"
    before = state(record)
    # A token whose user lost the permission is refused (403), nothing written
    operator.user_permissions.clear()
    problem = assert_problem(
        call(client, "post", op_token, path, resolve_body("failed")),
        403,
        "operator_forbidden",
    )
    assert "effect_broker.resolve_effect" in problem["detail"]
    assert state(record) == before
    # A token of a user who is not staff, and a revoked token, are refused too
    clerk = make_operator("clerk")
    clerk_token = operators.create_token("clerk")[1]
    clerk.is_staff = False
    clerk.save()
    assert_problem(
        call(client, "post", clerk_token, path, resolve_body("failed")),
        403,
        "operator_forbidden",
    )
    make_operator("olga")
    row, olga_token = operators.create_token("olga")
    operators.revoke_token(str(row.id))
    assert_problem(
        call(client, "post", olga_token, path, resolve_body("failed")),
        401,
        "unauthenticated",
    )
    assert state(record) == before
    # A valid token resolves, and the event names the token's user
    valid = operators.create_token("olga")[1]
    done = call(client, "post", valid, path, resolve_body("failed"))
    assert done.status_code == 200, done.content
    last = EffectEvent.objects.filter(effect_id=record.effect_id).last()
    assert last is not None
    assert (last.event_type, last.actor) == ("resolved_failed", "olga")


def test_fork_over_http_links_both_ways(client, bench, caller, op_token) -> None:
    tenant, key = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    base = f"/v1/effects/{record.effect_id}"
    body = {"new_operation_key": "order:7:v2", "reason": "none", "evidence": NOT_THERE}
    # Refused: same key (400), missing evidence (400), nothing written
    same = {**body, "new_operation_key": record.operation_key}
    problem = assert_problem(
        call(client, "post", op_token, f"{base}/fork", same), 400, "invalid_request"
    )
    assert problem["refusal"] == "same_operation_key"
    bare = {**body, "evidence": {}}
    assert_problem(
        call(client, "post", op_token, f"{base}/fork", bare), 400, "invalid_request"
    )
    assert state(record)[0] is S.OUTCOME_UNKNOWN
    assert EffectFork.objects.count() == 0
    # Accepted: 201 with both effects, linked
    response = call(client, "post", op_token, f"{base}/fork", body)
    assert response.status_code == 201, response.content
    old, new = response.json()["old"], response.json()["new"]
    assert (old["status"], old["forked_to"]) == ("failed_final", new["effect_id"])
    assert (new["status"], new["operation_key"]) == ("prepared", "order:7:v2")
    assert new["forked_from"] == record.effect_id
    assert ("dispatch", new["effect_id"], None) in bench.scheduler.requests
    # The tenant sees the links on its own effects
    seen = call(client, "get", key, f"/v1/effects/{new['effect_id']}").json()
    assert seen["forked_from"] == record.effect_id
    assert call(client, "get", key, base).json()["forked_to"] == new["effect_id"]
    history = call(client, "get", key, f"{base}/history").json()
    assert history["events"][-1]["event_type"] == "resolved_forked"
    assert history["events"][-1]["actor"] == "ann"
    # A settled effect is not forked again (409)
    again = {**body, "new_operation_key": "order:7:v3"}
    problem = assert_problem(
        call(client, "post", op_token, f"{base}/fork", again), 409, "illegal_transition"
    )
    assert problem["refusal"] == "already_settled"
    assert EffectFork.objects.count() == 1


# --- admin ------------------------------------------------------------------------

CHANGELIST = "admin:effect_broker_effectintent_changelist"


def test_admin_list_flags_effects_that_need_an_operator(admin_client, bench) -> None:
    effect(bench, bench.tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "Needs operator" in page
    assert "resolve…" in page
    assert "Request reconciliation" in page
    assert "Resolve: mark failed" in page
    assert "fork…" in page


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
    no_reference = admin_client.post(
        url, {"resolution": "succeeded", "reason": "seen", "evidence": '{"source": "d"}'}
    )
    assert "[invalid_request]" in no_reference.content.decode()
    assert "&#x27;reference&#x27;" in no_reference.content.decode()
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
            "evidence": '{"source": "dashboard", "reference": "ch_9"}',
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


@pytest.mark.parametrize(
    "perms",
    [["view_effectintent"], ["view_effectintent", "change_effectintent"]],
    ids=["view-only", "change-but-not-resolve"],
)
def test_admin_resolution_needs_the_resolve_permission(client, bench, perms) -> None:
    # Given a staff user without effect_broker.resolve_effect (change is not enough)
    record = effect(bench, bench.tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    clerk = User.objects.create_user("clerk", password="pw", is_staff=True)
    clerk.user_permissions.add(*Permission.objects.filter(codename__in=perms))
    client.force_login(clerk)
    # Then the actions are not offered, the forms are 403, forged posts change nothing
    page = client.get(reverse(CHANGELIST)).content.decode()
    assert "Resolve: mark failed" not in page
    for name in ("resolve", "fork"):
        url = reverse(f"admin:effect_broker_effectintent_{name}", args=[record.effect_id])
        assert client.get(url).status_code == 403
        assert client.post(url, {"reason": "x"}).status_code == 403
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
    assert state(record) == (S.OUTCOME_UNKNOWN, record.version)


def test_admin_refuses_a_non_staff_user_even_with_the_permission(client, bench) -> None:
    record = effect(bench, bench.tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    agent = make_operator("agent", staff=False)
    client.force_login(agent)
    url = reverse("admin:effect_broker_effectintent_fork", args=[record.effect_id])
    body = {"new_operation_key": "k2", "reason": "r", "evidence": json.dumps(NOT_THERE)}
    response = client.post(url, body)
    assert response.status_code == 302  # to the admin login: not staff
    assert "login" in response["Location"]
    assert state(record) == (S.OUTCOME_UNKNOWN, record.version)
    assert EffectFork.objects.count() == 0


def test_admin_fork_form_settles_the_old_effect_and_links_the_new(
    admin_client, bench
) -> None:
    record = effect(bench, bench.tenant, SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    url = reverse("admin:effect_broker_effectintent_fork", args=[record.effect_id])
    assert "checked_at" in admin_client.get(url).content.decode()
    refused = admin_client.post(
        url,
        {
            "new_operation_key": record.operation_key,
            "reason": "none",
            "evidence": json.dumps(NOT_THERE),
        },
    )
    assert "[invalid_request]" in refused.content.decode()
    assert state(record)[0] is S.OUTCOME_UNKNOWN
    done = admin_client.post(
        url,
        {
            "new_operation_key": "order:9:v2",
            "reason": "not in the export",
            "evidence": json.dumps(NOT_THERE),
        },
    )
    assert done.status_code == 302
    link = EffectFork.objects.get(old_effect_id=record.effect_id)
    assert link.operator == "admin"
    assert state(record)[0] is S.FAILED_FINAL
    new = EffectIntent.objects.get(pk=link.new_effect_id)
    assert (new.operation_key, new.status) == ("order:9:v2", "prepared")
    page = admin_client.get(done["Location"]).content.decode()
    assert f"forked from {record.effect_id} by admin" in page
