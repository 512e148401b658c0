"""What a pause covers and what it holds (issue 24, item 7; domain/pauses.py)."""

from __future__ import annotations

import pytest

from effect_broker.domain.errors import InvalidRequestError
from effect_broker.domain.pauses import PauseScope, holds, parse_contract_ref
from effect_broker.domain.states import EffectStatus, SafetyClass

FACTS = {
    "tool": "charge_card",
    "contract_name": "payments.charge",
    "contract_version": "2",
    "tenant_id": "t-1",
}


@pytest.mark.parametrize(
    ("scope", "covered"),
    [
        (PauseScope(tool="charge_card"), True),
        (PauseScope(tool="refund"), False),
        (PauseScope(contract_name="payments.charge"), True),
        (PauseScope(contract_name="payments.charge", contract_version="2"), True),
        (PauseScope(contract_name="payments.charge", contract_version="1"), False),
        (PauseScope(tenant_id="t-1"), True),
        (PauseScope(tenant_id="t-2"), False),
        (PauseScope(tool="charge_card", tenant_id="t-1"), True),
        (PauseScope(tool="charge_card", tenant_id="t-2"), False),
    ],
)
def test_every_scope_field_given_must_match(scope: PauseScope, covered: bool) -> None:
    assert scope.covers(**FACTS) is covered


def test_a_pause_needs_a_scope_and_a_version_needs_its_name() -> None:
    with pytest.raises(InvalidRequestError, match="needs a scope"):
        PauseScope()
    with pytest.raises(InvalidRequestError, match="NAME@VERSION"):
        PauseScope(tool="x", contract_version="1")
    with pytest.raises(InvalidRequestError, match="whitespace"):
        PauseScope(tool=" x")


@pytest.mark.parametrize(
    ("status", "safety", "held"),
    [
        (EffectStatus.PREPARED, SafetyClass.UNSAFE, True),
        (EffectStatus.RETRYABLE, SafetyClass.RECONCILABLE, True),
        # A same-key resend can create the charge: held.
        (EffectStatus.OUTCOME_UNKNOWN, SafetyClass.IDEMPOTENT, True),
        # A lookup only reads, and settles what was sent: never held.
        (EffectStatus.OUTCOME_UNKNOWN, SafetyClass.RECONCILABLE, False),
        (EffectStatus.OUTCOME_UNKNOWN, SafetyClass.UNSAFE, False),
        # In flight: it finishes.
        (EffectStatus.DISPATCHING, SafetyClass.IDEMPOTENT, False),
        (EffectStatus.RECONCILING, SafetyClass.IDEMPOTENT, False),
        (EffectStatus.SUCCEEDED, SafetyClass.IDEMPOTENT, False),
        (EffectStatus.MANUAL_REVIEW, SafetyClass.IDEMPOTENT, False),
    ],
)
def test_a_pause_holds_only_sends_that_have_not_started(
    status: EffectStatus, safety: SafetyClass, held: bool
) -> None:
    assert holds(status, safety) is held


def test_scopes_read_as_words() -> None:
    assert PauseScope(tool="charge_card").describe() == "tool charge_card"
    assert (
        PauseScope(tool="charge_card", tenant_id="t").describe("acme")
        == "tool charge_card for tenant acme"
    )
    assert PauseScope(tenant_id="t").describe() == "this tenant"
    assert (
        PauseScope(contract_name="p", contract_version="2").describe() == "contract p@2"
    )


def test_contract_references_are_name_or_name_at_version() -> None:
    assert parse_contract_ref("payments.charge") == ("payments.charge", None)
    assert parse_contract_ref("payments.charge@2") == ("payments.charge", "2")
    for bad in ("@2", "payments.charge@", ""):
        with pytest.raises(InvalidRequestError):
            parse_contract_ref(bad)
