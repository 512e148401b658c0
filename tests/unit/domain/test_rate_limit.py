"""The token bucket behind the per-tenant submit limit (domain/rate_limit.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effect_broker.domain.rate_limit import (
    RateLimit,
    TokenBucket,
    retry_after_seconds,
    submit_cost,
)


def test_a_new_bucket_grants_its_burst_then_refuses() -> None:
    bucket = TokenBucket(RateLimit(rate=2, burst=3), now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)  # one token every 1/rate seconds


def test_tokens_come_back_at_the_rate_and_never_beyond_the_burst() -> None:
    bucket = TokenBucket(RateLimit(rate=2, burst=3), now=0.0)
    for _ in range(3):
        bucket.take(0.0)
    assert bucket.take(0.5) == 0.0
    assert bucket.take(0.5) > 0
    # An hour idle refills to the burst, not to 7,200.
    grants = sum(bucket.take(3600.0) == 0.0 for _ in range(10))
    assert grants == 3


def test_a_clock_that_goes_backwards_refills_nothing() -> None:
    bucket = TokenBucket(RateLimit(rate=1, burst=1), now=100.0)
    assert bucket.take(100.0) == 0.0
    assert bucket.take(50.0) > 0
    assert bucket.take(50.0) > 0


def test_retry_after_is_whole_seconds_and_never_zero() -> None:
    assert retry_after_seconds(0.01) == 1
    assert retry_after_seconds(1.0) == 1
    assert retry_after_seconds(1.2) == 2


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 5), (1, 0.5)])
def test_a_limit_that_admits_nothing_is_refused(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="rate > 0"):
        RateLimit(rate=rate, burst=burst)


@given(
    rate=st.floats(min_value=0.1, max_value=1000),
    burst=st.integers(min_value=1, max_value=100),
    gaps=st.lists(st.floats(min_value=0, max_value=2), min_size=1, max_size=300),
)
def test_grants_never_exceed_burst_plus_rate_times_elapsed(
    rate: float, burst: int, gaps: list[float]
) -> None:
    bucket = TokenBucket(RateLimit(rate=rate, burst=burst), now=0.0)
    now = 0.0
    granted = 0
    for gap in gaps:
        now += gap
        granted += bucket.take(now) == 0.0
    assert granted <= burst + rate * now + 1e-6


def test_a_large_submit_costs_more_than_a_small_one() -> None:
    assert submit_cost(0) == 1
    assert submit_cost(300) == 1
    assert submit_cost(256 * 1024) == 17
    bucket = TokenBucket(RateLimit(rate=10, burst=20), now=0.0)
    assert bucket.take(0.0, submit_cost(256 * 1024)) == 0.0
    assert bucket.take(0.0, submit_cost(256 * 1024)) == pytest.approx(1.4)


def test_a_cost_above_the_burst_can_still_be_granted() -> None:
    bucket = TokenBucket(RateLimit(rate=1, burst=5), now=0.0)
    assert bucket.take(0.0, 50) == 0.0
    assert bucket.take(0.0, 50) == pytest.approx(5.0)
