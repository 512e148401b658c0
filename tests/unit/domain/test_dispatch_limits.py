"""Dispatch limits as arithmetic (issue 24, item 7): a token bucket of one token at
``rate_limit`` per second, a count of attempts in flight, and a cursor that spaces
waiters out. Given/when/then on the pure decision; the store applies it under a lock
(tests/integration/test_dispatch_limits.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from effect_broker.domain.dispatch_limits import (
    IN_FLIGHT_RECHECK,
    MAX_WAIT,
    Admission,
    BucketState,
    DispatchLimits,
    admit,
    fresh_bucket,
)

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_no_limits_admit_everything_and_need_no_lock() -> None:
    limits = DispatchLimits()
    assert not limits.limited
    assert admit(limits, fresh_bucket(T0), now=T0, in_flight=10**6).admitted


def test_a_full_bucket_admits_one_then_the_next_waits_one_token_time() -> None:
    limits = DispatchLimits(rate_limit=4)
    first = admit(limits, fresh_bucket(T0), now=T0, in_flight=0)
    assert first.admitted
    assert first.state.tokens == pytest.approx(0.0)
    second = admit(limits, first.state, now=at(0.1), in_flight=0)
    assert not second.admitted
    assert second.reason == "rate_limit"
    # 0.4 of a token by now: 0.15 s to the next one.
    assert second.wake_at == at(0.25)
    third = admit(limits, second.state, now=at(0.25), in_flight=0)
    assert third.admitted


def test_the_bucket_holds_one_token_however_long_it_was_idle() -> None:
    limits = DispatchLimits(rate_limit=100)
    idle = admit(limits, fresh_bucket(T0), now=at(3600), in_flight=0)
    assert idle.admitted
    assert not admit(limits, idle.state, now=at(3600), in_flight=0).admitted


def test_max_in_flight_refuses_at_the_limit_and_admits_below_it() -> None:
    limits = DispatchLimits(max_in_flight=2)
    refused = admit(limits, fresh_bucket(T0), now=T0, in_flight=2)
    assert (refused.admitted, refused.reason) == (False, "max_in_flight")
    assert refused.wake_at == T0 + IN_FLIGHT_RECHECK
    assert admit(limits, fresh_bucket(T0), now=T0, in_flight=1).admitted


def test_a_slot_refusal_takes_no_token() -> None:
    limits = DispatchLimits(max_in_flight=1, rate_limit=1)
    refused = admit(limits, fresh_bucket(T0), now=T0, in_flight=1)
    assert not refused.admitted
    assert refused.state.tokens == pytest.approx(1.0)
    assert admit(limits, refused.state, now=T0, in_flight=0).admitted


def test_waiters_are_spaced_one_token_apart_not_woken_together() -> None:
    limits = DispatchLimits(rate_limit=10)
    state = admit(limits, fresh_bucket(T0), now=T0, in_flight=0).state
    wakes = []
    for _ in range(5):
        decision = admit(limits, state, now=T0, in_flight=0)
        assert not decision.admitted
        state = decision.state
        wakes.append(decision.wake_at)
    assert wakes == [at(0.1), at(0.2), at(0.3), at(0.4), at(0.5)]


def test_a_stale_cursor_never_holds_a_new_waiter_past_max_wait() -> None:
    limits = DispatchLimits(max_in_flight=1)
    stale = BucketState(tokens=1.0, refilled_at=T0, next_wake_at=at(3600))
    decision = admit(limits, stale, now=T0, in_flight=1)
    assert decision.wake_at == T0 + MAX_WAIT


def test_in_any_one_second_at_most_rate_plus_one_attempts_are_admitted() -> None:
    # Given workers asking every 7 ms for 5 s (far more often than the rate allows)
    limits = DispatchLimits(rate_limit=5)
    state = fresh_bucket(T0)
    admitted: list[datetime] = []
    for step in range(0, 5000, 7):
        now = at(step / 1000)
        decision: Admission = admit(limits, state, now=now, in_flight=0)
        state = decision.state
        if decision.admitted:
            admitted.append(now)
    # Then every 1 s window holds at most rate + 1 (the one token of burst) ...
    worst = max(
        sum(1 for t in admitted if start <= t < start + timedelta(seconds=1))
        for start in admitted
    )
    assert worst <= 5 + 1
    # ... and the rate is used: about 5 per second over the run
    assert 5 * 5 <= len(admitted) <= 5 * 5 + 1
