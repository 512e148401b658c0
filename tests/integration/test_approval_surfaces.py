"""Issue 24 on every surface: REST (operator token), the CLI (``--as``), the admin (the
effect page, the audited arguments read, the queue), MCP, and the metrics.

Who may approve: only an operator, exactly as for resolution. A tenant's API key, no
key, a user without ``effect_broker.resolve_effect`` and an agent over MCP are refused
and change nothing.
"""

from __future__ import annotations

import json
import re
from typing import Any

import mcp.types as types
import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import reverse
from prometheus_client import REGISTRY

from effect_broker.domain.errors import AlreadyApprovedError
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectEvent
from effect_broker.observability.collectors import LedgerCollector
from effect_broker.services import approvals, operators
from effect_broker.services.dispatch import dispatch
from effect_broker.services.runtime import get_runtime
from effect_broker.services.tenants import create_tenant
from effect_broker.store import load_effect_for_worker
from tests.integration.approval_support import (
    LARGE,
    approval_contracts,
    attempts,
    charge,
    dispatch_jobs,
    events,
)
from tests.integration.conftest import make_operator
from tests.integration.engine.harness import Bench

S = EffectStatus


@pytest.fixture
def approving(bench: Bench) -> Any:
    with approval_contracts():
        yield bench


@pytest.fixture
def op_token(operator: Any) -> str:
    return operators.create_token(operator.get_username())[1]


def post(client: Client, path: str, key: str | None, body: Any) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    return client.post(
        path, data=json.dumps(body), content_type="application/json", **headers
    )


def problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == code
    return body


# --- REST ------------------------------------------------------------------------------


def test_rest_shows_the_wait_and_only_an_operator_token_approves(
    client: Client, approving: Bench, op_token: str
) -> None:
    tenant, tenant_key = create_tenant("approvals-api")
    record = charge(approving, tenant=tenant)
    base = f"/v1/effects/{record.effect_id}"
    # The tenant sees awaiting_approval and its deadline
    shown = client.get(base, HTTP_AUTHORIZATION=f"Bearer {tenant_key}").json()
    assert shown["status"] == "awaiting_approval"
    assert shown["approval_deadline"] is not None
    before = load_effect_for_worker(record.effect_id).version
    # The tenant's own key, and no key at all: refused, for approve and deny alike
    for verb in ("approve", "deny"):
        for key in (tenant_key, None):
            refused = post(client, f"{base}/{verb}", key, {"reason": "mine"})
            problem(refused, 401, "unauthenticated")
    # A token whose user lacks the permission: 403, as for resolution
    olga = make_operator("olga")
    olga_token = operators.create_token("olga")[1]
    olga.user_permissions.clear()
    refused = post(client, f"{base}/approve", olga_token, {"reason": "mine"})
    problem(refused, 403, "operator_forbidden")
    # A body naming an operator: identity is never a body field
    named = post(client, f"{base}/approve", op_token, {"reason": "x", "operator": "eve"})
    assert named.status_code == 422
    # None of that wrote, queued or sent anything
    assert load_effect_for_worker(record.effect_id).version == before
    assert dispatch_jobs(approving, record) == 0
    # The operator's token approves it: prepared, one dispatch job
    approved = post(client, f"{base}/approve", op_token, {"reason": "invoice ok"})
    assert approved.status_code == 200, approved.content
    assert approved.json()["status"] == "prepared"
    assert approved.json()["approval_deadline"] is None
    # A second approval: 409 already_approved, naming the first, and no second job
    again = post(client, f"{base}/approve", op_token, {"reason": "again"})
    assert problem(again, 409, "already_approved")["approved_by"] == "ann"
    assert dispatch_jobs(approving, record) == 1
    done = dispatch(record.effect_id, worker="w1")
    assert done.status is S.SUCCEEDED
    assert approving.targets[SafetyClass.IDEMPOTENT].requests == 1


