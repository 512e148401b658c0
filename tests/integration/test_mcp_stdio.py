"""The MCP server through a real MCP client session: ``effect-broker mcp --transport
stdio`` runs as a subprocess on the test database and ``mcp.client.stdio`` talks to it
(issue 10, items 1-3 and 8).

The server process submits through the same service as ``POST /v1/effects``; this
process plays the worker (in-process ``dispatch`` on a simulated target), so a test
decides exactly when and how an effect settles.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from typing import Any

import anyio
import mcp.types as types
import pytest
from django.db import connection
from mcp import ClientSession

from effect_broker.adapters.simulated_adapter import Fault, get_target
from effect_broker.domain.records import EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.services import runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.workers import WorkerProcess, wait_until
from tests.integration.mcp_support import (
    MANAGEMENT,
    ROOT,
    WAIT_SECONDS,
    World,
    charge,
    effect_by_key,
    in_thread,
    run_session,
    text_of,
)
from tests.job_tables import forget_old_jobs

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_tool_list_mirrors_the_contracts_and_hides_what_has_no_face(
    mcp_world: World,
) -> None:
    # Given contracts with two exposed tools, one without a face, one switched off
    # When an MCP client lists the tools
    listed = run_session(mcp_world.env, lambda s: s.list_tools())
    tools = {tool.name: tool for tool in listed.tools}

    # Then it sees the management tools and exactly the two exposed proxy tools
    assert set(tools) == MANAGEMENT | {"charge_unsafe", "charge_idempotent"}
    # and no resolution tool: an agent never resolves its own effects
    assert not any("resolve" in name for name in tools)
    unsafe = tools["charge_unsafe"]
    # The contract's schema, plus a required operation_key that teaches a good key
    assert unsafe.input_schema["required"] == ["operation_key", "order", "amount_minor"]
    assert unsafe.input_schema["additionalProperties"] is False
    assert unsafe.input_schema["properties"]["amount_minor"] == {
        "type": "integer",
        "minimum": 1,
    }
    key_text = unsafe.input_schema["properties"]["operation_key"]["description"]
    assert "Never generate a fresh random value per call" in key_text
    assert "step" in key_text
    # Annotations (issue 21): the broker makes every proxy tool idempotent per key
    assert unsafe.annotations is not None
    assert unsafe.annotations.destructive_hint is True
    assert unsafe.annotations.idempotent_hint is True
    idempotent = tools["charge_idempotent"]
    assert idempotent.annotations is not None
    assert idempotent.annotations.idempotent_hint is True
    assert idempotent.description is not None
    assert idempotent.description.startswith("Charge a card once per order")


def test_invalid_or_unlisted_calls_are_refused_and_store_nothing(
    mcp_world: World,
) -> None:
    async def body(session: ClientSession) -> list[types.CallToolResult]:
        return [
            # no operation_key
            await session.call_tool("charge_unsafe", {"order": "42", "amount_minor": 5}),
            # a schema violation
            await session.call_tool("charge_unsafe", charge("order:42:v1", amount=0)),
            # a contracted tool whose face is switched off, and one with no face
            await session.call_tool("wipe_disk", {"operation_key": "k:1"}),
            await session.call_tool("refund_card", {"operation_key": "k:2"}),
        ]

    missing_key, bad_amount, hidden, faceless = run_session(mcp_world.env, body)

    assert missing_key.is_error
    assert missing_key.structured_content["code"] == "invalid_arguments"
    assert missing_key.structured_content["details"]["fields"] == ["operation_key"]
    assert bad_amount.is_error
    assert bad_amount.structured_content["details"]["fields"] == ["amount_minor"]
    assert "nothing was stored" in text_of(bad_amount)
    for refused in (hidden, faceless):
        assert refused.is_error
        assert refused.structured_content["code"] == "unknown_tool"
    # Negative: no intent was reserved by any of them
    assert mcp_world.intents() == 0


def test_nul_in_any_argument_is_refused_naming_it_and_stores_nothing(
    mcp_world: World,
) -> None:
    # Issue 12: NUL reached PostgreSQL from every surface; here as from the API, the
    # one storable-text rule refuses it first (unstorable_text, the field named).
    async def body(session: ClientSession) -> list[types.CallToolResult]:
        return [
            await session.call_tool("charge_unsafe", charge("order:42:v1\x00")),
            await session.call_tool(
                "charge_unsafe", {**charge("order:43:v1"), "order": "4\x002"}
            ),
            await session.call_tool("get_effect", {"effect_id": "e\x00"}),
        ]

    results = run_session(mcp_world.env, body)

    fields = []
    for result in results:
        assert result.is_error
        assert result.structured_content["code"] == "unstorable_text"
        fields.append(result.structured_content["details"]["field"])
    assert fields == ["operation_key", "order", "effect_id"]
    assert mcp_world.intents() == 0


def test_call_still_running_then_receipt_on_redelivery_and_drift_is_a_conflict(
    mcp_world: World,
) -> None:
    key = f"run:{uuid.uuid4().hex[:8]}:step:charge"

    async def body(session: ClientSession) -> dict[str, Any]:
        # Given nobody dispatches yet: the call answers "still running" after the wait
        first = await session.call_tool("charge_idempotent", charge(key))
        effect_id = await in_thread(effect_by_key, mcp_world.tenant, key)
        # When the worker (this process) dispatches it
        settled = await in_thread(lambda: dispatch(effect_id, worker="test"))
        # Then the redelivered call returns the receipt, and again the same
        second = await session.call_tool("charge_idempotent", charge(key))
        third = await session.call_tool("charge_idempotent", charge(key))
        drift = await session.call_tool("charge_idempotent", charge(key, amount=5000))
        return {
            "first": first,
            "effect_id": effect_id,
            "settled": settled,
            "second": second,
            "third": third,
            "drift": drift,
        }

    out = run_session(mcp_world.env, body)
    effect_id = out["effect_id"]

    first = out["first"]
    assert not first.is_error
    assert first.structured_content == {
        "effect_id": effect_id,
        "status": "prepared",
        "done": False,
    }
    assert "same operation_key" in text_of(first)
    assert out["settled"].status is EffectStatus.SUCCEEDED
    second, third = out["second"], out["third"]
    assert not second.is_error
    assert second.structured_content["status"] == "succeeded"
    assert second.structured_content["charge_id"]
    assert second.meta == {"effect_broker/effect_id": effect_id}
    assert third.structured_content == second.structured_content
    # One effect, one charge at the target, however often the call was delivered
    assert mcp_world.intents() == 1
    target = get_target(runtime.get_runtime().registry.for_tool("charge_idempotent"))
    assert target.effect_count() == 1
    drift = out["drift"]
    assert drift.is_error
    assert drift.structured_content["code"] == "payload_conflict"
    assert drift.structured_content["details"]["effect_id"] == effect_id
    assert mcp_world.intents() == 1


def test_unsafe_lost_answer_reaches_the_agent_as_unknown(mcp_world: World) -> None:
    key = f"run:{uuid.uuid4().hex[:8]}:step:charge"
    contract = runtime.get_runtime().registry.for_tool("charge_unsafe")
    # Given the unsafe target will commit and lose its answer
    get_target(contract).inject(Fault.LOSE_RESPONSE)

    async def body(session: ClientSession) -> dict[str, Any]:
        results: dict[str, Any] = {}

        async def call() -> None:
            started = time.monotonic()
            results["call"] = await session.call_tool("charge_unsafe", charge(key))
            results["elapsed"] = time.monotonic() - started

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            # When the worker dispatches it while the call waits
            effect_id = await in_thread(effect_by_key, mcp_world.tenant, key)
            await in_thread(lambda: dispatch(effect_id, worker="test"))
        results["effect_id"] = effect_id
        results["listed"] = await session.call_tool("list_unknown_effects", {})
        results["reconcile"] = await session.call_tool(
            "request_reconciliation", {"effect_id": effect_id}
        )
        results["again"] = await session.call_tool("charge_unsafe", charge(key))
        return results

    out = run_session(mcp_world.env, body)
    effect_id = out["effect_id"]

    # Then the waiting call is woken by the change (not by its time running out: that
    # path returns at WAIT_SECONDS or later, never before). Speed enters only if a
    # dispatch takes most of WAIT_SECONDS (6 s) on a loaded machine (issue 19).
    assert out["elapsed"] < WAIT_SECONDS
    # and the agent hears plainly that nobody knows, and must not use another key
    result = out["call"]
    assert result.is_error
    assert result.structured_content["code"] == "outcome_unknown"
    assert result.structured_content["details"] == {
        "effect_id": effect_id,
        "status": "outcome_unknown",
    }
    text = text_of(result)
    assert "Nobody knows yet" in text
    assert "Do NOT retry it under another operation key" in text
    assert "An operator will look at the target and resolve it" in text
    assert effect_id in text
    # The same call again is the same unknown effect, not a second charge
    assert out["again"].structured_content == result.structured_content
    assert get_target(contract).effect_count() == 1
    listed = out["listed"].structured_content["effects"]
    assert [e["effect_id"] for e in listed] == [effect_id]
    assert listed[0]["needs_operator"] is True
    # An agent cannot force an unsafe retry through reconciliation
    assert out["reconcile"].is_error
    assert out["reconcile"].structured_content["code"] == "illegal_transition"


def test_management_tools_are_tenant_scoped(mcp_world: World) -> None:
    # Given one effect of this tenant and one of another tenant
    other, _ = create_tenant(f"other-{uuid.uuid4().hex[:6]}")
    mine = submit(
        mcp_world.tenant,
        EffectRequest(operation_key="mine:1", tool="charge_unsafe", arguments={}),
    ).effect
    theirs = submit(
        other, EffectRequest(operation_key="theirs:1", tool="charge_unsafe", arguments={})
    ).effect

    async def body(session: ClientSession) -> list[types.CallToolResult]:
        return [
            await session.call_tool("get_effect", {"effect_id": mine.effect_id}),
            await session.call_tool("get_effect", {"effect_id": theirs.effect_id}),
            await session.call_tool("get_receipt", {"effect_id": theirs.effect_id}),
            await session.call_tool(
                "request_reconciliation", {"effect_id": theirs.effect_id}
            ),
        ]

    own, foreign, foreign_receipt, foreign_reconcile = run_session(mcp_world.env, body)

    assert not own.is_error
    assert own.structured_content["effect_id"] == mine.effect_id
    assert own.structured_content["operation_key"] == "mine:1"
    # Another tenant's effect reads exactly like a missing one
    for refused in (foreign, foreign_receipt, foreign_reconcile):
        assert refused.is_error
        assert refused.structured_content["code"] == "effect_not_found"
        assert "theirs" not in text_of(refused)


@pytest.mark.parametrize("api_key", [None, "eb_not-a-real-key"])
def test_stdio_refuses_to_start_without_a_valid_api_key(
    mcp_world: World, api_key: str | None
) -> None:
    env = dict(mcp_world.env)
    env.pop("EFFECT_BROKER_API_KEY")
    if api_key is not None:
        env["EFFECT_BROKER_API_KEY"] = api_key
    done = subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", "mcp", "--transport", "stdio"],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "EFFECT_BROKER_API_KEY" in lines[0]
    assert "refusing to start" in lines[0]


@pytest.mark.slow
def test_a_worker_process_settles_the_call_within_its_wait(mcp_world: World) -> None:
    # Given a real procrastinate worker process on the same database and contracts
    forget_old_jobs()
    worker = WorkerProcess("mcp-worker", mcp_world.env)
    try:
        wait_until(
            lambda: _workers_registered() > 0, timeout=60, what="the worker to start"
        )
        key = f"run:{uuid.uuid4().hex[:8]}:step:charge"
        # When the agent calls the tool once
        result = run_session(
            mcp_world.env, lambda s: s.call_tool("charge_idempotent", charge(key))
        )
    finally:
        worker.stop()

    # Then that one call returns the receipt: the server's submit deferred the job,
    # the worker dispatched it, and its commit woke the waiting call (had the wait run
    # out first, the answer would be "still running")
    assert not result.is_error, text_of(result)
    assert result.structured_content["status"] == "succeeded"
    assert result.structured_content["charge_id"]
    assert mcp_world.intents() == 1


def _workers_registered() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM procrastinate_workers")
        return int(cur.fetchone()[0])
