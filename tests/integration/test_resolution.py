"""Operator resolution (services.resolution) on the real ledger.

Spec "HTTP, CLI, and MCP surfaces": three explicit choices, no "retry anyway" for unsafe
effects. Negative tests assert that nothing changed: status, version, events, receipts,
scheduled jobs and requests at the target. Operators are staff users holding
``effect_broker.resolve_effect`` (issue 9, defect 5); per-class rules for not_committed
and forks are in ``test_operator_authority.py``.
"""

from __future__ import annotations

import json
import logging

import pytest

from effect_broker import store
from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.errors import (
    EffectNotFoundError,
    IllegalTransitionError,
    InvalidRequestError,
    OperatorForbiddenError,
    StaleWriteError,
)
from effect_broker.domain.keys import digest_hex
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectReceipt
from effect_broker.services import forking, inspection, resolution
from effect_broker.services.dispatch import dispatch
from effect_broker.services.reconcile import reconcile
from effect_broker.store import load_effect_for_worker, load_events, verify_event_chain
from tests.integration.conftest import make_operator
from tests.integration.engine.harness import Bench

S = EffectStatus
IDEMPOTENT = SafetyClass.IDEMPOTENT
UNSAFE = SafetyClass.UNSAFE
PROOF = {
    "source": "dashboard",
    "reference": "ch_777",
    "charge_id": "ch_777",
    "note": "secret-card-4242",
}
NOT_THERE = {"source": "target export", "checked_at": "2026-06-01T12:05:00+00:00"}
#: Has the members of every resolution's shape (for refusals that must come from state).
ANY_SHAPE = {**NOT_THERE, "reference": "r-1"}


def in_manual_review(bench: Bench) -> EffectRecord:
    """An idempotent effect whose key retention lapsed while its outcome was unknown."""
    record = bench.unknown_outcome(IDEMPOTENT, Fault.TIMEOUT_BEFORE_COMMIT)
    bench.advance(3600 - 30)  # inside the retention safety margin
    after = reconcile(record.effect_id, worker="w2")
    assert after.status is S.MANUAL_REVIEW
    return after


def snapshot(bench: Bench, record: EffectRecord) -> tuple[object, ...]:
    """Everything a refused resolution must leave exactly as it was."""
    now = load_effect_for_worker(record.effect_id)
    target = bench.targets.get(record.safety)
    return (
        now.status,
        now.version,
        now.attempt_count,
        now.next_action_at,
        len(load_events(record.effect_id)),
        EffectReceipt.objects.filter(effect_id=record.effect_id).count(),
        len(bench.scheduler.requests),
        target.requests if target else None,
    )


def tail(record: EffectRecord, n: int) -> list[tuple[str, str | None, str, str]]:
    events = load_events(record.effect_id)[-n:]
    return [
        (e.facts.event_type, e.facts.old_status, e.facts.new_status, e.facts.actor)
        for e in events
    ]


# --- proof of success -------------------------------------------------------------


