"""Per-contract dispatch limits, as arithmetic: may one more attempt start now?

Issue 24, item 7: a target has limits of its own (a payment provider accepts about 100
writes per second per account), and N workers with M job slots each can exceed them
however each worker behaves. So a contract may declare

* ``max_in_flight``: at most this many attempts of the contract at once;
* ``rate_limit``: at most this many attempts per second (a number, e.g. ``0.5``).

Both count across every worker, in PostgreSQL: the store decides under a row lock on
the contract's ``contract_limits`` row, with the database's clock (store/
dispatch_controls.py), and this module is the decision. An attempt in flight is an
effect in ``dispatching`` whose lease has not run out, so a SIGKILLed worker's slot is
free again when its lease ends, with no one to give it back.

The rate is a token bucket holding at most ``BURST`` (one) token, refilled at
``rate_limit`` tokens per second; an attempt takes one. In any window of T seconds at
most ``rate_limit * T + BURST`` attempts start: in any one second, ``rate_limit + 1``.
The bound is on when attempts are admitted (their claim), as the database's clock
reads it; the target sees each request a few milliseconds later.

An effect over a limit waits: its job runs again at ``wake_at``, never fails. Waiters
are spaced out by a cursor on the same row (one token's time apart, or
``IN_FLIGHT_RECHECK``), so a thousand waiting effects wake at the rate they can be
served, not all at once each time a slot frees. The order is not first-come-first-
served: a new effect that finds a free slot takes it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

#: The bucket's capacity: one token, so attempts are spread evenly.
BURST = 1.0
#: How far apart effects waiting for a free slot (``max_in_flight``) wake.
IN_FLIGHT_RECHECK = timedelta(milliseconds=100)
#: The longest a refused effect waits before it asks again.
MAX_WAIT = timedelta(seconds=30)
#: Float error in a refill must not refuse a token the clock has earned.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class DispatchLimits:
    """A contract's limits (``None``: no such limit)."""

    max_in_flight: int | None = None
    rate_limit: float | None = None

    @property
    def limited(self) -> bool:
        """True when an attempt must be admitted before it starts."""
        return self.max_in_flight is not None or self.rate_limit is not None


@dataclass(frozen=True, slots=True)
class BucketState:
    """One contract's row: its tokens, when they were counted, where waiters queue."""

    tokens: float
    refilled_at: datetime
    #: The last wake time handed to a refused effect (the next one wakes after it).
    next_wake_at: datetime


@dataclass(frozen=True, slots=True)
class Admission:
    """The decision for one attempt, and the row to store either way."""

    admitted: bool
    state: BucketState
    #: Why it waits: ``max_in_flight`` or ``rate_limit``; None when admitted.
    reason: str | None = None
    #: When a refused effect tries again (on the database's clock).
    wake_at: datetime | None = None


def fresh_bucket(now: datetime) -> BucketState:
    """A contract's first row: a full bucket, nobody waiting."""
    return BucketState(tokens=BURST, refilled_at=now, next_wake_at=now)


def admit(
    limits: DispatchLimits, state: BucketState, *, now: datetime, in_flight: int
) -> Admission:
    """Admit one attempt at ``now`` (the database's clock) with ``in_flight`` attempts
    of the contract already running, or say when to ask again."""
    tokens = state.tokens
    if limits.rate_limit is not None:
        elapsed = max(0.0, (now - state.refilled_at).total_seconds())
        tokens = min(BURST, tokens + elapsed * limits.rate_limit)
    counted = replace(state, tokens=tokens, refilled_at=now)
    if limits.max_in_flight is not None and in_flight >= limits.max_in_flight:
        return _wait(limits, counted, now, "max_in_flight", IN_FLIGHT_RECHECK)
    if limits.rate_limit is None:
        return Admission(True, counted)
    if tokens + _EPSILON < 1.0:
        need = timedelta(seconds=(1.0 - tokens) / limits.rate_limit)
        return _wait(limits, counted, now, "rate_limit", need)
    return Admission(True, replace(counted, tokens=max(0.0, tokens - 1.0)))


def _wait(
    limits: DispatchLimits,
    state: BucketState,
    now: datetime,
    reason: str,
    need: timedelta,
) -> Admission:
    spacing = (
        timedelta(seconds=1.0 / limits.rate_limit)
        if limits.rate_limit is not None
        else IN_FLIGHT_RECHECK
    )
    # Behind the last waiter, or as soon as the limit can allow it, whichever is
    # later; never further out than MAX_WAIT (a cursor left far ahead by waiters that
    # went away must not hold a new one for minutes).
    wake = min(max(now + need, state.next_wake_at + spacing), now + MAX_WAIT)
    return Admission(False, replace(state, next_wake_at=wake), reason, wake)
