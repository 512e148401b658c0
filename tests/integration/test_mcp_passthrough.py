"""Pass-through tools and strict mode, through a real MCP client session (issue 10,
items 3-4): ``effect-broker mcp --transport stdio`` runs as a subprocess in front of the
example payments MCP server (itself a stdio subprocess of the broker), which charges
through the real target service.

Strict (the default) lists and forwards only a pass-through declared read-only AND
marked ``readOnlyHint`` by the upstream; ``--no-strict`` also forwards the others, with
a description that says the broker gives no guarantee. A pass-through stores nothing.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.conf import settings
from django.db import connection
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from config.database import url_from_settings
from effect_broker.mcp.passthrough import NO_GUARANTEE
from effect_broker.models import EffectIntent
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import broker_env
from examples.mcp_upstream.contracts import ROOT, upstream_toml

pytestmark = [pytest.mark.django_db(transaction=True)]


def passthrough_toml(target_url: str) -> str:
    where = upstream_toml(target_url)
    return f"""
[[passthrough]]
tool = "charge_stats"
read_only = true
[passthrough.upstream]
{where}
[[passthrough]]
tool = "find_charge"
read_only = true
description = "Find a settled charge by its reference."
[passthrough.upstream]
{where}tool = "lookup_charge"

# Declared mutating: strict mode refuses it.
[[passthrough]]
tool = "charge_unkeyed"
read_only = false
[passthrough.upstream]
{where}
# Claimed read-only, but the upstream does not say so: strict mode refuses it too.
[[passthrough]]
tool = "charge_claimed_read_only"
read_only = true
[passthrough.upstream]
{where}tool = "charge_unkeyed"
"""


@pytest.fixture
def target() -> Iterator[TargetProcess]:
    connection.ensure_connection()
    url = url_from_settings(connection.settings_dict)
    service = start_target(url, settlement_delay="100ms", schema="passthrough_target")
    try:
        service.reset()
        yield service
    finally:
        service.stop()


@pytest.fixture
def env(tmp_path: Path, target: TargetProcess) -> dict[str, str]:
    path = tmp_path / "contracts.toml"
    path.write_text(passthrough_toml(target.url))
    _, api_key = create_tenant(f"pass-{uuid.uuid4().hex[:6]}")
    assert settings.EFFECT_BROKER_MASTER_KEY is not None
    return broker_env(
        url_from_settings(connection.settings_dict),
        path,
        settings.EFFECT_BROKER_MASTER_KEY,
        extra={"EFFECT_BROKER_API_KEY": api_key},
    )


def session(
    env: dict[str, str], body: Callable[[ClientSession], Awaitable[Any]], *flags: str
) -> Any:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "effect_broker.cli", "mcp", "--transport", "stdio", *flags],
        env=env,
        cwd=ROOT,
    )

    async def main() -> Any:
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            return await body(s)

    return anyio.run(main)


def charge_arguments() -> dict[str, Any]:
    return {"order": "77", "amount_minor": 500, "currency": "EUR"}


def test_strict_mode_lists_and_forwards_only_verified_read_only_tools(
    env: dict[str, str], target: TargetProcess
) -> None:
    # Given pass-throughs: two verified read-only, one declared mutating, one
    # claimed read-only without the upstream's readOnlyHint
    async def body(s: ClientSession) -> Any:
        listed = await s.list_tools()
        stats = await s.call_tool("charge_stats", {})
        found = await s.call_tool("find_charge", {"reference": "nope"})
        mutating = await s.call_tool("charge_unkeyed", charge_arguments())
        claimed = await s.call_tool("charge_claimed_read_only", charge_arguments())
        return listed, stats, found, mutating, claimed

    # When a client of the strict (default) server lists and calls them
    listed, stats, found, mutating, claimed = session(env, body)
    tools = {tool.name: tool for tool in listed.tools}

    # Then only the verified read-only ones are listed, with the upstream's schema
    assert {"charge_stats", "find_charge"} <= set(tools)
    assert "charge_unkeyed" not in tools
    assert "charge_claimed_read_only" not in tools
    find = tools["find_charge"]
    assert find.input_schema["required"] == ["reference"]
    assert find.annotations is not None
    assert find.annotations.read_only_hint is True
    assert find.description is not None
    assert find.description.startswith("Find a settled charge by its reference.")
    assert "operation_key" not in find.input_schema["properties"]
    # and they are forwarded: the answers are the upstream's own
    assert stats.is_error is False
    assert stats.structured_content["charges"] == 0
    assert found.structured_content == {"found": False}
    # The mutating ones are refused, saying why, and nothing was charged or stored
    assert mutating.is_error is True
    assert mutating.structured_content["code"] == "unknown_tool"
    assert "read_only = false" in mutating.structured_content["message"]
    assert claimed.is_error is True
    assert "readOnlyHint" in claimed.structured_content["message"]
    assert target.count_charges() == 0
    assert target.stats()["requests"] == 0
    assert EffectIntent.objects.count() == 0


def test_no_strict_forwards_a_mutating_pass_through_with_a_warning(
    env: dict[str, str], target: TargetProcess
) -> None:
    async def body(s: ClientSession) -> Any:
        listed = await s.list_tools()
        charged = await s.call_tool("charge_unkeyed", charge_arguments())
        return listed, charged

    # When the server runs with --no-strict
    listed, charged = session(env, body, "--no-strict")
    tools = {tool.name: tool for tool in listed.tools}

    # Then the mutating pass-throughs are listed, saying the broker guarantees nothing
    for name in ("charge_unkeyed", "charge_claimed_read_only"):
        tool = tools[name]
        assert tool.description is not None
        assert tool.description.startswith(NO_GUARANTEE)
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is False
        assert tool.annotations.destructive_hint is True
        assert tool.annotations.idempotent_hint is False
    # and the verified read-only one carries no warning
    assert NO_GUARANTEE not in (tools["charge_stats"].description or "")
    # A call is forwarded as it is: one charge, and nothing in the broker's ledger
    assert charged.is_error is False
    assert charged.structured_content["status"] == "succeeded"
    assert target.count_charges("unsafe") == 1
    assert EffectIntent.objects.count() == 0


def test_strict_off_by_environment_and_a_bad_value_refuses_to_start(
    env: dict[str, str],
) -> None:
    # EFFECT_BROKER_MCP_STRICT=0 is the same switch as --no-strict
    listed = session({**env, "EFFECT_BROKER_MCP_STRICT": "0"}, lambda s: s.list_tools())
    assert "charge_unkeyed" in {tool.name for tool in listed.tools}
    # and a value that is not a switch stops the server with one line, exit 2
    result = subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", "mcp", "--transport", "stdio"],
        env={**env, "EFFECT_BROKER_MCP_STRICT": "maybe"},
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "effect-broker mcp: refusing to start: $EFFECT_BROKER_MCP_STRICT must be 1 or "
        "0, got 'maybe'"
    ]