def test_rest_deny_ends_it_unsent(
    client: Client, approving: Bench, op_token: str
) -> None:
    record = charge(approving)
    denied = post(
        client, f"/v1/effects/{record.effect_id}/deny", op_token, {"reason": "no"}
    )
    assert denied.status_code == 200, denied.content
    assert denied.json()["status"] == "failed_final"
    problem(
        post(
            client, f"/v1/effects/{record.effect_id}/approve", op_token, {"reason": "y"}
        ),
        409,
        "approval_not_pending",
    )
    assert attempts(record) == 0
    assert approving.targets[SafetyClass.IDEMPOTENT].requests == 0


# --- CLI -------------------------------------------------------------------------------


def test_the_cli_approves_and_denies_as_the_named_operator(
    approving: Bench, operator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = charge(approving), charge(approving)
    call_command("effects", "approve", first.effect_id, "--as", "ann", "--reason", "ok")
    call_command("effects", "deny", second.effect_id, "--as", "ann", "--reason", "no")
    out = capsys.readouterr().out
    assert f"approved {first.effect_id}: awaiting_approval -> prepared" in out
    assert f"denied {second.effect_id}: awaiting_approval -> failed_final" in out
    assert events(first)[-1][:3] == ("approved", "prepared", "ann")
    assert events(second)[-1][2:] == ("ann", {"reason": "no", "decision": "denied"})
    with pytest.raises(AlreadyApprovedError):
        call_command(
            "effects", "approve", first.effect_id, "--as", "ann", "--reason", "x"
        )
    assert dispatch_jobs(approving, first) == 1


# --- the admin -------------------------------------------------------------------------


def test_the_admin_page_shows_the_wait_the_amount_and_approves(
    admin_client: Client, approving: Bench
) -> None:
    record = charge(approving, LARGE, amount_minor=120000, card="tok_secret")
    page = admin_client.get(
        reverse("admin:effect_broker_effectintent_change", args=[record.effect_id])
    ).content.decode()
    assert 'id="approval"' in page
    assert "nothing has been sent" in page
    assert "/amount_minor above 50000" in page
    assert "120000" in page  # the preview field
    assert "tok_secret" not in page  # not a preview field: only in the audited read
    # The queue lists it, awaiting approval, with its age and time left
    queue = admin_client.get(reverse("admin:effect_broker_effectintent_queue"))
    html = queue.content.decode()
    assert record.effect_id in re.findall(r'data-effect-id="([0-9a-f-]{36})"', html)
    assert "Awaiting approval" in html
    assert " left" in html
    # The full arguments: an audited read (an event with the operator and reason)
    url = reverse("admin:effect_broker_effectintent_arguments", args=[record.effect_id])
    shown = admin_client.post(
        url, {"reason": "checking before approval"}
    ).content.decode()
    assert "tok_secret" in shown
    assert re.search(
        r'id="approval-amount".*<code>/amount_minor</code>: <strong>120000', shown
    )
    read = (
        EffectEvent.objects.filter(effect_id=record.effect_id).order_by("sequence").last()
    )
    assert read is not None
    assert (read.event_type, read.actor, read.metadata["reason"]) == (
        "arguments_read",
        "admin",
        "checking before approval",
    )
    # Approve from the page
    approve = reverse("admin:effect_broker_effectintent_approve", args=[record.effect_id])
    answer = admin_client.post(approve, {"reason": "amount matches the invoice"})
    assert answer.status_code == 302
    assert load_effect_for_worker(record.effect_id).status is S.PREPARED
    assert dispatch_jobs(approving, record) == 1
    assert events(record)[-1][:3] == ("approved", "prepared", "admin")


def test_a_staff_user_without_the_permission_cannot_approve_in_the_admin(
    client: Client, approving: Bench
) -> None:
    viewer = make_operator("viewer", permitted=False)
    viewer.user_permissions.add(Permission.objects.get(codename="view_effectintent"))
    client.force_login(viewer)
    record = charge(approving)
    page = client.get(
        reverse("admin:effect_broker_effectintent_change", args=[record.effect_id])
    ).content.decode()
    assert 'id="no-approve-permission"' in page
    for verb in ("approve", "deny"):
        url = reverse(f"admin:effect_broker_effectintent_{verb}", args=[record.effect_id])
        assert client.post(url, {"reason": "mine"}).status_code == 403
    assert load_effect_for_worker(record.effect_id).status is S.AWAITING_APPROVAL


# --- metrics ---------------------------------------------------------------------------


def test_metrics_count_waiting_approvals_and_decisions(
    approving: Bench, operator: Any
) -> None:
    waiting, denied = charge(approving), charge(approving)
    labels = {
        "tool": "approved_charge",
        "contract": "t.approved",
        "contract_version": "1",
        "safety_class": "idempotent",
    }

    def counted(decision: str) -> float:
        name = "effect_broker_approvals_total"
        return REGISTRY.get_sample_value(name, {**labels, "decision": decision}) or 0.0

    before = counted("denied")
    approvals.deny(approving.tenant, denied.effect_id, operator=operator, reason="no")
    assert counted("denied") == before + 1
    families = {f.name: f for f in LedgerCollector(get_runtime().registry).collect()}
    (count,) = [
        s.value
        for s in families["effect_broker_awaiting_approval_effects"].samples
        if s.labels == labels
    ]
    assert count == 1  # the waiting one; the denied one no longer waits
    (age,) = [
        s.value
        for s in families["effect_broker_awaiting_approval_oldest_age_seconds"].samples
        if s.labels == labels
    ]
    assert age >= 0
    assert waiting.status is S.AWAITING_APPROVAL


# --- MCP -------------------------------------------------------------------------------

MCP_APPROVAL = """
[[contract]]
name = "mcp.charge-approved"
version = "1"
tool = "charge_approved"
safety = "idempotent"
key_retention = "24h"
approval = "required"
[contract.mcp]
[contract.mcp.input_schema]
type = "object"
required = ["order", "amount_minor"]
properties.order.type = "string"
properties.amount_minor = { type = "integer", minimum = 1 }
"""


@pytest.mark.django_db(transaction=True)
@override_settings(EFFECT_BROKER_PUBLIC_URL="https://broker.example.com")
def test_an_agent_over_mcp_is_told_to_wait_and_cannot_approve(tmp_path: Any) -> None:
    from tests.integration.mcp_support import (
        CONTRACTS,
        call_in_memory,
        open_world,
        text_of,
    )

    with open_world(tmp_path, CONTRACTS + MCP_APPROVAL) as world:
        arguments = {"operation_key": "run:1:charge", "order": "42", "amount_minor": 9}
        # The session validates the answer against the tool's listed outputSchema
        answer = call_in_memory(world.tenant, "charge_approved", arguments)
        assert not answer.is_error, text_of(answer)
        facts = answer.structured_content
        assert facts is not None
        assert (facts["status"], facts["done"]) == ("awaiting_approval", False)
        assert facts["approval_url"] == (
            f"https://broker.example.com/admin/effect_broker/effectintent/"
            f"{facts['effect_id']}/change/#approval"
        )
        text = text_of(answer)
        assert "Awaiting approval by an operator" in text
        assert "again with the same operation_key" in text
        assert facts["approval_url"] in text
        # There is no tool to approve with: an agent never approves its own call
        refused = call_in_memory(
            world.tenant, "approve_effect", {"effect_id": facts["effect_id"]}
        )
        assert refused.is_error
        assert isinstance(refused.content[0], types.TextContent)
        assert "[unknown_tool]" in refused.content[0].text
        effect = load_effect_for_worker(facts["effect_id"])
        assert effect.status is S.AWAITING_APPROVAL
        assert attempts(effect) == 0
