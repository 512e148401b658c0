"""Contracts that bind the four demo tools to a running target service."""

from __future__ import annotations

from pathlib import Path

from examples.mcp_upstream.contracts import MCP_TOOLS, mcp_contracts_toml

#: The tool each safety class uses in the demo and the worker tests; ``mcp-<class>``
#: is the same class behind the mcp adapter and the example payments MCP server.
TOOLS = {
    "idempotent": "charge_idempotent",
    "reconcilable": "charge_reconcilable",
    "unsafe": "charge_unsafe",
    "transactional": "charge_transactional",
    **{f"mcp-{safety}": tool for safety, tool in MCP_TOOLS.items()},
}


def contracts_toml(
    target_url: str,
    *,
    key_retention: str = "24h",
    settlement_bound: str = "2s",
    retry_limit: int = 5,
    timeout: str = "10s",
) -> str:
    """TOML for one contract per safety class, pointing at ``target_url``.

    ``settlement_bound`` must be at least the target's real settlement delay: the
    contract is a promise about the target, and the broker trusts it.
    """
    common = f"""retry_limit = {retry_limit}
backoff_initial = "200ms"
backoff_max = "2s"
preview_fields = ["order", "amount_minor", "currency"]"""
    http = f'timeout = "{timeout}"\nconnect_timeout = "1s"'
    return (
        f"""# Generated for a target at {target_url}
[[contract]]
name = "demo.charge-idempotent"
version = "1"
tool = "{TOOLS["idempotent"]}"
safety = "idempotent"
key_retention = "{key_retention}"
adapter = "http"
{common}
[contract.adapter_options]
url = "{target_url}/idempotent/charges"
idempotency_header = "Idempotency-Key"
{http}

[[contract]]
name = "demo.charge-reconcilable"
version = "1"
tool = "{TOOLS["reconcilable"]}"
safety = "reconcilable"
settlement_bound = "{settlement_bound}"
adapter = "http"
{common}
[contract.adapter_options]
url = "{target_url}/reconcilable/charges"
correlation_header = "X-Correlation-Key"
probe_url = "{target_url}/reconcilable/charges?correlation_key={{downstream_key}}"
{http}

[[contract]]
name = "demo.charge-unsafe"
version = "1"
tool = "{TOOLS["unsafe"]}"
safety = "unsafe"
adapter = "http"
{common}
[contract.adapter_options]
url = "{target_url}/unsafe/charges"
{http}

[[contract]]
name = "demo.charge-transactional"
version = "1"
tool = "{TOOLS["transactional"]}"
safety = "transactional"
adapter = "simulated-local"
{common}
"""
        + edge_contracts_toml(
            target_url, common=common, http=http, settlement_bound=settlement_bound
        )
        + approval_contracts_toml(target_url, common=common, http=http)
        + "\n"
        + mcp_contracts_toml(target_url, settlement_bound=settlement_bound)
    )


def write_contracts(path: Path, target_url: str, **options: object) -> Path:
    """Write ``contracts_toml(target_url, ...)`` to ``path`` and return it."""
    path.write_text(contracts_toml(target_url, **options), encoding="utf-8")  # type: ignore[arg-type]
    return path


#: Tools of the edge cells (examples/crash_matrix/edge_cells.py): the same target
#: endpoints under contracts whose timing or retry budget a cell needs.
EDGE_TOOLS = {
    # An attempt limit shorter than the target's slow commit, and a settlement bound
    # that covers it: the answer is lost while the row is not yet visible.
    "reconcilable_slow": "charge_reconcilable_slow",
    # A small retry budget, so retry exhaustion after an unknown attempt is quick; a
    # 4 s attempt limit, so a driver has time to queue the fault the resend meets.
    "idempotent_short": "charge_idempotent_short",
    # A fencing header, and an attempt limit (30 s) no freeze of the matrix reaches:
    # the watchdog cannot cut a late write, only the target's fence stands in its way
    # (edge_wire.py, "frozen after the send gate").
    "idempotent_fenced": "charge_idempotent_fenced",
    "reconcilable_fenced": "charge_reconcilable_fenced",
}


