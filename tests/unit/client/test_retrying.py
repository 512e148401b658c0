"""The resend policy: capped exponential backoff with equal jitter, Retry-After as a
floor, and which answers are worth sending again."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from effect_broker.client.retrying import (
    RetryPolicy,
    retry_after_seconds,
    should_resend,
)


def test_backoff_doubles_is_capped_and_jitter_stays_within_half() -> None:
    policy = RetryPolicy(initial_delay=0.2, max_delay=1.0)
    lows = [policy.delay(n, rand=lambda: 0.0) for n in range(5)]
    highs = [policy.delay(n, rand=lambda: 1.0) for n in range(5)]
    assert lows == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    assert highs == pytest.approx([0.2, 0.4, 0.8, 1.0, 1.0])


def test_retry_after_is_a_floor_capped_at_max_retry_after() -> None:
    policy = RetryPolicy(initial_delay=0.2, max_retry_after=30.0)
    assert policy.delay(0, retry_after=3.0, rand=lambda: 0.0) == 3.0
    assert policy.delay(0, retry_after=0.0, rand=lambda: 0.0) == pytest.approx(0.1)
    assert policy.delay(0, retry_after=3600.0, rand=lambda: 0.0) == 30.0


@pytest.mark.parametrize("attempts", [0, -1])
def test_a_policy_needs_at_least_one_attempt(attempts: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RetryPolicy(attempts=attempts)


def test_retry_after_reads_seconds_and_http_dates() -> None:
    def answer(value: str) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": value})

    now = datetime(2026, 12, 3, 21, 0, 0, tzinfo=UTC)
    assert retry_after_seconds(answer("7")) == 7.0
    date = "Thu, 03 Dec 2026 21:00:05 GMT"
    assert retry_after_seconds(answer(date), now=lambda: now) == 5.0
    assert retry_after_seconds(answer("soon")) is None
    assert retry_after_seconds(httpx.Response(503)) is None


@pytest.mark.parametrize(
    ("status", "headers", "resend"),
    [
        (500, {}, True),
        (502, {}, True),
        (503, {"Retry-After": "1"}, True),
        (429, {"Retry-After": "1"}, True),
        (429, {}, False),
        (409, {}, False),
        (404, {}, False),
        (401, {}, False),
        (422, {}, False),
    ],
)
def test_only_5xx_and_a_429_that_says_when_are_resent(
    status: int, headers: dict[str, str], resend: bool
) -> None:
    assert should_resend(httpx.Response(status, headers=headers)) is resend
