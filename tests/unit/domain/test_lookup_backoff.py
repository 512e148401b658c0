"""Issue 22, item 4: lookups back off - a growing delay up to a cap, jittered.

Before, every inconclusive lookup was retried after ``backoff(1)``: a target whose
lookup stays slow was asked at the same short interval until the window closed.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.states import SafetyClass

CONTRACT = EffectContract(
    name="c",
    version="1",
    tool="c",
    safety=SafetyClass.RECONCILABLE,
    settlement_bound=timedelta(seconds=1),
    backoff_initial=timedelta(seconds=1),
    backoff_max=timedelta(seconds=30),
)


def next_waits(jitter: float, lookups: int) -> list[float]:
    waited, delays = timedelta(0), []
    for _ in range(lookups):
        delay = CONTRACT.lookup_backoff(waited, jitter)
        delays.append(delay.total_seconds())
        waited += delay
    return delays


def test_delays_grow_until_the_cap() -> None:
    # Given no jitter at its top (the full delay), successive inconclusive lookups
    delays = next_waits(0.999999, 8)
    # Then each waits about as long as all before it, up to backoff_max
    assert [round(d) for d in delays] == [1, 1, 2, 4, 8, 16, 30, 30]


def test_jitter_keeps_half_and_spreads_the_rest() -> None:
    waited = timedelta(seconds=10)
    assert CONTRACT.lookup_backoff(waited, 0.0) == timedelta(seconds=5)
    assert CONTRACT.lookup_backoff(waited, 0.5) == timedelta(seconds=7.5)
    # and never below half of backoff_initial, never above backoff_max
    assert CONTRACT.lookup_backoff(timedelta(0), 0.0) == timedelta(seconds=0.5)
    assert CONTRACT.lookup_backoff(timedelta(days=1), 0.999999) <= timedelta(seconds=30)


def test_even_the_smallest_jitter_grows() -> None:
    delays = next_waits(0.0, 12)
    assert delays[-1] == 15.0
    assert all(b >= a for a, b in itertools.pairwise(delays))
    assert delays[-1] > 10 * delays[0]


@pytest.mark.parametrize("jitter", [-0.1, 1.0])
def test_a_jitter_outside_the_unit_interval_is_refused(jitter: float) -> None:
    with pytest.raises(ValueError, match="jitter must be in"):
        CONTRACT.lookup_backoff(timedelta(0), jitter)
