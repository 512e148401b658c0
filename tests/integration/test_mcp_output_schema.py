"""Every MCP tool lists an ``outputSchema``, and every successful call's structured
content conforms to it, through a real client session (``effect-broker mcp --transport
stdio``), whose ``call_tool`` itself validates a result against the listed schema and
raises on a mismatch (issue 10, items 2 and 3).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import jsonschema
import mcp.types as types
import pytest
from mcp import ClientSession

from effect_broker.adapters.simulated_adapter import (
    Fault,
    SimulatedAdapter,
    SimulatedTarget,
)
from effect_broker.services import runtime
from effect_broker.services.dispatch import dispatch
from tests.integration.mcp_support import (
    CONTRACTS,
    World,
    charge,
    effect_by_key,
    in_thread,
    open_world,
    run_session,
    text_of,
)

pytestmark = [pytest.mark.django_db(transaction=True)]

# Two more proxy tools: one whose contract declares the result the simulated target
# returns ({"charge_id": ..., "status": "succeeded"}), one that declares a result the
# target does not return.
TYPED = """
[[contract]]
name = "mcp.charge-typed"
version = "1"
tool = "charge_typed"
safety = "idempotent"
key_retention = "24h"
[contract.mcp]
[contract.mcp.input_schema]
type = "object"
required = ["order", "amount_minor"]
properties.order.type = "string"
properties.amount_minor = { type = "integer", minimum = 1 }
[contract.mcp.output_schema]
type = "object"
required = ["charge_id", "status"]
properties.charge_id.type = "string"
properties.status = { const = "succeeded" }

