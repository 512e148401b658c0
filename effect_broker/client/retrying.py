"""When the SDK sends a request again, and how long it waits first.

Why resending a submit is safe: the broker's identity of an effect is the tenant and
the operation key, never the request. A submit resent after a lost answer, a reset
connection or a 5xx either reserves the effect (the first never arrived) or replays
the one the first request reserved (``200``, same effect id). It cannot create a
second effect, so a proxy's 503 after the broker committed costs one replay, nothing
more. Reads are resent on the same terms; they change nothing.

What is not resent: a 4xx is the broker's considered answer (conflict, unknown tool,
bad key) and sending it again gives the same answer - except ``429`` with a
``Retry-After``, which asks for exactly that. httpx's own transport retries stay off
(``retries=0``): this module is the only place that decides.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with jitter for transport errors and 5xx answers."""

    #: Tries in all, the first included (1: never resend).
    attempts: int = 5
    #: Backoff before the first resend, in seconds; it doubles (``multiplier``) ...
    initial_delay: float = 0.2
    multiplier: float = 2.0
    #: ... up to this cap.
    max_delay: float = 5.0
    #: A ``Retry-After`` is honoured up to this many seconds.
    max_retry_after: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        if min(self.initial_delay, self.max_delay, self.max_retry_after) < 0:
            raise ValueError("RetryPolicy delays must not be negative")

    def delay(
        self,
        resend: int,
        *,
        retry_after: float | None = None,
        rand: Callable[[], float] = random.random,
    ) -> float:
        """Seconds to wait before resend number ``resend`` (0-based).

        Equal jitter: half the capped backoff, plus a random part of the other half,
        so callers that failed together do not come back together. A ``Retry-After``
        from the answer is a floor (capped at ``max_retry_after``).
        """
        backoff = min(self.max_delay, self.initial_delay * self.multiplier**resend)
        wait = backoff / 2 + rand() * backoff / 2
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_retry_after))
        return wait


#: Never resend: one try, for callers that do their own retrying.
NO_RETRY = RetryPolicy(attempts=1)


def retry_after_seconds(
    response: httpx.Response, *, now: Callable[[], datetime] | None = None
) -> float | None:
    """The answer's ``Retry-After`` in seconds (delta-seconds or an HTTP date)."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT
        when = when.replace(tzinfo=UTC)
    current = now() if now else datetime.now(UTC)
    return max(0.0, (when - current).total_seconds())


def should_resend(response: httpx.Response) -> bool:
    """True for an answer worth sending again: any 5xx, or a 429 with Retry-After."""
    if response.status_code >= 500:
        return True
    return response.status_code == 429 and "retry-after" in response.headers


def is_transient(exc: httpx.TransportError) -> bool:
    """True for transport failures a resend may get past (connect refused, reset,
    timeout, protocol error); False for a request that cannot be sent as written."""
    return not isinstance(exc, httpx.UnsupportedProtocol)
