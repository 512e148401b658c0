"""Contracts that bind the four demo tools to a running target service."""

from __future__ import annotations

from pathlib import Path

#: The tool each safety class uses in the demo and the worker tests.
TOOLS = {
    "idempotent": "charge_idempotent",
    "reconcilable": "charge_reconcilable",
    "unsafe": "charge_unsafe",
    "transactional": "charge_transactional",
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
    return f"""# Generated for a target at {target_url}
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


def write_contracts(path: Path, target_url: str, **options: object) -> Path:
    """Write ``contracts_toml(target_url, ...)`` to ``path`` and return it."""
    path.write_text(contracts_toml(target_url, **options), encoding="utf-8")  # type: ignore[arg-type]
    return path