def test_success_from_unknown_passes_review_and_writes_exactly_one_receipt(
    bench, caplog
) -> None:
    # Given an unsafe effect whose response was lost after the target committed
    record = bench.unknown_outcome(UNSAFE)
    jobs_before = list(bench.scheduler.requests)
    caplog.set_level(logging.INFO, logger="effect_broker")
    # When an operator attaches proof of success
    done = resolution.resolve_succeeded(
        bench.tenant,
        record.effect_id,
        operator=make_operator("alice"),
        reason="charge visible in the dashboard",
        evidence=PROOF,
        external_id="ch_777",
    )
    # Then two events in one go (there is no direct edge out of outcome_unknown) ...
    assert done.status is S.SUCCEEDED
    assert done.version == record.version + 2
    assert tail(done, 2) == [
        ("operator_review_started", "outcome_unknown", "manual_review", "alice"),
        ("resolved_succeeded", "manual_review", "succeeded", "alice"),
    ]
    final = load_events(done.effect_id)[-1].facts.metadata
    digest = digest_hex(canonical_json(PROOF))
    assert final["reason"] == "charge visible in the dashboard"
    assert final["evidence_digest"] == digest
    assert final["receipt_id"] == done.receipt_id
    assert verify_event_chain(done.effect_id) == done.version
    # ... exactly one receipt, the evidence encrypted as its result
    receipt_row = EffectReceipt.objects.get(effect_id=done.effect_id)
    assert str(receipt_row.id) == done.receipt_id
    assert receipt_row.evidence_digest == digest
    assert b"secret-card-4242" not in bytes(receipt_row.result_ciphertext)
    receipt = inspection.get_receipt(bench.tenant, done.effect_id)
    assert receipt.result == PROOF
    assert receipt.external_id == "ch_777"
    assert "note" not in receipt.result_preview  # not even its name (issue 12)
    assert receipt.result_preview["$hidden_fields"] >= 1
    # ... nothing was sent or scheduled, and raw evidence is in no event and no log
    assert bench.targets[UNSAFE].requests == 1
    assert bench.scheduler.requests == jobs_before
    stored = json.dumps([dict(e.facts.metadata) for e in load_events(done.effect_id)])
    assert "secret-card-4242" not in stored
    resolved_logs = [r for r in caplog.records if r.getMessage() == "operator resolution"]
    assert [r.__dict__["evidence_digest"] for r in resolved_logs] == [digest]
    assert all("secret-card-4242" not in str(r.__dict__) for r in caplog.records)


def test_success_from_manual_review_is_one_event(bench) -> None:
    record = in_manual_review(bench)
    done = resolution.resolve_succeeded(
        bench.tenant,
        record.effect_id,
        operator=make_operator("bob"),
        reason="found it",
        evidence=PROOF,
    )
    assert done.version == record.version + 1
    assert tail(done, 1) == [("resolved_succeeded", "manual_review", "succeeded", "bob")]
    assert EffectReceipt.objects.filter(effect_id=done.effect_id).count() == 1


@pytest.mark.parametrize(
    ("reason", "evidence", "missing"),
    [
        ("seen", {}, "source,reference"),
        ("  ", PROOF, None),
        ("seen", {"charge_id": "ch_777"}, "source"),
        ("seen", {"source": "dashboard", "reference": " "}, "reference"),
    ],
    ids=["no-evidence", "blank-reason", "no-source", "blank-reference"],
)
def test_success_without_proof_of_its_shape_or_a_reason_is_refused(
    bench, reason, evidence, missing
) -> None:
    record = bench.unknown_outcome(UNSAFE)
    before = snapshot(bench, record)
    with pytest.raises(InvalidRequestError) as refused:
        resolution.resolve_succeeded(
            bench.tenant,
            record.effect_id,
            operator=make_operator("alice"),
            reason=reason,
            evidence=evidence,
        )
    assert refused.value.details.get("missing") == missing
    assert snapshot(bench, record) == before


@pytest.mark.parametrize(
    "who",
    ["nobody", "not-staff", "no-permission", "inactive"],
)
def test_only_an_active_staff_user_with_the_permission_may_resolve(bench, who) -> None:
    # Given an unsafe effect whose outcome is unknown
    record = bench.unknown_outcome(UNSAFE)
    before = snapshot(bench, record)
    user = {
        "nobody": None,
        "not-staff": make_operator("agent", staff=False),
        "no-permission": make_operator("clerk", permitted=False),
        "inactive": make_operator("gone"),
    }[who]
    if who == "inactive":
        user.is_active = False
        user.save()
    # When that user tries each resolution, then it is refused and nothing changes
    for choice in resolution.Resolution:
        with pytest.raises(OperatorForbiddenError):
            resolution.resolve(
                bench.tenant,
                record.effect_id,
                choice,
                operator=user,
                reason="r",
                evidence=ANY_SHAPE,
            )
    assert snapshot(bench, record) == before


