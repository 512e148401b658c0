"""Per-tenant submit rate limit: 429 ``rate_limited`` with ``Retry-After`` (issue 12).

One limiter for every surface (issue 19: MCP proxy calls skipped it, 30 of 30 accepted
where REST accepted 5): a REST submit and an MCP proxy call (which submits) are both
charged through ``charge_submit`` to the same per-tenant bucket; MCP answers a refusal
as a ``rate_limited`` tool error whose text and structured content carry
``retry_after_seconds``.

Four clients of one tenant sending maximal submits pushed every other caller's
latency up by two orders of magnitude. The limit is charged at authentication, before
the body is parsed, canonicalised, encrypted or written, so a refused submit costs
about what a refused key does. A submit costs one token plus one per 16 KiB of body
(domain/rate_limit.py), because a large submit costs the process that much more.

The buckets live in the API process: with N processes the tenant's ceiling is N times
the setting (docs/reference/configuration.md). Keeping the count in PostgreSQL would
make the limit exact but would add a statement to every submit, the path issue 13 is
paring down; a per-process bucket bounds what one process spends on one tenant, which
is the resource being protected.

A batch submit (``effect_batch``) costs one token per item plus the body's: its body
is charged here at authentication like a submit's, its other items once it is parsed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.conf import settings

from effect_broker.domain.errors import RateLimitedError
from effect_broker.domain.rate_limit import (
    RateLimit,
    TokenBucket,
    retry_after_seconds,
    submit_cost,
)


class TenantRateLimiter:
    """One token bucket per tenant id, shared by the process's threads."""

    def __init__(
        self, limit: RateLimit, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._limit = limit
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    @property
    def burst(self) -> float:
        """The most tokens one charge can take (a larger cost is charged as this)."""
        return self._limit.burst

    def charge(self, tenant_id: str, cost: float = 1.0) -> None:
        """Take ``cost`` from the tenant's bucket; raise ``RateLimitedError`` if short.

        Buckets are kept per authenticated tenant, so their number is bounded by the
        tenants that exist, never by what a client sends.
        """
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(tenant_id)
            if bucket is None:
                bucket = self._buckets[tenant_id] = TokenBucket(self._limit, now)
            wait = bucket.take(now, cost)
        if wait > 0:
            seconds = retry_after_seconds(wait)
            raise RateLimitedError(
                f"this tenant is over its submit rate ({self._limit.rate:g} per second, "
                f"a large body counting as several); "
                f"retry in {seconds} s with the same operation key",
                retry_after_seconds=seconds,
            )


_limiter: TenantRateLimiter | None = None
_configured: tuple[float, float] | None = None


def submit_limiter() -> TenantRateLimiter | None:
    """The process's limiter, or None when ``EFFECT_BROKER_TENANT_SUBMIT_RATE`` is 0."""
    global _limiter, _configured
    rate = float(settings.EFFECT_BROKER_TENANT_SUBMIT_RATE)
    burst = float(settings.EFFECT_BROKER_TENANT_SUBMIT_BURST)
    if rate <= 0:
        return None
    # Rebuilt when the settings change (tests override them); otherwise one per process.
    if _limiter is None or _configured != (rate, burst):
        _limiter = TenantRateLimiter(RateLimit(rate=rate, burst=max(1.0, burst)))
        _configured = (rate, burst)
    return _limiter


def charge_submit(tenant_id: str, body_bytes: int) -> None:
    """Charge one submit of ``body_bytes`` to the tenant's bucket, whichever surface it
    came from; raise ``RateLimitedError`` when the tenant is over its rate."""
    if (limiter := submit_limiter()) is not None:
        limiter.charge(tenant_id, submit_cost(body_bytes))