def edge_contracts_toml(
    target_url: str, *, common: str, http: str, settlement_bound: str = "2s"
) -> str:
    """TOML for the edge cells' contracts (appended to ``contracts_toml``)."""
    # ``common`` starts with the retry limit line; the short budget replaces it.
    short = "retry_limit = 2\n" + common.split("\n", 1)[1]
    return f"""
[[contract]]
name = "demo.charge-reconcilable-slow"
version = "1"
tool = "{EDGE_TOOLS["reconcilable_slow"]}"
safety = "reconcilable"
settlement_bound = "2500ms"
attempt_timeout = "2s"
adapter = "http"
{common}
[contract.adapter_options]
url = "{target_url}/reconcilable/charges"
correlation_header = "X-Correlation-Key"
probe_url = "{target_url}/reconcilable/charges?correlation_key={{downstream_key}}"
{http}

[[contract]]
name = "demo.charge-idempotent-short"
version = "1"
tool = "{EDGE_TOOLS["idempotent_short"]}"
safety = "idempotent"
key_retention = "24h"
attempt_timeout = "4s"
adapter = "http"
{short}
[contract.adapter_options]
url = "{target_url}/idempotent/charges"
idempotency_header = "Idempotency-Key"
{http}

[[contract]]
name = "demo.charge-idempotent-fenced"
version = "1"
tool = "{EDGE_TOOLS["idempotent_fenced"]}"
safety = "idempotent"
key_retention = "24h"
attempt_timeout = "30s"
adapter = "http"
{common}
[contract.adapter_options]
url = "{target_url}/idempotent/charges"
idempotency_header = "Idempotency-Key"
fencing_header = "X-Fencing-Token"
{http}

[[contract]]
name = "demo.charge-reconcilable-fenced"
version = "1"
tool = "{EDGE_TOOLS["reconcilable_fenced"]}"
safety = "reconcilable"
settlement_bound = "{settlement_bound}"
attempt_timeout = "30s"
adapter = "http"
{common}
[contract.adapter_options]
url = "{target_url}/reconcilable/charges"
correlation_header = "X-Correlation-Key"
probe_url = "{target_url}/reconcilable/charges?correlation_key={{downstream_key}}"
fencing_header = "X-Fencing-Token"
{http}
"""


#: Tools of the approval cells (examples/crash_matrix/approval_cells.py; issue 24).
APPROVAL_TOOLS = {
    # Every effect waits for an operator; the idempotent endpoint, so a kill after
    # the approval is recovered by a same-key resend and counted by key.
    "idempotent": "charge_approval",
    # The unsafe endpoint: every request that reaches it is a charge, so a second
    # dispatch (two approvals, a redelivered submit) would show in its table.
    "unsafe": "charge_approval_unsafe",
    # Only amounts above 1000 wait, for 2 s: the expiry cell's (unsafe endpoint).
    "brief": "charge_approval_brief",
}


def approval_contracts_toml(target_url: str, *, common: str, http: str) -> str:
    """TOML for the approval cells' contracts (appended to ``contracts_toml``)."""
    return f"""
[[contract]]
name = "demo.charge-approval"
version = "1"
tool = "{APPROVAL_TOOLS["idempotent"]}"
safety = "idempotent"
key_retention = "24h"
approval = "required"
adapter = "http"
{common}
[contract.adapter_options]
url = "{target_url}/idempotent/charges"
idempotency_header = "Idempotency-Key"
{http}

[[contract]]
name = "demo.charge-approval-unsafe"
version = "1"
tool = "{APPROVAL_TOOLS["unsafe"]}"
safety = "unsafe"
approval = "required"
adapter = "http"
{common}
[contract.adapter_options]
url = "{target_url}/unsafe/charges"
{http}

[[contract]]
name = "demo.charge-approval-brief"
version = "1"
tool = "{APPROVAL_TOOLS["brief"]}"
safety = "unsafe"
approval_when = {{ pointer = "/amount_minor", above = 1000 }}
approval_ttl = "2s"
adapter = "http"
{common}
[contract.adapter_options]
url = "{target_url}/unsafe/charges"
{http}
"""
