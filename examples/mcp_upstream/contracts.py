"""Contracts that put effect-broker in front of the example payments MCP server.

One contract per safety class the upstream can prove (issue 10, item 4): ``charge``
carries an idempotency key (idempotent), ``charge_by_reference`` is found again by
``lookup_charge`` (reconcilable), ``charge_unkeyed`` proves nothing (unsafe). The
server runs over stdio with ``python`` = this interpreter, from the repository root.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The broker's tool per safety class, behind the mcp adapter.
MCP_TOOLS = {
    "idempotent": "mcp_charge_idempotent",
    "reconcilable": "mcp_charge_reconcilable",
    "unsafe": "mcp_charge_unsafe",
}
#: The payments server's answers that prove nothing was charged, and the one that
#: means its own request to the payments service lost its answer.
RETRYABLE = ["rejected", "target_unreachable", "key_in_use"]
UNKNOWN = ["outcome_unknown"]
#: Its documented refusals, answered before anything was charged. Any other error
#: (a tool that raised, perhaps after charging) stays unknown: ``tool_error``'s
#: default.
TERMINAL = ["invalid_arguments", "idempotency_key_reused", "stale_fencing_token"]


def server_command(target_url: str) -> list[str]:
    """The stdio command of the example payments server for ``target_url``."""
    return [
        sys.executable,
        "-m",
        "examples.mcp_upstream.payments_server",
        "--target",
        target_url,
    ]


def upstream_toml(target_url: str, *, url: str | None = None) -> str:
    """``command``/``args``/``cwd`` (or ``url``) lines of a ``[*.upstream]`` table."""
    if url is not None:
        return f"url = {json.dumps(url)}\n"
    command = server_command(target_url)
    return (
        f"command = {json.dumps(command[0])}\n"
        f"args = {json.dumps(command[1:])}\n"
        f"cwd = {json.dumps(str(ROOT))}\n"
    )


def mcp_contracts_toml(
    target_url: str,
    *,
    settlement_bound: str = "2s",
    attempt_timeout: str = "10s",
    mcp_face: bool = False,
    url: str | None = None,
) -> str:
    """TOML for the three mcp-adapter contracts (optionally with an MCP face each)."""
    where = upstream_toml(target_url, url=url)
    errors = (
        f"retryable_errors = {json.dumps(RETRYABLE)}\n"
        f"unknown_errors = {json.dumps(UNKNOWN)}\n"
        f"terminal_errors = {json.dumps(TERMINAL)}\n"
    )
    common = f"""retry_limit = 5
backoff_initial = "200ms"
backoff_max = "2s"
attempt_timeout = "{attempt_timeout}"
adapter = "mcp"
preview_fields = ["order", "amount_minor", "currency"]"""

    def face(name: str) -> str:
        if not mcp_face:
            return ""
        return f"""[contract.mcp]
description = "Charge a card through the payments MCP server ({name})"
[contract.mcp.input_schema]
type = "object"
required = ["order", "amount_minor"]
properties.order.type = "string"
properties.amount_minor = {{ type = "integer", minimum = 1 }}
properties.currency.type = "string"
"""

    return f"""# Generated: the broker in front of the payments MCP server ({target_url})
[[contract]]
name = "mcp-demo.charge-idempotent"
version = "1"
tool = "{MCP_TOOLS["idempotent"]}"
safety = "idempotent"
key_retention = "24h"
{common}
[contract.upstream]
{where}tool = "charge"
key_argument = "idempotency_key"
{errors}{face("idempotent")}
[[contract]]
name = "mcp-demo.charge-reconcilable"
version = "1"
tool = "{MCP_TOOLS["reconcilable"]}"
safety = "reconcilable"
settlement_bound = "{settlement_bound}"
{common}
[contract.upstream]
{where}tool = "charge_by_reference"
key_argument = "reference"
lookup_tool = "lookup_charge"
{errors}{face("reconcilable")}
[[contract]]
name = "mcp-demo.charge-unsafe"
version = "1"
tool = "{MCP_TOOLS["unsafe"]}"
safety = "unsafe"
{common}
[contract.upstream]
{where}tool = "charge_unkeyed"
{errors}{face("unsafe")}"""
