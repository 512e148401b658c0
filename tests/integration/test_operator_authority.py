"""Issue 9, defect 5: per-class rules for ``not_committed``, evidence shapes, and forks.

Reproduced by review: ``not_committed`` requeued an unsafe effect (two charges), a
reconcilable one before its settlement bound, and an idempotent one after its key
retention. Deadlines are compared on the DATABASE clock: the process clock is skewed
away from it (``skew_process_clock``) so that the two clocks disagree where it
matters, and the bench moves the database's clock (``bench.advance``).
Negative tests assert that nothing was written, deferred or sent.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from effect_broker import store
from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.clock import ManualClock
from effect_broker.domain.errors import (
    IllegalTransitionError,
    InvalidRequestError,
    OperatorForbiddenError,
    StaleWriteError,
)
from effect_broker.domain.evidence import EVIDENCE_SHAPES, check_evidence
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectFork, EffectIntent, EffectReceipt
from effect_broker.services import forking, inspection, resolution, runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.services.payloads import load_arguments
from effect_broker.services.runtime import get_runtime
from effect_broker.services.submission import submit
from effect_broker.store import load_effect_for_worker, load_events, verify_event_chain
from tests.integration.conftest import make_operator
from tests.integration.engine.harness import Bench

S = EffectStatus
NOT_THERE = {"source": "target export", "checked_at": "2026-12-03T21:00:00Z"}


class SkewedClock:
    """The bench clock as a host whose wall clock is ``skew`` away from the others'
    (its monotonic clock and the database's clock are unaffected)."""

    def __init__(self, inner: ManualClock, skew: timedelta) -> None:
        self.inner, self.skew = inner, skew

    def now(self) -> datetime:
        return self.inner.now() + self.skew

    def monotonic(self) -> float:
        return self.inner.monotonic()

    def database_offset(self) -> timedelta:
        return self.inner.database_offset()


def skew_process_clock(bench: Bench, skew: timedelta) -> SkewedClock:
    """Run the rest of the test with the process clock ``skew`` away from the
    database's (the bench's own runtime override restores the clock at teardown)."""
    clock = SkewedClock(bench.clock, skew)
    runtime.override(clock=clock).__enter__()
    return clock


def db_now(bench: Bench) -> datetime:
    """The database's clock as the bench has moved it."""
    return store.database_now(bench.clock.database_offset())


def snapshot(bench: Bench, record: EffectRecord) -> tuple[object, ...]:
    now = load_effect_for_worker(record.effect_id)
    return (
        now.status,
        now.version,
        now.attempt_count,
        now.next_action_at,
        len(load_events(record.effect_id)),
        EffectReceipt.objects.filter(effect_id=record.effect_id).count(),
        len(bench.scheduler.requests),
        bench.targets[record.safety].requests,
        EffectIntent.objects.count(),
        EffectFork.objects.count(),
    )


def not_committed(bench: Bench, record: EffectRecord, **kw: object) -> EffectRecord:
    return resolution.resolve_not_committed(
        bench.tenant,
        record.effect_id,
        operator=make_operator("olga"),
        reason="not in the target's export",
        evidence=kw.pop("evidence", NOT_THERE),  # type: ignore[arg-type]
    )


def fork(bench: Bench, record: EffectRecord, key: str, **kw: object) -> forking.Fork:
    return forking.fork(
        bench.tenant,
        record.effect_id,
        operator=kw.pop("operator", None) or make_operator("olga"),
        new_operation_key=key,
        reason="no charge in the export; continue as a new operation",
        evidence=kw.pop("evidence", NOT_THERE),  # type: ignore[arg-type]
    )


# --- not_committed per safety class --------------------------------------------------


def test_reconcilable_not_committed_before_the_settlement_bound_is_refused(bench) -> None:
    # Given a reconcilable effect whose settlement deadline is ahead on the DB clock
    skew_process_clock(bench, timedelta(hours=1))
    record = bench.unknown_outcome(SafetyClass.RECONCILABLE, Fault.TIMEOUT_BEFORE_COMMIT)
    assert record.settlement_deadline is not None
    assert db_now(bench) < record.settlement_deadline
    before = snapshot(bench, record)
    # When an operator attests non-commit, then it is refused: the target may settle
    with pytest.raises(IllegalTransitionError) as refused:
        not_committed(bench, record)
    assert refused.value.details["refusal"] == "before_settlement_bound"
    assert record.settlement_deadline.isoformat() in str(refused.value)
    assert "becomes possible from" in str(refused.value)
    assert snapshot(bench, record) == before


def test_reconcilable_not_committed_after_the_bound_on_the_database_clock_requeues(
    bench,
) -> None:
    # Given a reconcilable effect whose deadline passed on the DB clock, while the
    # bench (process) clock still stands before it
    process = skew_process_clock(bench, -timedelta(hours=1))
    record = bench.unknown_outcome(SafetyClass.RECONCILABLE, Fault.TIMEOUT_BEFORE_COMMIT)
    bench.advance(10)  # past the send margin + 2 s bound on the database's clock
    assert record.settlement_deadline is not None
    assert process.now() < record.settlement_deadline < db_now(bench)
    # When an operator attests non-commit, it requeues with a dispatch job
    requeued = not_committed(bench, record)
    assert requeued.status is S.PREPARED
    assert bench.scheduler.requests[-1] == ("dispatch", record.effect_id, None)
    # And the one resend is applied once
    assert dispatch(record.effect_id, worker="w2").status is S.SUCCEEDED
    assert bench.target_rows(record) == 1


def test_idempotent_not_committed_within_retention_requeues_and_applies_once(
    bench,
) -> None:
    record = bench.unknown_outcome(SafetyClass.IDEMPOTENT, Fault.TIMEOUT_BEFORE_COMMIT)
    assert record.retention_deadline is not None
    assert db_now(bench) < record.retention_deadline - timedelta(minutes=1)
    requeued = not_committed(bench, record)
    assert requeued.status is S.PREPARED
    assert dispatch(record.effect_id, worker="w2").status is S.SUCCEEDED
    assert bench.target_rows(record) == 1


def test_idempotent_not_committed_inside_the_retention_margin_is_refused(bench) -> None:
    # Given retention that ends in 30 s on the DB clock: inside the 60 s margin
    skew_process_clock(bench, -timedelta(hours=1))
    record = bench.unknown_outcome(SafetyClass.IDEMPOTENT, Fault.TIMEOUT_BEFORE_COMMIT)
    bench.advance(3600 - 30)
    assert record.retention_deadline is not None
    assert db_now(bench) < record.retention_deadline
    before = snapshot(bench, record)
    with pytest.raises(IllegalTransitionError) as refused:
        not_committed(bench, record)
    assert refused.value.details["refusal"] == "key_retention_expired"
    assert "Resolve it as succeeded or failed with evidence" in str(refused.value)
    assert snapshot(bench, record) == before


@pytest.mark.parametrize(
    ("evidence", "missing"),
    [
        ({}, "source,checked_at"),
        ({"checked_at": "2026-12-03T21:00:00Z"}, "source"),
        ({"source": "export"}, "checked_at"),
        ({"source": "export", "checked_at": "yesterday"}, "checked_at"),
        ({"source": "export", "checked_at": "2026-12-03T21:00:00"}, "checked_at"),
    ],
    ids=["empty", "no-source", "no-checked_at", "not-a-time", "naive-time"],
)
def test_not_committed_evidence_needs_its_shape(bench, evidence, missing) -> None:
    record = bench.unknown_outcome(SafetyClass.RECONCILABLE, Fault.TIMEOUT_BEFORE_COMMIT)
    bench.advance(10)  # past the settlement deadline: only the evidence is wrong
    before = snapshot(bench, record)
    with pytest.raises(InvalidRequestError) as refused:
        not_committed(bench, record, evidence=evidence)
    assert refused.value.details["missing"] == missing
    assert snapshot(bench, record) == before


def test_evidence_shapes_are_defined_once_per_resolution() -> None:
    assert set(EVIDENCE_SHAPES) == {"succeeded", "not_committed", "fork", "failed"}
    assert check_evidence("failed", None) == {}
    with pytest.raises(InvalidRequestError, match="'source'"):
        check_evidence("failed", {"note": "x"})
    with pytest.raises(InvalidRequestError, match="'reference'"):
        check_evidence("succeeded", {"source": "dashboard"})


# --- forks ------------------------------------------------------------------------


def test_fork_of_an_unsafe_effect_settles_it_and_reserves_a_new_effect(bench) -> None:
    # Given an unsafe effect that committed nothing and got no answer
    record = bench.unknown_outcome(SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    # When an operator forks it under a new operation key
    forked = fork(bench, record, "order:7:charge:v2")
    old, new = forked.old, forked.new
    # Then the new effect is PREPARED under the new key, with the same tenant, tool and
    # arguments, pinned to the active contract, a new downstream key, and a dispatch job
    assert (new.status, new.operation_key) == (S.PREPARED, "order:7:charge:v2")
    assert (new.tenant_id, new.tool) == (record.tenant_id, record.tool)
    assert new.effect_id != record.effect_id
    assert new.downstream_key != record.downstream_key
    contract = get_runtime().registry.for_tool(record.tool)
    assert (new.contract_name, new.contract_version) == (contract.name, contract.version)
    rt = get_runtime()
    assert load_arguments(rt, new) == load_arguments(rt, record)
    assert ("dispatch", new.effect_id, None) in bench.scheduler.requests
    assert new.requested_by == "olga"
    # ... the old effect is settled failed_final by resolved_forked, naming the fork
    assert old.status is S.FAILED_FINAL
    last = load_events(record.effect_id)[-1].facts
    assert (last.event_type, last.old_status, last.actor) == (
        "resolved_forked",
        "manual_review",
        "olga",
    )
    assert last.metadata["forked_to"] == new.effect_id
    assert last.metadata["fork_operation_key"] == "order:7:charge:v2"
    assert last.metadata["attested"] == "not_committed"
    assert "evidence_digest" in last.metadata
    assert verify_event_chain(record.effect_id) == old.version
    # ... linked both ways
    assert inspection.fork_links(old) == inspection.ForkLinks(None, new.effect_id)
    assert inspection.fork_links(new) == inspection.ForkLinks(record.effect_id, None)
    # ... and the old effect is never dispatched again, the new one exactly once
    assert dispatch(record.effect_id, worker="w2").status is S.FAILED_FINAL
    assert dispatch(new.effect_id, worker="w2").status is S.SUCCEEDED
    assert bench.targets[SafetyClass.UNSAFE].requests == 2
    assert bench.target_rows(record) == 1


def test_fork_under_the_same_key_is_refused_and_writes_nothing(bench) -> None:
    record = bench.unknown_outcome(SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    before = snapshot(bench, record)
    with pytest.raises(InvalidRequestError) as refused:
        fork(bench, record, record.operation_key)
    assert refused.value.details["refusal"] == "same_operation_key"
    assert snapshot(bench, record) == before


@pytest.mark.parametrize("same_payload", [False, True], ids=["other-payload", "replay"])
def test_fork_onto_a_key_in_use_is_refused_and_writes_nothing(
    bench, same_payload
) -> None:
    record = bench.unknown_outcome(SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    if same_payload:  # the key holds exactly the fork's request: submit would replay
        key = "order:twin"
        twin = EffectRequest(key, record.tool, load_arguments(get_runtime(), record))
        taken = submit(bench.tenant, twin).effect
    else:
        key = "order:taken"
        taken = bench.submit(SafetyClass.UNSAFE, key=key)
    before = snapshot(bench, record)
    with pytest.raises(IllegalTransitionError) as refused:
        fork(bench, record, key)
    assert refused.value.details["refusal"] == "operation_key_taken"
    assert taken.effect_id in str(refused.value)
    assert snapshot(bench, record) == before


def test_fork_of_a_settled_effect_is_refused(bench) -> None:
    record = bench.unknown_outcome(SafetyClass.UNSAFE)
    resolution.resolve_failed(
        bench.tenant, record.effect_id, operator=make_operator("olga"), reason="gave up"
    )
    before = snapshot(bench, record)
    with pytest.raises(IllegalTransitionError) as refused:
        fork(bench, record, "order:new")
    assert refused.value.details["refusal"] == "already_settled"
    assert snapshot(bench, record) == before


def test_fork_of_a_reconcilable_effect_before_its_bound_is_refused(bench) -> None:
    skew_process_clock(bench, timedelta(hours=1))
    record = bench.unknown_outcome(SafetyClass.RECONCILABLE, Fault.TIMEOUT_BEFORE_COMMIT)
    before = snapshot(bench, record)
    with pytest.raises(IllegalTransitionError) as refused:
        fork(bench, record, "order:new")
    assert refused.value.details["refusal"] == "before_settlement_bound"
    assert snapshot(bench, record) == before


def test_fork_by_a_user_without_the_permission_is_refused(bench) -> None:
    record = bench.unknown_outcome(SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    before = snapshot(bench, record)
    with pytest.raises(OperatorForbiddenError):
        fork(bench, record, "order:new", operator=make_operator("clerk", permitted=False))
    assert snapshot(bench, record) == before


def test_fork_needs_evidence_of_non_commit(bench) -> None:
    record = bench.unknown_outcome(SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    before = snapshot(bench, record)
    with pytest.raises(InvalidRequestError) as refused:
        fork(bench, record, "order:new", evidence={"source": "export"})
    assert refused.value.details["missing"] == "checked_at"
    assert snapshot(bench, record) == before


def test_a_fork_whose_settlement_is_fenced_out_reserves_nothing(
    bench, monkeypatch
) -> None:
    # Given the operator read the effect, and then another writer moved it on
    record = bench.unknown_outcome(SafetyClass.UNSAFE, Fault.TIMEOUT_BEFORE_COMMIT)
    store.touch(record, event_type="test_bump", actor="other", now=bench.clock.now())
    versions = load_effect_for_worker(record.effect_id).version
    monkeypatch.setattr(store, "get_effect", lambda tenant_id, effect_id: record)
    # When the fork is written, the fence refuses the settlement ...
    with pytest.raises(StaleWriteError):
        fork(bench, record, "order:fenced")
    # ... and the new effect, reserved in the same transaction, was rolled back too
    # (the recording scheduler keeps its note; a real job row rolls back with it)
    assert not EffectIntent.objects.filter(operation_key="order:fenced").exists()
    assert EffectFork.objects.count() == 0
    assert load_effect_for_worker(record.effect_id).version == versions


def test_transactional_not_committed_keeps_requeueing(bench) -> None:
    # Given a transactional effect left outcome_unknown (written by hand: the local
    # adapter commits or rolls back with its attempt, so the engine never leaves one)
    record = bench.submit(SafetyClass.TRANSACTIONAL)
    now = bench.clock.now()
    moving = store.transition(
        record, S.DISPATCHING, event_type="dispatch_started", actor="w1", now=now
    )
    unknown = store.transition(
        moving, S.OUTCOME_UNKNOWN, event_type="outcome_unknown", actor="w1", now=now
    )
    # When an operator attests non-commit, it is requeued as before (no class rule)
    requeued = not_committed(bench, unknown)
    assert requeued.status is S.PREPARED
    assert bench.scheduler.requests[-1] == ("dispatch", record.effect_id, None)
    assert dispatch(record.effect_id, worker="w2").status is S.SUCCEEDED
    assert bench.target_rows(record) == 1