[[contract]]
name = "mcp.charge-misdeclared"
version = "1"
tool = "charge_misdeclared"
safety = "idempotent"
key_retention = "24h"
[contract.mcp]
[contract.mcp.input_schema]
type = "object"
required = ["order", "amount_minor"]
properties.order.type = "string"
properties.amount_minor = { type = "integer", minimum = 1 }
[contract.mcp.output_schema]
type = "object"
required = ["charge_id", "amount_minor"]
"""


def _target(tool: str) -> SimulatedTarget:
    """The simulated target ``tool``'s adapter sends to: adapters are built once per
    process (``adapters.registry``), so this one, not a fresh ``get_target``, is the
    target an in-process ``dispatch`` reaches after an earlier test reset targets."""
    rt = runtime.get_runtime()
    adapter = rt.adapter_for(rt.registry.for_tool(tool))
    assert isinstance(adapter, SimulatedAdapter)
    return adapter.target


@pytest.fixture
def typed_world(tmp_path: Any) -> Iterator[World]:
    with open_world(tmp_path, CONTRACTS + TYPED) as world:
        yield world


def _conforms(tool: types.Tool, result: types.CallToolResult) -> None:
    assert not result.is_error, text_of(result)
    assert tool.output_schema is not None
    jsonschema.validate(result.structured_content, tool.output_schema)


def test_every_tool_lists_an_output_schema_and_every_success_conforms(
    typed_world: World,
) -> None:
    key = f"run:{uuid.uuid4().hex[:8]}:step:charge"
    unsafe_key = f"run:{uuid.uuid4().hex[:8]}:step:unsafe"
    typed_key = f"run:{uuid.uuid4().hex[:8]}:step:typed"
    _target("charge_unsafe").inject(Fault.LOSE_RESPONSE)

    async def body(session: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {"listed": await session.list_tools()}
        # A proxy call answered "still running", then its receipt on redelivery
        out["running"] = await session.call_tool("charge_idempotent", charge(key))
        effect_id = await in_thread(effect_by_key, typed_world.tenant, key)
        await in_thread(lambda: dispatch(effect_id, worker="test"))
        out["succeeded"] = await session.call_tool("charge_idempotent", charge(key))
        # A proxy call whose contract declares its result, settled while it waits
        async with anyio.create_task_group() as group:

            async def typed_call() -> None:
                out["typed"] = await session.call_tool("charge_typed", charge(typed_key))

            group.start_soon(typed_call)
            typed_id = await in_thread(effect_by_key, typed_world.tenant, typed_key)
            await in_thread(lambda: dispatch(typed_id, worker="test"))
        # An unsafe effect whose answer was lost, for list_unknown_effects
        async with anyio.create_task_group() as group:
            group.start_soon(session.call_tool, "charge_unsafe", charge(unsafe_key))
            unsafe_id = await in_thread(effect_by_key, typed_world.tenant, unsafe_key)
            await in_thread(lambda: dispatch(unsafe_id, worker="test"))
        out["get_effect"] = await session.call_tool(
            "get_effect", {"effect_id": effect_id}
        )
        out["get_receipt"] = await session.call_tool(
            "get_receipt", {"effect_id": effect_id}
        )
        out["list_unknown_effects"] = await session.call_tool("list_unknown_effects", {})
        out["request_reconciliation"] = await session.call_tool(
            "request_reconciliation", {"effect_id": effect_id}
        )
        out["ids"] = (effect_id, typed_id, unsafe_id)
        return out

    # When a client lists the tools and calls each of them (the session validates
    # every successful result against the listed outputSchema as it arrives)
    out = run_session(typed_world.env, body)
    tools = {tool.name: tool for tool in out["listed"].tools}

    # Then every listed tool declares its output
    assert all(tool.output_schema is not None for tool in tools.values())
    # and every success conforms to it
    for name in ("get_effect", "get_receipt", "list_unknown_effects"):
        _conforms(tools[name], out[name])
    _conforms(tools["request_reconciliation"], out["request_reconciliation"])
    _conforms(tools["charge_idempotent"], out["running"])
    _conforms(tools["charge_idempotent"], out["succeeded"])
    _conforms(tools["charge_typed"], out["typed"])
    assert out["typed"].structured_content["status"] == "succeeded"
    _, _, unsafe_id = out["ids"]
    assert out["running"].structured_content["done"] is False
    assert out["succeeded"].structured_content["status"] == "succeeded"
    unknown = out["list_unknown_effects"].structured_content["effects"]
    assert [e["effect_id"] for e in unknown] == [unsafe_id]
    # A contract's declared result schema is the proxy tool's, beside "still running"
    typed_schema = tools["charge_typed"].output_schema
    assert typed_schema is not None
    assert typed_schema["anyOf"][0]["required"] == ["charge_id", "status"]
    assert typed_schema["anyOf"][1]["required"] == ["effect_id", "status", "done"]
    # and a result that breaks it would be refused by the schema
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"charge_id": 7, "status": "x"}, typed_schema)


def test_a_result_that_breaks_the_declared_schema_is_reported_not_hidden(
    typed_world: World,
) -> None:
    key = f"run:{uuid.uuid4().hex[:8]}:step:charge"

    async def body(session: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {"listed": await session.list_tools()}

        async def call() -> None:
            out["first"] = await session.call_tool("charge_misdeclared", charge(key))

        # When the call's effect succeeds while it waits, and it is delivered again
        async with anyio.create_task_group() as group:
            group.start_soon(call)
            out["effect_id"] = await in_thread(effect_by_key, typed_world.tenant, key)
            await in_thread(lambda: dispatch(out["effect_id"], worker="test"))
        out["again"] = await session.call_tool("charge_misdeclared", charge(key))
        return out

    out = run_session(typed_world.env, body)

    # Then the agent hears that it SUCCEEDED, as a tool error (which no client
    # validates) rather than a success its client would reject as malformed
    again = out["again"]
    assert out["first"].structured_content == again.structured_content
    assert again.is_error
    assert again.structured_content["code"] == "result_schema_mismatch"
    assert again.structured_content["details"]["effect_id"] == out["effect_id"]
    assert again.structured_content["details"]["status"] == "succeeded"
    text = text_of(again)
    assert "The effect SUCCEEDED" in text
    assert "amount_minor" in text
    assert "Do not call this tool again under another operation key" in text
    # and it happened exactly once
    assert _target("charge_misdeclared").effect_count() == 1
    assert typed_world.intents() == 1
