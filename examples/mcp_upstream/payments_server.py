"""An example upstream MCP server: payments tools over the crash-matrix target service.

The kind of server effect-broker sits in front of (issue 10, item 4): an ordinary MCP
server, on the official SDK, whose tools charge through a real HTTP payments service
(``examples/crash_matrix/target_service.py``, with its own charges table). It knows
nothing about the broker. Tools:

* ``charge`` - charge once per ``idempotency_key`` (the target deduplicates it: the
  same key and body return the same charge). An ``idempotent`` contract names
  ``key_argument = "idempotency_key"``.
* ``charge_by_reference`` - charge and record ``reference``; no deduplication, but
  ``lookup_charge`` finds the charge by it (a ``reconcilable`` contract).
* ``charge_unkeyed`` - charge with no key and no lookup (``unsafe``).
* ``lookup_charge`` (read-only) - ``{"found": true, "id": ...}`` once the charge with
  this reference has settled, ``{"found": false}`` if none has.
* ``charge_stats`` (read-only) - the target's charge counts.

Every other argument of a charge tool is the charge's body. A failed charge is a tool
error (``isError``) whose structured content names what the server knows::

    {"error": "rejected"}           the target refused before committing (429)
    {"error": "key_in_use"}         a request with this key is in progress (409)
    {"error": "target_unreachable"} the connection was refused: nothing was sent
    {"error": "outcome_unknown"}    the request left and no answer came back (or 5xx)
    {"error": "<target's code>"}    any other 4xx: refused, e.g. idempotency_key_reused
    {"error": "lookup_unavailable"} the lookup could not answer

Usage::

    python -m examples.mcp_upstream.payments_server --target http://127.0.0.1:8081
        [--transport stdio|http] [--host 127.0.0.1] [--port 8766] [--port-file PATH]
        [--timeout 10]

``--target`` defaults to ``$PAYMENTS_TARGET_URL``. Over HTTP the endpoint is ``/mcp``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import anyio
import httpx
import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

_BODY = {
    "type": "object",
    "required": ["order", "amount_minor"],
    "properties": {
        "order": {"type": "string"},
        "amount_minor": {"type": "integer", "minimum": 1},
        "currency": {"type": "string"},
    },
}
_WRITE = types.ToolAnnotations(
    read_only_hint=False, destructive_hint=True, open_world_hint=True
)
_READ = types.ToolAnnotations(read_only_hint=True, open_world_hint=True)


def _with(name: str, description: str) -> dict[str, Any]:
    schema = json.loads(json.dumps(_BODY))
    schema["properties"][name] = {
        "type": "string",
        "minLength": 1,
        "description": description,
    }
    schema["required"].append(name)
    return schema


TOOLS = [
    types.Tool(
        name="charge",
        description="Charge a card once per idempotency_key (the payments service "
        "returns the same charge for the same key and body).",
        input_schema=_with("idempotency_key", "Deduplicates the charge."),
        annotations=_WRITE.model_copy(update={"idempotent_hint": True}),
    ),
    types.Tool(
        name="charge_by_reference",
        description="Charge a card and record the reference; lookup_charge finds it. "
        "Not deduplicated.",
        input_schema=_with("reference", "Recorded with the charge, for lookup_charge."),
        annotations=_WRITE,
    ),
    types.Tool(
        name="charge_unkeyed",
        description="Charge a card. No key, no lookup: a resend is a second charge.",
        input_schema=_BODY,
        annotations=_WRITE,
    ),
    types.Tool(
        name="lookup_charge",
        description="Find the settled charge recorded with this reference.",
        input_schema={
            "type": "object",
            "required": ["reference"],
            "properties": {"reference": {"type": "string", "minLength": 1}},
            "additionalProperties": False,
        },
        annotations=_READ,
    ),
    types.Tool(
        name="charge_stats",
        description="How many charges the payments service holds, by kind.",
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        annotations=_READ,
    ),
]
#: tool -> (target path, the argument sent as a header, that header)
_CHARGES = {
    "charge": ("/idempotent/charges", "idempotency_key", "Idempotency-Key"),
    "charge_by_reference": ("/reconcilable/charges", "reference", "X-Correlation-Key"),
    "charge_unkeyed": ("/unsafe/charges", None, None),
}


def _ok(document: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(document))],
        structured_content=document,
    )


def _failed(error: str, **details: Any) -> types.CallToolResult:
    document = {"error": error, **details}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(document))],
        structured_content=document,
        is_error=True,
    )


class Payments:
    """The tools' calls to the payments service (one HTTP request each, no retry)."""

    def __init__(self, target: str, timeout: float) -> None:
        self.target = target.rstrip("/")
        # No retry and no environment proxy: a resend here would be a second charge,
        # and a proxy's 502 would hide a refused connection.
        self.client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(retries=0),
            timeout=httpx.Timeout(timeout, connect=min(timeout, 2.0)),
            trust_env=False,
        )

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Run tool ``name``."""
        if name in _CHARGES:
            return await self._charge(name, arguments)
        if name == "lookup_charge":
            return await self._lookup(arguments)
        if name == "charge_stats":
            try:
                response = await self.client.get(f"{self.target}/stats")
            except httpx.HTTPError:
                return _failed("target_unreachable")
            return _ok(response.json())
        return _failed("unknown_tool", tool=name)

    async def _charge(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        path, key_name, header = _CHARGES[name]
        body = dict(arguments)
        headers = {}
        if key_name is not None:
            key = body.pop(key_name, None)
            if not isinstance(key, str) or not key:
                return _failed("invalid_arguments", missing=key_name)
            assert header is not None
            headers[header] = key
        if not isinstance(body.get("order"), str) or not isinstance(
            body.get("amount_minor"), int
        ):
            return _failed("invalid_arguments", missing="order, amount_minor")
        try:
            response = await self.client.post(
                f"{self.target}{path}", json=body, headers=headers
            )
        except (httpx.ConnectError, httpx.ConnectTimeout):
            return _failed("target_unreachable")  # never written: nothing charged
        except httpx.HTTPError:
            return _failed("outcome_unknown")  # written; the answer was lost
        status = response.status_code
        if status == 200:
            return _ok(response.json())
        error = _error_code(response)
        if status == 429:
            return _failed("rejected", http_status=status)
        if status == 409 and error == "idempotency_key_in_use":
            return _failed("key_in_use", http_status=status)
        if 400 <= status <= 499:
            return _failed(error or "refused", http_status=status)
        return _failed("outcome_unknown", http_status=status)

    async def _lookup(self, arguments: dict[str, Any]) -> types.CallToolResult:
        reference = arguments.get("reference")
        if not isinstance(reference, str) or not reference:
            return _failed("invalid_arguments", missing="reference")
        try:
            response = await self.client.get(
                f"{self.target}/reconcilable/charges",
                params={"correlation_key": reference},
            )
        except httpx.HTTPError:
            return _failed("lookup_unavailable")
        if response.status_code == 404:
            return _ok({"found": False})
        if response.status_code != 200:
            return _failed("lookup_unavailable", http_status=response.status_code)
        return _ok({"found": True, **response.json()})


def _error_code(response: httpx.Response) -> str | None:
    try:
        document = response.json()
    except ValueError:
        return None
    error = document.get("error") if isinstance(document, dict) else None
    return error if isinstance(error, str) else None


def build_server(payments: Payments) -> Server[Any]:
    """The payments MCP server on the low-level SDK server."""

    async def on_list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def on_call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await payments.call(params.name, dict(params.arguments or {}))

    return Server(
        "example-payments", on_list_tools=on_list_tools, on_call_tool=on_call_tool
    )


async def _serve_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(
            read_stream, write_stream, server.create_initialization_options()
        )


def _serve_http(server: Server[Any], host: str, port: int, port_file: str | None) -> None:
    import socket

    import uvicorn

    app = server.streamable_http_app(
        streamable_http_path="/mcp", stateless_http=True, json_response=True, host=host
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    if port_file:
        # Write then rename, so a parent polling the file never reads half a number.
        tmp = f"{port_file}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="ascii") as handle:
            handle.write(f"{sock.getsockname()[1]}\n")
        os.replace(tmp, port_file)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    """Serve the payments tools until stdin closes (stdio) or SIGTERM (http)."""
    parser = argparse.ArgumentParser(
        prog="payments_server",
        description="An example MCP server whose tools charge through the crash-matrix "
        "target service.",
    )
    parser.add_argument("--target", default=os.environ.get("PAYMENTS_TARGET_URL"))
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--port-file")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    args = parser.parse_args(argv)
    if not args.target:
        parser.error("--target (or $PAYMENTS_TARGET_URL) is required")
    server = build_server(Payments(args.target, args.timeout))
    if args.transport == "stdio":
        anyio.run(_serve_stdio, server)
    else:
        _serve_http(server, args.host, args.port, args.port_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
