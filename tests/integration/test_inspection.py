"""Read-only inspection (services.inspection) on the real ledger: history folded from
verified events, and the cross-tenant operator listing.

Spec "Replay and time-travel semantics": history only folds stored events; it never
invokes an adapter, so these tests assert the target saw no request and no lookup.
"""

from __future__ import annotations

import pytest

from effect_broker.domain.errors import InvalidRequestError, TenantNotFoundError
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.services import inspection, resolution
from tests.integration.conftest import make_operator

S = EffectStatus
IDEMPOTENT = SafetyClass.IDEMPOTENT
UNSAFE = SafetyClass.UNSAFE
PROOF = {
    "source": "dashboard",
    "reference": "ch_777",
    "charge_id": "ch_777",
    "note": "secret-card-4242",
}


def test_history_folds_events_at_any_sequence_without_touching_the_target(bench) -> None:
    record = bench.unknown_outcome(UNSAFE)
    done = resolution.resolve_succeeded(
        bench.tenant,
        record.effect_id,
        operator=make_operator("alice"),
        reason="seen",
        evidence=PROOF,
    )
    target = bench.targets[UNSAFE]
    calls_before = (target.requests, target.lookups)
    expected = [
        "prepared",
        "dispatching",
        "outcome_unknown",
        "manual_review",
        "succeeded",
    ]
    for sequence, status in enumerate(expected, start=1):
        folded = inspection.history(bench.tenant, record.effect_id, sequence)
        assert (folded.status.value, folded.version) == (status, sequence)
        assert [e.facts.sequence for e in folded.events] == list(range(1, sequence + 1))
        assert folded.latest_sequence == done.version
    latest = inspection.history(bench.tenant, record.effect_id)
    assert (latest.at_sequence, latest.status) == (done.version, S.SUCCEEDED)
    assert (target.requests, target.lookups) == calls_before
    for bad in (0, done.version + 1):
        with pytest.raises(InvalidRequestError, match="at_sequence"):
            inspection.history(bench.tenant, record.effect_id, bad)


def test_operator_listing_crosses_tenants_and_flags_what_needs_an_operator(
    bench,
) -> None:
    stuck = bench.unknown_outcome(UNSAFE)
    automatic = bench.unknown_outcome(IDEMPOTENT)
    rows = inspection.list_for_operators(status=S.OUTCOME_UNKNOWN)
    flags = {row.effect.effect_id: row.needs_operator for row in rows}
    assert flags == {stuck.effect_id: True, automatic.effect_id: False}
    assert {row.tenant_name for row in rows} == {bench.tenant.name}
    assert inspection.list_for_operators(tenant_name=bench.tenant.name, tool="nope") == []
    with pytest.raises(TenantNotFoundError):
        inspection.list_for_operators(tenant_name="no-such-tenant")
    assert inspection.tenant_of(stuck.effect_id) == bench.tenant
