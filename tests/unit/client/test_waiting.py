"""``wait``, ``perform`` and the ``effect`` decorator, over a fake client: an unknown
outcome is raised plainly as OutcomeUnknown - never a result, never EffectFailed."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

import pytest

from effect_broker.client import (
    EffectCompensated,
    EffectFailed,
    OutcomeUnknown,
    PayloadConflict,
    WaitTimeout,
    waiting,
)
from effect_broker.client.base import AsyncBrokerOps, SyncBrokerOps
from effect_broker.client.models import Effect, History, Receipt
from tests.unit.client.conftest import FakeClock, effect_json, receipt_json

_NEW_KEY_ADVICE = re.compile(
    r"(new|different|fresh|another)\s+(operation[ _])?key", re.IGNORECASE
)


class FakeBroker(SyncBrokerOps):
    """Answers get() from a list of statuses (the last one repeats)."""

    def __init__(
        self, clock: FakeClock, statuses: list[str], safety: str = "idempotent"
    ) -> None:
        self._sleep = clock.sleep
        self._monotonic = clock.monotonic
        self.statuses = statuses
        self.safety = safety
        self.submitted: list[tuple[str, str, dict[str, Any]]] = []
        self.reads = 0

    def _effect(self, status: str, **flags: Any) -> Effect:
        return Effect.from_wire(effect_json(status, self.safety, **flags))

    def submit(self, operation_key, tool, arguments, *, trace_id=None, requested_by=""):
        self.submitted.append((operation_key, tool, dict(arguments)))
        return self._effect("prepared", created=True, replayed=False)

    def get(self, effect_id: str) -> Effect:
        status = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        return self._effect(status)

    def receipt(self, effect_id: str) -> Receipt:
        return Receipt.from_wire(receipt_json({"charge_id": "ch_1"}))

    def history(self, effect_id: str, at_sequence: int | None = None) -> History:
        raise NotImplementedError


class AsyncFakeBroker(AsyncBrokerOps):
    """The async twin, over the same script."""

    def __init__(self, fake: FakeBroker, clock: FakeClock) -> None:
        self.fake = fake
        self._sleep = clock.asleep
        self._monotonic = clock.monotonic

    async def submit(
        self, operation_key, tool, arguments, *, trace_id=None, requested_by=""
    ):
        return self.fake.submit(operation_key, tool, arguments)

    async def get(self, effect_id: str) -> Effect:
        return self.fake.get(effect_id)

    async def receipt(self, effect_id: str) -> Receipt:
        return self.fake.receipt(effect_id)

    async def history(self, effect_id: str, at_sequence: int | None = None) -> History:
        raise NotImplementedError


def test_wait_returns_the_effect_once_it_settles(clock) -> None:
    broker = FakeBroker(clock, ["prepared", "dispatching", "succeeded"])
    assert broker.wait("e", timeout=5).status == "succeeded"
    assert broker.reads == 3
    assert clock.sleeps == pytest.approx([0.05, 0.075])


def test_an_unsafe_unknown_outcome_is_raised_at_once(clock) -> None:
    # Nothing automatic settles an unsafe effect: waiting longer cannot help.
    broker = FakeBroker(clock, ["dispatching", "outcome_unknown"], safety="unsafe")
    with pytest.raises(OutcomeUnknown) as error:
        broker.wait("e", timeout=60)
    assert error.value.needs_operator is True
    assert error.value.effect is not None
    assert error.value.effect.status == "outcome_unknown"
    assert (error.value.code, broker.reads) == ("outcome_unknown", 2)
    message = str(error.value)
    assert "nobody knows yet" in message
    assert "an operator must" in message
    assert "order:42:charge:v1" in message
    assert not _NEW_KEY_ADVICE.search(message)


def test_manual_review_is_raised_as_an_unknown_outcome(clock) -> None:
    broker = FakeBroker(clock, ["manual_review"], safety="idempotent")
    with pytest.raises(OutcomeUnknown) as error:
        broker.wait("e", timeout=60)
    assert error.value.needs_operator is True
    assert error.value.extras["effect_status"] == "manual_review"


def test_a_reconcilable_unknown_outcome_is_waited_through(clock) -> None:
    # The broker probes the target; the lookup finds the charge.
    broker = FakeBroker(
        clock, ["outcome_unknown", "reconciling", "succeeded"], safety="reconcilable"
    )
    assert broker.wait("e", timeout=5).status == "succeeded"


def test_running_out_of_time_while_reconciling_is_an_unknown_outcome(clock) -> None:
    broker = FakeBroker(clock, ["reconciling"], safety="reconcilable")
    with pytest.raises(OutcomeUnknown) as error:
        broker.wait("e", timeout=1.0)
    assert error.value.needs_operator is False
    assert "still reconciling" in str(error.value)
    assert clock.now == pytest.approx(1.0)


def test_running_out_of_time_while_in_progress_is_a_wait_timeout(clock) -> None:
    broker = FakeBroker(clock, ["dispatching"])
    with pytest.raises(WaitTimeout) as error:
        broker.wait("e", timeout=0.5)
    assert error.value.effect.status == "dispatching"
    assert "order:42:charge:v1" in str(error.value)
    assert clock.now == pytest.approx(0.5)


def test_perform_returns_the_receipt_result(clock) -> None:
    broker = FakeBroker(clock, ["succeeded"])
    assert broker.perform("k:1", tool="charge_card", arguments={"a": 1}) == {
        "charge_id": "ch_1"
    }


@pytest.mark.parametrize(
    ("status", "error"),
    [("failed_final", EffectFailed), ("compensated", EffectCompensated)],
)
def test_perform_raises_for_a_settled_effect_that_did_not_succeed(
    clock, status, error
) -> None:
    with pytest.raises(error):
        FakeBroker(clock, [status]).perform("k:1", tool="charge_card", arguments={"a": 1})


@pytest.mark.parametrize(
    ("wire", "says", "never_says"),
    [
        # Refused (or never sent) and nothing in doubt: proof it did not happen
        ({}, "holds proof that it did not take effect", "operator"),
        (
            {"outcome_in_doubt": False},
            "holds proof that it did not take effect",
            "operator",
        ),
        # An operator's "resolve failed" on an effect in doubt: no proof either way
        (
            {"outcome_in_doubt": True},
            "nothing proved that it did not take effect",
            "holds proof",
        ),
    ],
    ids=["older-broker", "proved", "operator-without-proof"],
)
def test_effect_failed_says_what_is_known(
    clock, wire: dict[str, Any], says: str, never_says: str
) -> None:
    # Issue 19, item 1: failed_final is proof only when no attempt was in doubt
    effect = Effect.from_wire(effect_json("failed_final", **wire))
    with pytest.raises(EffectFailed) as caught:
        waiting.result_of(effect)
    assert says in str(caught.value)
    assert never_says not in str(caught.value)
    assert caught.value.effect.outcome_in_doubt is (wire.get("outcome_in_doubt") is True)


def test_the_decorator_submits_named_arguments_under_the_key(clock) -> None:
    broker = FakeBroker(clock, ["succeeded"])

    @broker.effect(tool="charge_card", key=lambda order, **_: f"order:{order}:charge:v1")
    def charge_card(order: str, amount_minor: int, currency: str = "EUR", **extra: Any):
        raise AssertionError("the body never runs")

    result = charge_card("42", amount_minor=1999, note="gift")
    assert result == {"charge_id": "ch_1"}
    assert broker.submitted == [
        (
            "order:42:charge:v1",
            "charge_card",
            {"order": "42", "amount_minor": 1999, "currency": "EUR", "note": "gift"},
        )
    ]
    assert charge_card.__name__ == "charge_card"


def test_the_decorator_can_shape_the_arguments(clock) -> None:
    broker = FakeBroker(clock, ["succeeded"])

    def wire(order: str, cents: int) -> Mapping[str, Any]:
        return {"order": order, "amount_minor": cents, "currency": "EUR"}

    @broker.effect(
        tool="charge_card", key=lambda order, **_: f"o:{order}", arguments=wire
    )
    def charge(order: str, cents: int) -> dict: ...

    charge("7", 100)
    assert broker.submitted[0][2] == {
        "order": "7",
        "amount_minor": 100,
        "currency": "EUR",
    }


def test_the_decorator_raises_an_unknown_outcome_plainly(clock) -> None:
    broker = FakeBroker(clock, ["outcome_unknown"], safety="unsafe")

    @broker.effect(tool="charge_card", key=lambda order: f"order:{order}:charge:v1")
    def charge(order: str) -> dict: ...

    with pytest.raises(OutcomeUnknown):
        charge("42")


def test_the_decorator_lets_a_payload_conflict_through(clock) -> None:
    class Conflicting(FakeBroker):
        def submit(self, *args: Any, **kwargs: Any) -> Effect:
            raise PayloadConflict("Inspect the existing effect e1", status=409)

    @Conflicting(clock, ["succeeded"]).effect(tool="t", key=lambda x: f"k:{x}")
    def call(x: int) -> dict: ...

    with pytest.raises(PayloadConflict):
        call(1)


def test_the_decorator_refuses_what_it_cannot_name(clock) -> None:
    broker = FakeBroker(clock, ["succeeded"])
    with pytest.raises(TypeError, match="need names"):

        @broker.effect(tool="t", key=lambda **_: "k")
        def positional(*items: int) -> dict: ...

    with pytest.raises(TypeError, match="AsyncBrokerClient"):

        @broker.effect(tool="t", key=lambda **_: "k")
        async def coroutine(x: int) -> dict: ...


def test_the_async_decorator_works_on_async_functions(clock) -> None:
    fake = FakeBroker(clock, ["dispatching", "succeeded"])
    broker = AsyncFakeBroker(fake, clock)

    @broker.effect(tool="charge_card", key=lambda order, **_: f"order:{order}:charge:v1")
    async def charge_card(order: str, amount_minor: int) -> dict: ...

    assert asyncio.run(charge_card("42", 1999)) == {"charge_id": "ch_1"}
    assert fake.submitted[0][0] == "order:42:charge:v1"
    with pytest.raises(TypeError, match="BrokerClient"):

        @broker.effect(tool="t", key=lambda **_: "k")
        def plain(x: int) -> dict: ...


def test_the_async_wait_raises_an_unknown_outcome_plainly(clock) -> None:
    broker = AsyncFakeBroker(FakeBroker(clock, ["manual_review"]), clock)
    with pytest.raises(OutcomeUnknown):
        asyncio.run(broker.wait("e", timeout=5))


def test_perform_in_the_old_order_is_a_type_error_that_shows_the_new_call(clock) -> None:
    # Issue 23: perform(tool, operation_key, ...) ran the reverse of submit's order,
    # and the natural positional call failed with UnknownContract
    broker = FakeBroker(clock, ["succeeded"])
    with pytest.raises(TypeError, match=r"perform\(operation_key, tool=\.\.\., "):
        broker.perform("charge_card", "k:1", {"a": 1})  # type: ignore[misc]
    with pytest.raises(TypeError, match="by keyword"):
        broker.perform("k:1")  # type: ignore[call-arg]
    assert broker.submitted == []  # nothing was submitted


# --- until="settled" and on_unknown="wait": waiting for a person (issue 23, item 3) -----


@pytest.mark.parametrize("status", ["outcome_unknown", "manual_review"])
def test_waiting_until_settled_rides_out_an_operator_decision(clock, status) -> None:
    # Given an effect only an operator can settle, resolved on the fourth read
    broker = FakeBroker(clock, ["dispatching", status, status, "succeeded"], "unsafe")
    # When the caller waits until it is settled, Then it returns the settled effect
    assert broker.wait("e", timeout=60, until="settled").status == "succeeded"
    assert broker.reads == 4
    # and, without a long-poll, reads every POLL_OPERATOR seconds while a person decides
    operator = waiting.POLL_OPERATOR
    assert clock.sleeps == pytest.approx([0.05, operator, operator])


def test_the_default_wait_still_raises_at_once_for_an_operator(clock) -> None:
    broker = FakeBroker(clock, ["outcome_unknown", "succeeded"], safety="unsafe")
    with pytest.raises(OutcomeUnknown):
        broker.wait("e", timeout=60)
    with pytest.raises(OutcomeUnknown):
        FakeBroker(clock, ["outcome_unknown"], "unsafe").wait("e", 60, until="answer")
    assert broker.reads == 1


def test_an_operator_failure_ends_a_settled_wait_as_the_final_failure(clock) -> None:
    # The operator resolved the unknown outcome as failed: a final state, no proof
    broker = FakeBroker(clock, ["outcome_unknown", "failed_final"], safety="unsafe")
    with pytest.raises(EffectFailed) as error:
        broker.perform("k:1", tool="charge_card", arguments={"a": 1}, on_unknown="wait")
    assert error.value.effect.status == "failed_final"
    assert broker.reads == 2


def test_perform_on_unknown_wait_returns_the_result_once_resolved(clock) -> None:
    broker = FakeBroker(clock, ["outcome_unknown", "succeeded"], safety="unsafe")
    result = broker.perform(
        "k:1", tool="charge_card", arguments={"a": 1}, on_unknown="wait", timeout=60
    )
    assert result == {"charge_id": "ch_1"}


@pytest.mark.parametrize("status", ["outcome_unknown", "manual_review"])
def test_a_settled_wait_that_runs_out_before_the_operator_is_still_unknown(
    clock, status
) -> None:
    # Never a result and never a failure: nobody knows yet
    broker = FakeBroker(clock, [status], safety="unsafe")
    with pytest.raises(OutcomeUnknown) as error:
        broker.wait("e", timeout=12, until="settled")
    assert error.value.needs_operator is True
    assert error.value.effect.status == status
    assert "No operator had after 12s" in str(error.value)
    assert not _NEW_KEY_ADVICE.search(str(error.value))
    assert clock.now == pytest.approx(12)


def test_a_settled_wait_that_runs_out_while_in_progress_is_a_wait_timeout(clock) -> None:
    broker = FakeBroker(clock, ["dispatching"])
    with pytest.raises(WaitTimeout):
        broker.wait("e", timeout=0.5, until="settled")


def test_a_state_that_is_neither_final_nor_an_operators_keeps_every_wait_going(
    clock,
) -> None:
    # A state a later release adds (issue 24's approval) or one of today's in-progress
    # states: neither kind of wait ends there, and running out is a WaitTimeout
    pending = "awaiting_approval"
    for until in ("answer", "settled"):
        broker = FakeBroker(clock, [pending, pending, "succeeded"])
        assert broker.wait("e", timeout=60, until=until).status == "succeeded"
        with pytest.raises(WaitTimeout):
            FakeBroker(clock, [pending]).wait("e", 1, until=until)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda b: b.wait("e", until="resolved"), ValueError, "'answer'"),
        (lambda b: b.wait("e", until=True), TypeError, "until must be"),
        (
            lambda b: b.perform("k", tool="t", arguments={}, on_unknown="ignore"),
            ValueError,
            "on_unknown must be 'raise'",
        ),
        (
            lambda b: b.perform("k", tool="t", arguments={}, on_unknown=None),
            TypeError,
            "on_unknown must be",
        ),
        (
            lambda b: b.effect(tool="t", key=lambda **_: "k", on_unknown="later")(
                lambda x: None
            ),
            ValueError,
            "on_unknown must be",
        ),
    ],
    ids=["until-value", "until-type", "on-unknown-value", "on-unknown-type", "decorator"],
)
def test_an_unknown_way_to_wait_is_refused_before_anything_is_sent(
    clock, call, error, message
) -> None:
    broker = FakeBroker(clock, ["succeeded"])
    with pytest.raises(error, match=message):
        call(broker)
    assert (broker.submitted, broker.reads) == ([], 0)


def test_the_async_wait_and_perform_wait_for_the_operator_too(clock) -> None:
    fake = FakeBroker(clock, ["manual_review", "succeeded"], safety="unsafe")
    broker = AsyncFakeBroker(fake, clock)
    assert asyncio.run(broker.wait("e", timeout=60, until="settled")).settled
    fake.reads = 0
    assert asyncio.run(
        broker.perform("k:1", tool="t", arguments={}, on_unknown="wait", timeout=60)
    ) == {"charge_id": "ch_1"}
    with pytest.raises(OutcomeUnknown):
        asyncio.run(
            AsyncFakeBroker(FakeBroker(clock, ["manual_review"]), clock).wait(
                "e", timeout=60, until="answer"
            )
        )


def test_the_decorator_can_wait_for_the_operator(clock) -> None:
    broker = FakeBroker(clock, ["outcome_unknown", "succeeded"], safety="unsafe")

    @broker.effect(tool="charge_card", key=lambda order: f"o:{order}", on_unknown="wait")
    def charge(order: str) -> dict: ...

    assert charge("42") == {"charge_id": "ch_1"}
