"""The MCP Inspector (the protocol's own debugging client, from npm) lists the proxy
tools with the annotations issue 21 asks for: its CLI mode spawns the real stdio
server, as an MCP client configured by a user would.

Skipped, saying why, where Node's ``npx`` is missing or the package cannot be had;
``EFFECT_BROKER_MCP_INSPECTOR`` may name an installed ``mcp-inspector`` binary instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.mcp_support import ROOT, World, open_world

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: Pinned: the newest release that runs on Node 20 (later ones need Node 22.19).
INSPECTOR = "@modelcontextprotocol/inspector@0.17.5"


def inspector_command() -> list[str]:
    installed = os.environ.get("EFFECT_BROKER_MCP_INSPECTOR", "").strip()
    if installed:
        return [installed]
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("the MCP Inspector needs Node's npx, which is not installed")
    return [npx, "-y", INSPECTOR]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with open_world(tmp_path) as opened:
        yield opened


def test_the_inspector_lists_proxy_tools_as_idempotent(world: World) -> None:
    env_args = [
        arg
        for name, value in world.env.items()
        if name.startswith(("EFFECT_BROKER_", "DATABASE_", "DJANGO_")) and value
        for arg in ("-e", f"{name}={value}")
    ]
    command = [
        *inspector_command(),
        "--cli",
        *env_args,
        sys.executable,
        "-m",
        "effect_broker.cli",
        "mcp",
        "--transport",
        "stdio",
        "--method",
        "tools/list",
    ]
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            env={**os.environ, "npm_config_yes": "true"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"{INSPECTOR} did not answer in 120 s (fetching it from npm?)")
    if done.returncode != 0 and "npm" in done.stderr and "ERR" in done.stderr:
        pytest.skip(f"{INSPECTOR} could not be installed: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    tools = {tool["name"]: tool for tool in json.loads(done.stdout)["tools"]}
    for name in ("charge_unsafe", "charge_idempotent"):
        assert tools[name]["annotations"] == {
            "readOnlyHint": False,
            "destructiveHint": True,
            "idempotentHint": True,
            "openWorldHint": True,
        }
    assert "operation_key" in tools["charge_idempotent"]["inputSchema"]["required"]
