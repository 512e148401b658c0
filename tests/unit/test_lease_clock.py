"""The send gate counts a suspend of the host (issue 19, item 4c).

``time.monotonic()`` (CLOCK_MONOTONIC on Linux) does not advance while the host is
suspended - a laptop lid, a VM paused with suspend - so a host resumed after its lease
ran out found its claim as young as when it stopped, and sent. The gate now counts
leases on CLOCK_BOOTTIME, which does. A suspend is simulated by moving CLOCK_BOOTTIME
alone, as the kernel does: CLOCK_MONOTONIC stays where it was.
"""

from __future__ import annotations

import math
import sys
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from effect_broker.adapters.base import SendGate
from effect_broker.adapters.conformance import make_effect_record
from effect_broker.adapters.http_attempt import AttemptGuard
from effect_broker.domain import clock
from effect_broker.domain.clock import SystemClock
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import SendRefusedError
from effect_broker.domain.states import SafetyClass
from effect_broker.services.lease import LeaseKeeper
from effect_broker.services.runtime import EngineTiming

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="CLOCK_BOOTTIME is Linux's"
)

SUSPEND = 60.0


@pytest.fixture
def suspend(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``suspend(seconds)``: the host was suspended that long (BOOTTIME moves only)."""
    real = time.clock_gettime
    slept = [0.0]

    def after_suspend(clock_id: int) -> float:
        value = real(clock_id)
        return value + slept[0] if clock_id == time.CLOCK_BOOTTIME else value

    monkeypatch.setattr(time, "clock_gettime", after_suspend)

    def suspend(seconds: float) -> None:
        slept[0] += seconds

    return suspend


def keeper(lease: float = 30, margin: float = 2) -> LeaseKeeper:
    """The production gate of one attempt, on the system clock, claimed just now."""
    contract = EffectContract(
        name="clock.test",
        version="1",
        tool="charge",
        safety=SafetyClass.UNSAFE,
        adapter="simulated",
    )
    rt: Any = SimpleNamespace(
        clock=SystemClock(),
        timing=EngineTiming(
            lease=timedelta(seconds=lease), send_margin=timedelta(seconds=margin)
        ),
    )
    return LeaseKeeper(
        rt,
        make_effect_record(contract, "order:42", {}, "key"),
        worker="w1",
        claimed_at=rt.clock.monotonic(),
        attempt_limit=timedelta(seconds=lease - margin),
    )


@linux_only
def test_the_gate_clock_on_linux_is_clock_boottime() -> None:
    assert clock.LEASE_CLOCK_NAME == "CLOCK_BOOTTIME"
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    reading = SystemClock().monotonic()
    assert before <= reading <= time.clock_gettime(time.CLOCK_BOOTTIME)


@linux_only
def test_a_host_resumed_after_its_lease_ran_out_does_not_send(suspend: Any) -> None:
    # Given a worker that claimed an effect with a 30 s lease and can prove it now
    gate = keeper(lease=30, margin=2)
    gate.check()
    monotonic_before = time.monotonic()

    # When the host is suspended for a minute and resumes (time.monotonic() did not
    # count the minute: the old gate's clock)
    suspend(SUSPEND)
    assert time.monotonic() - monotonic_before < 5

    # Then the gate refuses: the lease cannot be proved, nothing is sent
    with pytest.raises(SendRefusedError) as caught:
        gate.check()
    assert caught.value.details["reason"] in {"lease_unproven", "attempt_time_limit"}
    assert gate.remaining() == 0.0


@linux_only
def test_the_attempt_deadline_at_the_wire_counts_a_suspend_too(suspend: Any) -> None:
    # Given an attempt with 10 s left, checked at the socket by its guard
    class Lenient:
        def check(self) -> None:
            """Never refuses: only the guard's own deadline is under test."""

        def remaining(self) -> float:
            return 10.0

    gate: SendGate = Lenient()
    guard = AttemptGuard(gate)
    guard.check_before_write()

    # When the host is suspended past that deadline
    suspend(SUSPEND)

    # Then the guard finds the time spent and refuses the write
    assert guard.spent()
    with pytest.raises(SendRefusedError):
        guard.check_before_write()


def test_elsewhere_the_gate_says_which_clock_it_uses() -> None:
    # The README names the clock per platform; the module names the one in use.
    assert clock.LEASE_CLOCK_NAME in {
        "CLOCK_BOOTTIME",
        "CLOCK_MONOTONIC_RAW",
        "time.monotonic",
    }
    assert math.isfinite(clock.lease_seconds())
