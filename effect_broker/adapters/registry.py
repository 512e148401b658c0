"""Build the adapter a contract names (``adapter = "..."`` in the contract file)."""

from __future__ import annotations

import threading

from effect_broker.adapters.base import EffectAdapter
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import ConfigurationError

_lock = threading.Lock()
_cache: dict[tuple[str, str], EffectAdapter] = {}


def _adapter_class(name: str) -> type[EffectAdapter]:
    # Imported lazily: an optional adapter's SDK must not be needed by the others.
    if name == "simulated":
        from effect_broker.adapters.simulated_adapter import SimulatedAdapter

        return SimulatedAdapter
    if name == "simulated-local":
        from effect_broker.adapters.simulated_adapter import SimulatedLocalAdapter

        return SimulatedLocalAdapter
    if name == "http":
        from effect_broker.adapters.http_adapter import HttpAdapter

        return HttpAdapter
    if name == "stripe":
        from effect_broker.adapters.stripe_adapter import StripeAdapter

        return StripeAdapter
    if name == "mcp":
        from effect_broker.adapters.mcp_adapter import McpAdapter

        return McpAdapter
    raise ConfigurationError(
        f"unknown adapter {name!r}; known: simulated, simulated-local, http, stripe, mcp"
    )


def build_adapter(contract: EffectContract) -> EffectAdapter:
    """Return this process's adapter for a pinned contract (one per name@version)."""
    key = (contract.name, contract.version)
    with _lock:
        adapter = _cache.get(key)
        if adapter is None:
            adapter = _adapter_class(contract.adapter)(contract)
            _cache[key] = adapter
        return adapter


def reset_adapters() -> None:
    """Close and forget built adapters (tests)."""
    with _lock:
        adapters = list(_cache.values())
        _cache.clear()
    for adapter in adapters:
        close = getattr(adapter, "close", None)
        if callable(close):
            close()


def check_adapter(contract: EffectContract) -> None:
    """Build the contract's adapter once, uncached, and close it: its constructor
    checks the adapter options (``contracts validate``). Raise ConfigurationError."""
    adapter = _adapter_class(contract.adapter)(contract)
    close = getattr(adapter, "close", None)
    if callable(close):
        close()