# --- proof of non-commit ------------------------------------------------------------


def test_unsafe_not_committed_is_refused_with_advice_to_fork(bench) -> None:
    # Given an unsafe request that reached the target, committed nothing, got no answer
    record = bench.unknown_outcome(UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    assert bench.target_rows(record) == 0
    before = snapshot(bench, record)
    # When an operator attests, with evidence, that the target never applied it
    with pytest.raises(IllegalTransitionError) as refused:
        resolution.resolve_not_committed(
            bench.tenant,
            record.effect_id,
            operator=make_operator("carol"),
            reason="no charge in the target's export",
            evidence=NOT_THERE,
        )
    # Then it is never requeued under the same key (spec rule 6): nothing is written,
    # no job deferred, and the advice is to fork (a new operation key)
    assert refused.value.details["refusal"] == "unsafe_never_requeued"
    assert "fork it" in str(refused.value)
    assert snapshot(bench, record) == before
    # And a redelivered dispatch job still does not resend it
    assert dispatch(record.effect_id, worker="w2").status is S.OUTCOME_UNKNOWN
    assert bench.targets[UNSAFE].requests == 1


@pytest.mark.parametrize(
    ("reason", "evidence"),
    [("nothing there", {}), ("", NOT_THERE)],
    ids=["empty-evidence", "empty-reason"],
)
def test_unsafe_not_committed_without_evidence_is_refused_and_nothing_changes(
    bench, reason, evidence
) -> None:
    record = bench.unknown_outcome(UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    before = snapshot(bench, record)
    with pytest.raises(InvalidRequestError):
        resolution.resolve_not_committed(
            bench.tenant,
            record.effect_id,
            operator=make_operator("carol"),
            reason=reason,
            evidence=evidence,
        )
    assert snapshot(bench, record) == before
    # A redelivered dispatch job still does not resend it
    assert dispatch(record.effect_id, worker="w2").status is S.OUTCOME_UNKNOWN
    assert bench.targets[UNSAFE].requests == 1


def test_not_committed_past_the_retry_limit_is_refused_with_advice(bench) -> None:
    # Given a reconcilable effect that used all 4 attempts (retry_limit = 3), the last
    # unknown, and its settlement deadline past on the database clock
    safety = SafetyClass.RECONCILABLE
    record = bench.submit(safety)
    bench.targets[safety].inject(Fault.REJECT, times=3)
    for _ in range(3):
        dispatch(record.effect_id, worker="w1")
        bench.advance(120)
    bench.targets[safety].inject(Fault.TIMEOUT_BEFORE_COMMIT)
    last = dispatch(record.effect_id, worker="w1")
    assert (last.status, last.attempt_count) == (S.OUTCOME_UNKNOWN, 4)
    bench.advance(10)  # past the send margin + 2 s bound, on the database's clock
    assert last.settlement_deadline is not None
    assert last.settlement_deadline < store.database_now(bench.clock.database_offset())
    before = snapshot(bench, record)
    # When an operator proves non-commit, the contract does not permit a fifth attempt
    with pytest.raises(IllegalTransitionError) as refused:
        resolution.resolve_not_committed(
            bench.tenant,
            record.effect_id,
            operator=make_operator("dave"),
            reason="not in the export",
            evidence=NOT_THERE,
        )
    assert refused.value.details["refusal"] == "retry_limit_reached"
    assert "resolve it as failed" in str(refused.value)
    assert snapshot(bench, record) == before
    # And the advice works
    failed = resolution.resolve_failed(
        bench.tenant,
        record.effect_id,
        operator=make_operator("dave"),
        reason="budget spent",
    )
    assert failed.status is S.FAILED_FINAL
    assert bench.targets[safety].requests == 4


def test_idempotent_past_retention_not_committed_is_refused_with_advice(bench) -> None:
    # Given an idempotent effect in review because its key retention lapsed
    record = in_manual_review(bench)
    bench.advance(60)  # and now past the retention itself, on the database's clock
    assert record.retention_deadline is not None
    assert record.retention_deadline < store.database_now(bench.clock.database_offset())
    before = snapshot(bench, record)
    # When an operator attests non-commit, a same-key resend is refused: the target
    # no longer deduplicates the key, so a resend could be a second charge
    with pytest.raises(IllegalTransitionError) as refused:
        resolution.resolve_not_committed(
            bench.tenant,
            record.effect_id,
            operator=make_operator("erin"),
            reason="target has no row for the key",
            evidence=NOT_THERE,
        )
    assert refused.value.details["refusal"] == "key_retention_expired"
    assert "or fork it" in str(refused.value)
    assert snapshot(bench, record) == before
    assert bench.target_rows(record) == 0


# --- final failure ----------------------------------------------------------------


def test_failed_from_unknown_is_final_without_a_receipt(bench) -> None:
    record = bench.unknown_outcome(IDEMPOTENT, Fault.TIMEOUT_BEFORE_COMMIT)
    jobs_before = list(bench.scheduler.requests)
    failed = resolution.resolve_failed(
        bench.tenant,
        record.effect_id,
        operator=make_operator("frank"),
        reason="customer cancelled",
    )
    assert failed.status is S.FAILED_FINAL
    assert tail(failed, 2) == [
        ("operator_review_started", "outcome_unknown", "manual_review", "frank"),
        ("resolved_failed", "manual_review", "failed_final", "frank"),
    ]
    assert load_events(record.effect_id)[-1].facts.metadata == {
        "reason": "customer cancelled"
    }
    assert bench.scheduler.requests == jobs_before
    with pytest.raises(EffectNotFoundError, match="no receipt"):
        inspection.get_receipt(bench.tenant, record.effect_id)
    # The reconcile job that was already queued finds nothing to do
    assert reconcile(record.effect_id, worker="w2").status is S.FAILED_FINAL
    assert bench.targets[IDEMPOTENT].requests == 1


# --- refusals ---------------------------------------------------------------------


def _attempt(bench: Bench, record: EffectRecord, choice: resolution.Resolution) -> None:
    resolution.resolve(
        bench.tenant,
        record.effect_id,
        choice,
        operator=make_operator("mallory"),
        reason="because",
        evidence=ANY_SHAPE,
    )


@pytest.mark.parametrize("choice", list(resolution.Resolution))
def test_resolution_of_a_prepared_effect_is_refused(bench, choice) -> None:
    record = bench.submit(UNSAFE)
    before = snapshot(bench, record)
    with pytest.raises(IllegalTransitionError) as refused:
        _attempt(bench, record, choice)
    assert refused.value.details["refusal"] == "not_resolvable"
    assert "prepared" in str(refused.value)
    assert snapshot(bench, record) == before


@pytest.mark.parametrize("choice", list(resolution.Resolution))
def test_a_settled_effect_is_never_resolved_again(bench, choice) -> None:
    record = bench.unknown_outcome(UNSAFE)
    resolution.resolve_succeeded(
        bench.tenant,
        record.effect_id,
        operator=make_operator("alice"),
        reason="seen",
        evidence=PROOF,
    )
    before = snapshot(bench, record)
    with pytest.raises(IllegalTransitionError) as refused:
        _attempt(bench, record, choice)
    assert refused.value.details["refusal"] == "already_settled"
    assert snapshot(bench, record) == before
    assert EffectReceipt.objects.filter(effect_id=record.effect_id).count() == 1


def test_an_unknown_resolution_name_is_refused(bench) -> None:
    record = bench.unknown_outcome(UNSAFE)
    with pytest.raises(InvalidRequestError, match="retry_anyway"):
        resolution.resolve(
            bench.tenant,
            record.effect_id,
            "retry_anyway",
            operator=make_operator("mallory"),
            reason="yolo",
        )


def test_everything_is_tenant_scoped(bench, other_tenant) -> None:
    record = bench.unknown_outcome(UNSAFE)
    before = snapshot(bench, record)
    calls = [
        lambda: resolution.resolve_succeeded(
            other_tenant,
            record.effect_id,
            operator=make_operator("x"),
            reason="y",
            evidence=PROOF,
        ),
        lambda: resolution.resolve_not_committed(
            other_tenant,
            record.effect_id,
            operator=make_operator("x"),
            reason="y",
            evidence=NOT_THERE,
        ),
        lambda: resolution.resolve_failed(
            other_tenant, record.effect_id, operator=make_operator("x"), reason="y"
        ),
        lambda: forking.fork(
            other_tenant,
            record.effect_id,
            operator=make_operator("x"),
            new_operation_key="other:1",
            reason="y",
            evidence=NOT_THERE,
        ),
        lambda: resolution.request_reconciliation(other_tenant, record.effect_id),
        lambda: inspection.history(other_tenant, record.effect_id),
        lambda: inspection.get_receipt(other_tenant, record.effect_id),
        lambda: inspection.get_effect(other_tenant, "not-a-uuid"),
    ]
    for call in calls:
        with pytest.raises(EffectNotFoundError):
            call()
    assert snapshot(bench, record) == before


def test_a_concurrent_write_refuses_the_resolution_and_writes_nothing(
    bench, monkeypatch
) -> None:
    # Given the operator read the effect, and then another writer moved it on
    record = bench.unknown_outcome(UNSAFE)
    store.touch(record, event_type="test_bump", actor="other", now=bench.clock.now())
    before = snapshot(bench, record)
    # (simulate the read-then-write race: the service sees the operator's stale read)
    monkeypatch.setattr(store, "get_effect", lambda tenant_id, effect_id: record)
    # When the resolution is written, the fence refuses it and nothing of it lands
    with pytest.raises(StaleWriteError):
        resolution.resolve_succeeded(
            bench.tenant,
            record.effect_id,
            operator=make_operator("alice"),
            reason="r",
            evidence=PROOF,
        )
    assert snapshot(bench, record) == before


# --- reconciliation requests ------------------------------------------------------


def test_reconciliation_request_defers_a_job_for_a_non_unsafe_unknown(bench) -> None:
    record = bench.unknown_outcome(IDEMPOTENT)
    asked = resolution.request_reconciliation(bench.tenant, record.effect_id)
    assert asked.deferred is True
    assert asked.effect.status is S.OUTCOME_UNKNOWN
    assert bench.scheduler.requests[-1] == ("reconcile", record.effect_id, None)
    assert reconcile(record.effect_id, worker="w2").status is S.SUCCEEDED
    assert bench.target_rows(record) == 1


def test_reconciliation_of_an_unsafe_unknown_is_refused_never_retried(bench) -> None:
    record = bench.unknown_outcome(UNSAFE)
    before = snapshot(bench, record)
    with pytest.raises(IllegalTransitionError) as refused:
        resolution.request_reconciliation(bench.tenant, record.effect_id)
    assert refused.value.details["refusal"] == "operator_required"
    assert "an operator must resolve it" in str(refused.value)
    assert snapshot(bench, record) == before


@pytest.mark.parametrize("settled", [False, True], ids=["prepared", "succeeded"])
def test_reconciliation_request_in_other_states_is_a_no_op(bench, settled) -> None:
    record = bench.submit(IDEMPOTENT)
    if settled:
        record = dispatch(record.effect_id, worker="w1")
    before = snapshot(bench, record)
    asked = resolution.request_reconciliation(bench.tenant, record.effect_id)
    assert asked.deferred is False
    assert asked.effect.status is record.status
    assert snapshot(bench, record) == before
