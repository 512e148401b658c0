"""Issue 24 in the SDK: an effect awaiting an operator's approval is neither settled
nor an unknown outcome - nothing was sent - so ``wait`` keeps waiting through it, and
the caller sees until when (``approval_deadline``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from effect_broker.client import WaitTimeout
from effect_broker.client.models import APPROVAL_STATUSES, Effect
from effect_broker.client.waiting import POLL_OPERATOR, next_pause, poll_intervals
from tests.unit.client.conftest import FakeClock, effect_json
from tests.unit.client.test_waiting import FakeBroker

DEADLINE = "2026-12-03T22:00:00Z"


def test_the_deadline_is_read_from_the_wire_and_absent_otherwise() -> None:
    waiting = Effect.from_wire(
        effect_json("awaiting_approval", approval_deadline=DEADLINE)
    )
    assert waiting.status in APPROVAL_STATUSES
    assert waiting.approval_deadline == datetime(2026, 12, 3, 22, 0, tzinfo=UTC)
    assert not waiting.settled
    assert not waiting.needs_operator  # not an unknown outcome: nothing was sent
    # A broker that predates the field, and any other status, say nothing
    assert Effect.from_wire(effect_json("prepared")).approval_deadline is None


def test_wait_waits_through_the_approval_then_returns_the_outcome(
    clock: FakeClock,
) -> None:
    broker = FakeBroker(
        clock, ["awaiting_approval", "awaiting_approval", "prepared", "succeeded"]
    )
    assert broker.wait("e", timeout=30).status == "succeeded"
    assert broker.reads == 4


def test_a_wait_shorter_than_the_approval_is_a_wait_timeout(clock: FakeClock) -> None:
    broker = FakeBroker(clock, ["awaiting_approval"])
    with pytest.raises(WaitTimeout) as ran_out:
        broker.wait("e", timeout=2)
    assert ran_out.value.effect is not None
    assert ran_out.value.effect.status == "awaiting_approval"
    assert "awaiting_approval" in str(ran_out.value)


def test_while_it_awaits_approval_the_reads_are_paced_for_a_person() -> None:
    # The broker answers a long-poll at once for an effect awaiting approval, so the
    # client's own pause is all that spaces the reads: a person's pace, not 1 Hz.
    waiting = Effect.from_wire(
        effect_json("awaiting_approval", approval_deadline=DEADLINE)
    )
    running = Effect.from_wire(effect_json("dispatching"))
    assert next_pause(poll_intervals(), waiting) >= POLL_OPERATOR
    assert next_pause(poll_intervals(), running) < POLL_OPERATOR
