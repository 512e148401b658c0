"""Shared set-up of the MCP tests: contracts with MCP faces, a tenant with an API key,
the server process's environment, and a client-session runner."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from django.conf import settings
from django.db import connection, connections
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from config.database import url_from_settings
from effect_broker.adapters.registry import reset_adapters
from effect_broker.adapters.simulated_adapter import reset_targets
from effect_broker.domain.contracts import load_contracts
from effect_broker.models import EffectIntent, Tenant
from effect_broker.scheduling import RecordingScheduler
from effect_broker.services import runtime
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.workers import broker_env
from tests.served import served

ROOT = Path(__file__).resolve().parents[2]
#: How long the server waits for an effect to settle before "still running".
WAIT_SECONDS = 6.0

CONTRACTS = """
[[contract]]
name = "mcp.charge-unsafe"
version = "1"
tool = "charge_unsafe"
safety = "unsafe"
description = "Charge a card (no key support at the target)"
[contract.mcp]
[contract.mcp.input_schema]
type = "object"
required = ["order", "amount_minor"]
additionalProperties = false
properties.order.type = "string"
properties.amount_minor = { type = "integer", minimum = 1 }

[[contract]]
name = "mcp.charge-idempotent"
version = "1"
tool = "charge_idempotent"
safety = "idempotent"
key_retention = "24h"
[contract.mcp]
description = "Charge a card once per order"
[contract.mcp.input_schema]
type = "object"
required = ["order", "amount_minor"]
additionalProperties = false
properties.order.type = "string"
properties.amount_minor = { type = "integer", minimum = 1 }

# A contract with no MCP face, and one with its face switched off: neither is listed
# nor callable.
[[contract]]
name = "mcp.refund"
version = "1"
tool = "refund_card"
safety = "unsafe"

[[contract]]
name = "mcp.wipe"
version = "1"
tool = "wipe_disk"
safety = "unsafe"
[contract.mcp]
expose = false
input_schema = { type = "object" }
"""

MANAGEMENT = {
    "get_effect",
    "list_unknown_effects",
    "get_receipt",
    "request_reconciliation",
}


@dataclass
class World:
    """A tenant with an API key, the contracts file and the server's environment."""

    tenant: Tenant
    api_key: str
    env: dict[str, str]

    def intents(self) -> int:
        return EffectIntent.objects.filter(tenant_id=self.tenant.id).count()


@contextmanager
def open_world(tmp_path: Path, contracts: str = CONTRACTS) -> Iterator[World]:
    """A tenant, its key, the contracts file, and this process's runtime on them."""
    connection.ensure_connection()
    path = tmp_path / "contracts.toml"
    path.write_text(contracts)
    tenant, api_key = create_tenant(f"mcp-{uuid.uuid4().hex[:6]}")
    master_key = settings.EFFECT_BROKER_MASTER_KEY
    assert master_key is not None
    env = broker_env(
        url_from_settings(connection.settings_dict),
        path,
        master_key,
        extra={
            "EFFECT_BROKER_API_KEY": api_key,
            "EFFECT_BROKER_MCP_WAIT_SECONDS": str(WAIT_SECONDS),
        },
    )
    runtime.reset()
    # Adapters are cached per contract and hold their target: forget both, or a fault
    # injected into a fresh target would miss the one dispatch uses.
    reset_adapters()
    reset_targets()
    try:
        # This process dispatches with the same contracts the server submits under.
        with runtime.override(
            registry=load_contracts(path), scheduler=RecordingScheduler()
        ):
            yield World(tenant, api_key, env)
    finally:
        runtime.reset()
        reset_adapters()
        reset_targets()


def run_session(
    env: dict[str, str], body: Callable[[ClientSession], Awaitable[Any]]
) -> Any:
    """Spawn the stdio server, open a client session, run ``body`` in it."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "effect_broker.cli", "mcp", "--transport", "stdio"],
        env=env,
        cwd=ROOT,
    )

    async def main() -> Any:
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await body(session)

    return anyio.run(main)


def call_in_memory(
    tenant: Tenant, name: str, arguments: dict[str, Any]
) -> types.CallToolResult:
    """One tool call to the broker's MCP server for ``tenant``, over in-memory streams
    in this process (the services' own database connection, no subprocess)."""
    from mcp.shared.memory import create_client_server_memory_streams

    from effect_broker.mcp.server import McpSettings, build_server

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


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (closed again before a server binds it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def standalone_http(env: dict[str, str], host: str = "127.0.0.1") -> Iterator[str]:
    """``effect-broker mcp --transport http --host <host>`` on a free port, reached on
    127.0.0.1: its base URL once ``/healthz`` answers; stopped afterwards."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "effect_broker.cli",
            "mcp",
            "--transport",
            "http",
            "--host",
            host,
            "--port",
            str(port),
        ],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with served(process, f"http://127.0.0.1:{port}", "the MCP HTTP server") as base:
        yield base


def in_thread(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """Run Django code from inside the session's event loop (in a worker thread, whose
    connection is closed after, so the test database can be dropped at the end)."""

    def run() -> Any:
        try:
            return fn(*args)
        finally:
            connections.close_all()

    return anyio.to_thread.run_sync(run)


def charge(key: str, amount: int = 1999) -> dict[str, Any]:
    return {"operation_key": key, "order": "42", "amount_minor": amount}


def text_of(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def effect_by_key(tenant: Tenant, key: str, timeout: float = 10.0) -> str:
    """The id of ``tenant``'s effect for ``key``, once the server has reserved it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = EffectIntent.objects.filter(tenant_id=tenant.id, operation_key=key).first()
        if row is not None:
            return str(row.id)
        time.sleep(0.05)
    raise AssertionError(f"no effect reserved for {key!r}")
