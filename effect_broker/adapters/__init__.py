"""Adapters own target-specific truth (send, look up); they never own retry policy."""

from effect_broker.adapters.base import (
    DispatchRequest,
    DispatchResult,
    EffectAdapter,
    ProbeRequest,
    ProbeResult,
)

__all__ = [
    "DispatchRequest",
    "DispatchResult",
    "EffectAdapter",
    "ProbeRequest",
    "ProbeResult",
]
