"""Dispatch pauses on every surface (issue 24, item 7): the operator API (operator
token only; a tenant's key is refused), the caller's view of a held effect (REST,
the SDK, the MCP proxy's answer), the admin's pauses page, and the CLI
(``effect-broker tools``; bad input is one readable line and a non-zero exit)."""

from __future__ import annotations

import json
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from effect_broker import cli
from effect_broker.client.in_process import InProcessClient
from effect_broker.domain.records import EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.mcp import server as mcp_server
from effect_broker.models import DispatchPause, Tenant
from effect_broker.services import operators, pauses
from effect_broker.services.dispatch import dispatch
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from tests.integration.engine.harness import TOOLS, Bench

TOOL = TOOLS[SafetyClass.IDEMPOTENT]
PAUSES = "/v1/operator/pauses"


@pytest.fixture
def caller(bench: Bench) -> tuple[Tenant, str]:
    return create_tenant(f"pause-api-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def op_token(operator: Any) -> str:
    return operators.create_token(operator.get_username())[1]


def call(client: Client, method: str, key: str, path: str, body: Any = None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    if method == "get":
        return client.get(path, **headers)
    return client.post(
        path, data=json.dumps(body or {}), content_type="application/json", **headers
    )


def held_effect(tenant: Tenant) -> Any:
    return submit(
        tenant,
        EffectRequest(
            operation_key=f"op:{uuid.uuid4()}", tool=TOOL, arguments={"amount_minor": 5}
        ),
    ).effect


# --- the operator API -----------------------------------------------------------


def test_an_operator_token_pauses_and_resumes_and_a_tenant_key_cannot(
    client: Client, caller: tuple[Tenant, str], op_token: str
) -> None:
    tenant, api_key = caller
    body = {"tool": TOOL, "reason": "stripe incident"}
    # A tenant's key is not an operator credential: 401, nothing recorded
    refused = call(client, "post", api_key, PAUSES, body)
    assert refused.status_code == 401
    assert refused.json()["code"] == "unauthenticated"
    assert not DispatchPause.objects.exists()
    # Identity is never a body field
    forged = call(client, "post", op_token, PAUSES, {**body, "paused_by": "mallory"})
    assert (forged.status_code, forged.json()["code"]) == (422, "unknown_field")
    # The operator's token pauses, recorded as the token's user
    record = held_effect(tenant)
    made = call(client, "post", op_token, PAUSES, body)
    assert made.status_code == 201, made.content
    pause = made.json()
    assert (pause["scope"], pause["paused_by"], pause["active"]) == (
        f"tool {TOOL}",
        "ann",
        True,
    )
    assert pause["held_effects"] == 1
    again = call(client, "post", op_token, PAUSES, body)
    assert (again.status_code, again.json()["code"]) == (409, "already_paused")
    assert again.json()["pause_id"] == pause["pause_id"]
    listed = call(client, "get", op_token, PAUSES).json()
    assert [p["pause_id"] for p in listed] == [pause["pause_id"]]
    assert call(client, "get", api_key, PAUSES).status_code == 401
    # Resumed once; the effect it held is queued again
    resume = f"{PAUSES}/{pause['pause_id']}/resume"
    assert call(client, "post", api_key, resume, {}).status_code == 401
    done = call(client, "post", op_token, resume, {"reason": "over"})
    assert done.status_code == 200, done.content
    assert done.json()["redeferred"] == 1
    assert done.json()["pause"]["resumed_by"] == "ann"
    twice = call(client, "post", op_token, resume, {})
    assert (twice.status_code, twice.json()["code"]) == (404, "pause_not_found")
    assert dispatch(record.effect_id, worker="w1").status is EffectStatus.SUCCEEDED


def test_a_bad_scope_is_a_problem_that_names_it(client: Client, op_token: str) -> None:
    unknown = call(client, "post", op_token, PAUSES, {"tool": "nope", "reason": "x"})
    assert (unknown.status_code, unknown.json()["code"]) == (422, "unknown_contract")
    empty = call(client, "post", op_token, PAUSES, {"reason": "x"})
    assert (empty.status_code, empty.json()["code"]) == (400, "invalid_request")
    blank = call(client, "post", op_token, PAUSES, {"tool": TOOL, "reason": " "})
    assert blank.status_code == 422


# --- what callers see -------------------------------------------------------------


def test_callers_see_why_a_held_effect_waits(
    client: Client, caller: tuple[Tenant, str], operator: Any
) -> None:
    tenant, api_key = caller
    record = held_effect(tenant)
    read = call(client, "get", api_key, f"/v1/effects/{record.effect_id}").json()
    assert read["paused"] is None
    pauses.pause(tool=TOOL, tenant=tenant.name, reason="fraud review", operator=operator)
    dispatch(record.effect_id, worker="w1")
    # REST: the effect and the list say why it waits (and never who paused it)
    read = call(client, "get", api_key, f"/v1/effects/{record.effect_id}").json()
    assert read["status"] == "prepared"
    assert read["paused"]["reason"] == "fraud review"
    assert read["paused"]["scope"] == f"tool {TOOL} for this tenant"
    assert "ann" not in json.dumps(read)
    (listed,) = call(client, "get", api_key, "/v1/effects").json()
    assert listed["paused"] == read["paused"]
    # The SDK's model
    effect = InProcessClient(tenant).get(record.effect_id)
    assert effect.paused is not None
    assert (effect.paused.reason, effect.paused.scope) == (
        "fraud review",
        f"tool {TOOL} for this tenant",
    )
    # The MCP proxy's answer: still running, paused, with the reason
    answer = mcp_server._outcome(tenant, record)
    assert not answer.is_error
    assert answer.structured_content["paused"]["reason"] == "fraud review"
    assert answer.structured_content["done"] is False
    text = answer.content[0].text
    assert text.startswith("Paused by an operator")
    assert "same operation_key" in text


@pytest.mark.django_db(transaction=True)
def test_an_mcp_call_under_a_pause_answers_at_once_with_the_reason(
    mcp_world: Any, operator: Any
) -> None:
    from tests.integration.mcp_support import call_in_memory

    pauses.pause(tool="charge_idempotent", reason="target incident", operator=operator)
    arguments = {"operation_key": "order:7:charge", "order": "7", "amount_minor": 5}
    # The client checks the answer against the tool's listed outputSchema: a paused
    # answer is one of its shapes (still running, with why).
    result = call_in_memory(mcp_world.tenant, "charge_idempotent", arguments)
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["status"] == "prepared"
    assert result.structured_content["paused"]["reason"] == "target incident"
    text = result.content[0].text  # type: ignore[union-attr]
    assert "Paused by an operator" in text
    assert "do not use a new key" in text


# --- the admin --------------------------------------------------------------------


def test_the_admin_pauses_and_resumes_as_the_logged_in_operator(
    admin_client: Client, bench: Bench
) -> None:
    record = bench.submit(SafetyClass.IDEMPOTENT)
    add = reverse("admin:effect_broker_dispatchpause_add")
    assert admin_client.get(add).status_code == 200
    refused = admin_client.post(add, {"tool": "nope", "reason": "x"})
    assert "[unknown_contract]" in refused.content.decode()
    made = admin_client.post(add, {"tool": TOOL, "reason": "incident"})
    assert made.status_code == 302
    (row,) = DispatchPause.objects.all()
    assert (row.paused_by, row.reason) == ("admin", "incident")
    page = admin_client.get(
        reverse("admin:effect_broker_effectintent_change", args=[record.effect_id])
    ).content.decode()
    assert 'id="effect-paused"' in page
    assert "incident" in page
    listing = admin_client.get(reverse("admin:effect_broker_dispatchpause_changelist"))
    assert f"tool {TOOL}" in listing.content.decode()
    changelist = reverse("admin:effect_broker_dispatchpause_changelist")
    selected = {"action": "resume_pauses", "_selected_action": [str(row.pk)]}
    ask = admin_client.post(changelist, selected)
    assert ask.status_code == 200  # the reason form first
    admin_client.post(changelist, {**selected, "apply": "yes", "reason": "over"})
    row.refresh_from_db()
    assert (row.resumed_by, row.resume_reason) == ("admin", "over")


def test_a_staff_user_without_the_permission_cannot_pause_in_the_admin(
    client: Client, bench: Bench
) -> None:
    from tests.integration.conftest import make_operator

    user = make_operator("viewer", permitted=False)
    client.force_login(user)
    response = client.get(reverse("admin:effect_broker_dispatchpause_add"))
    assert response.status_code == 403


# --- the CLI ----------------------------------------------------------------------


def test_the_cli_pauses_lists_and_resumes(bench: Bench, operator: Any) -> None:
    out = StringIO()
    call_command(
        "tools", "pause", TOOL, "--reason", "incident", "--as", "ann", stdout=out
    )
    assert out.getvalue().startswith(f"paused tool {TOOL} (pause ")
    listing = StringIO()
    call_command("tools", "list", stdout=listing)
    (line,) = [row for row in listing.getvalue().splitlines() if row.startswith(TOOL)]
    assert "yes (incident)" in line
    paused = StringIO()
    call_command("tools", "pauses", stdout=paused)
    assert "incident" in paused.getvalue()
    done = StringIO()
    call_command("tools", "resume", TOOL, "--as", "ann", stdout=done)
    assert done.getvalue().startswith(f"resumed tool {TOOL}")


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["tools", "pause", "nope", "--reason", "x", "--as", "ann"], "unknown_contract"),
        (["tools", "pause", "--reason", "x", "--as", "ann"], "invalid_request"),
        (
            ["tools", "pause", TOOL, "--reason", "x", "--as", "nobody"],
            "operator_forbidden",
        ),
        (["tools", "resume", TOOL, "--as", "ann"], "pause_not_found"),
        (
            [
                "tools",
                "pause",
                "--contract",
                "t.idempotent@",
                "--reason",
                "x",
                "--as",
                "ann",
            ],
            "invalid_request",
        ),
    ],
)
def test_bad_cli_input_is_one_readable_line_and_a_non_zero_exit(
    bench: Bench,
    operator: Any,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: str,
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"effect-broker: error [{code}]: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err
