"""A scripted upstream MCP server for the mcp adapter's classification tests.

Every ``tools/call`` is appended to the file named by ``$FAULT_SERVER_CALLS`` before the
tool does anything, so a test counts exactly how many calls reached the server. Tools:
``echo`` (returns its arguments), ``crash`` (the process dies mid-call), ``hang``
(never answers), ``rpc_error`` (a JSON-RPC error with ``code``), ``refuse`` (an isError
result with ``{"error": error}``), ``plain`` (a text answer that is not JSON).
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import mcp.types as types
from mcp import MCPError
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

_ANY = {"type": "object"}
TOOLS = [
    types.Tool(name=name, input_schema=_ANY)
    for name in ("echo", "crash", "hang", "rpc_error", "refuse", "plain")
]


async def on_list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def on_call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    arguments = dict(params.arguments or {})
    with open(os.environ["FAULT_SERVER_CALLS"], "a", encoding="utf-8") as calls:
        calls.write(json.dumps({"tool": params.name, "arguments": arguments}) + "\n")
    if params.name == "crash":
        os._exit(3)
    if params.name == "hang":
        await anyio.sleep(60)
    if params.name == "rpc_error":
        raise MCPError(int(arguments["code"]), "scripted error")
    if params.name == "refuse":
        document = {"error": arguments.get("error")}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(document))],
            structured_content=document,
            is_error=True,
        )
    if params.name == "plain":
        return types.CallToolResult(content=[types.TextContent(type="text", text="done")])
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(arguments))],
        structured_content={"id": "echo-1", **arguments},
    )


async def main() -> None:
    server = Server(
        "fault-server", on_list_tools=on_list_tools, on_call_tool=on_call_tool
    )
    async with stdio_server() as (read_stream, write_stream):
        await server.run(
            read_stream, write_stream, server.create_initialization_options()
        )


if __name__ == "__main__":
    anyio.run(main)
