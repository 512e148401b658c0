"""An unexpected failure inside an MCP tool call reaches the agent as a plain
``internal_error`` with the advice to call again under the same key, never as a
traceback or an internal message (issue 12, item 1: no 5xx-like leak on any surface).

A real MCP client session, in process over memory streams, against the real server.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.shared.memory import create_client_server_memory_streams

from effect_broker.mcp import server as mcp_server
from effect_broker.mcp.server import McpSettings, build_server
from effect_broker.services.tenants import create_tenant

pytestmark = pytest.mark.django_db(transaction=True)

LEAK = 'relation "effect_intents" violates ... card 4111111111111111'


def call(tenant: Any, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    server = build_server(lambda ctx: tenant, McpSettings(wait_seconds=0.1))

    async def main() -> types.CallToolResult:
        async with (
            create_client_server_memory_streams() as (client, served),
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(
                lambda: server.run(
                    served[0], served[1], server.create_initialization_options()
                )
            )
            async with ClientSession(client[0], client[1]) as session:
                await session.initialize()
                result = await session.call_tool(name, arguments)
            tg.cancel_scope.cancel()
        return result

    return anyio.run(main)


def test_an_unexpected_error_is_internal_error_without_its_message(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = create_tenant("mcp-internal")[0]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(LEAK)

    monkeypatch.setattr(mcp_server, "_call", broken)
    result = call(
        tenant, "get_effect", {"effect_id": "00000000-0000-0000-0000-000000000000"}
    )
    assert result.is_error
    text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
    assert "internal_error" in text
    assert "same operation_key" in text
    assert LEAK not in text
    assert "Traceback" not in text
    assert LEAK not in str(result.structured_content)
    assert LEAK in caplog.text  # the operator's log keeps the detail
