"""A token bucket: how many submits a tenant may make, and for how long to wait.

Pure arithmetic over a monotonic clock the caller passes in, so it is tested without
sleeping and a wall-clock step cannot refill or drain it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RateLimit:
    """``rate`` tokens per second, at most ``burst`` saved up."""

    rate: float
    burst: float

    def __post_init__(self) -> None:
        if not (self.rate > 0 and self.burst >= 1):
            raise ValueError("a rate limit needs rate > 0 and burst >= 1")


class TokenBucket:
    """One caller's bucket; starts full."""

    __slots__ = ("_limit", "_tokens", "_updated")

    def __init__(self, limit: RateLimit, now: float) -> None:
        self._limit = limit
        self._tokens = limit.burst
        self._updated = now

    def take(self, now: float, cost: float = 1.0) -> float:
        """Take ``cost`` tokens. Return 0.0 when granted, else the seconds until they
        would be. A cost above the burst is charged as the burst, so it can succeed."""
        cost = min(max(cost, 0.0), self._limit.burst)
        elapsed = max(0.0, now - self._updated)
        self._tokens = min(self._limit.burst, self._tokens + elapsed * self._limit.rate)
        self._updated = now
        if self._tokens >= cost:
            self._tokens -= cost
            return 0.0
        return (cost - self._tokens) / self._limit.rate


#: A submit costs one token plus one per this many body bytes: a maximal submit
#: (~256 KiB) costs what 17 small ones do, which is roughly what it costs to handle.
BYTES_PER_TOKEN = 16 * 1024


def submit_cost(body_bytes: int) -> float:
    """Tokens one submit of ``body_bytes`` takes."""
    return 1.0 + max(0, body_bytes) // BYTES_PER_TOKEN


def retry_after_seconds(wait: float) -> int:
    """``Retry-After`` is whole seconds; never tell a caller to retry at once."""
    return max(1, math.ceil(wait))
