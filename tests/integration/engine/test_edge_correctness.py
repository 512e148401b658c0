"""Issue "correctness at the edges": the paths to a double charge or a false outcome
that an independent review reproduced on the engine, one test each.

Each test counts rows in the target's own table: "not charged twice" is asserted, not
assumed. Defects covered here: 1 (a paused worker), 2 (settlement counted from the
attempt's start), 3 (failed_final with a charge), 7 (one host's clock decides) and 8
(the lease keeper dies on a transient error).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError

from effect_broker import store
from effect_broker.adapters.base import DispatchRequest, DispatchResult
from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.clock import ManualClock
from effect_broker.domain.errors import SendRefusedError
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectAttempt, EffectEvent, StaleWrite
from effect_broker.services import deadlines, lease
from effect_broker.services.dispatch import dispatch
from effect_broker.services.lease import LeaseKeeper
from effect_broker.services.reconcile import reconcile
from effect_broker.services.runtime import Runtime, get_runtime
from effect_broker.services.sweeper import sweep
from effect_broker.store import db_time, load_effect_for_worker
from tests.integration.engine.harness import TIMING, Bench, WorkerKilled, engine_bench

IDEMPOTENT = SafetyClass.IDEMPOTENT
RECONCILABLE = SafetyClass.RECONCILABLE
UNSAFE = SafetyClass.UNSAFE
LEASE = TIMING.lease.total_seconds()
#: From a lost answer to a conclusive "not found": send margin + the 2 s bound.
SETTLEMENT = TIMING.send_margin.total_seconds() + 2


def reload(record: EffectRecord) -> EffectRecord:
    return load_effect_for_worker(record.effect_id)


def before_send(bench: Bench, safety: SafetyClass, hook: Callable[[], None]) -> None:
    """Run ``hook`` inside the next dispatch, after the claim committed and before the
    adapter's send gate (where a GC pause or SIGSTOP would land)."""
    inner = bench.adapters[safety].inner
    original = inner.dispatch

    def stalled(request: DispatchRequest) -> DispatchResult:
        inner.dispatch = original  # type: ignore[method-assign]
        hook()
        return original(request)

    inner.dispatch = stalled  # type: ignore[method-assign]


class SkewedClock:
    """A host whose wall clock is ``skew`` ahead of everybody else's."""

    def __init__(self, inner: ManualClock, skew: timedelta) -> None:
        self.inner = inner
        self.skew = skew

    def now(self) -> datetime:
        return self.inner.now() + self.skew

    def monotonic(self) -> float:
        return self.inner.monotonic()

    def database_offset(self) -> timedelta:
        return self.inner.database_offset()


def skewed_runtime(bench: Bench, seconds: float) -> Runtime:
    return replace(
        get_runtime(), clock=SkewedClock(bench.clock, timedelta(seconds=seconds))
    )


# --- defect 1: a paused worker --------------------------------------------------------


@pytest.mark.parametrize("safety", [RECONCILABLE, IDEMPOTENT, UNSAFE])
def test_a_worker_paused_between_claim_and_send_never_sends(bench, safety) -> None:
    """The claim commits, the worker stalls past its lease, the sweeper hands the
    effect on and it is settled by others; the worker wakes: the gate refuses."""
    record = bench.submit(safety)

    def pause_past_the_lease() -> None:
        bench.advance(LEASE + 1)
        assert sweep().leases_expired == 1
        if safety is RECONCILABLE:
            bench.advance(SETTLEMENT)
            # Absence is now conclusive, so it is sent again under a new attempt.
            assert reconcile(record.effect_id, worker="w2").status is (
                EffectStatus.PREPARED
            )
            assert dispatch(record.effect_id, worker="w3").status is (
                EffectStatus.SUCCEEDED
            )
        elif safety is IDEMPOTENT:
            assert reconcile(record.effect_id, worker="w2").status is (
                EffectStatus.SUCCEEDED
            )

    before_send(bench, safety, pause_past_the_lease)
    woke = dispatch(record.effect_id, worker="w1")
    expected = 0 if safety is UNSAFE else 1
    assert bench.target_rows(record) == expected
    assert bench.targets[safety].requests == expected
    # The stalled worker's outcome write was fenced out, and recorded as such.
    assert StaleWrite.objects.filter(effect_id=record.effect_id).count() == 1
    if safety is UNSAFE:
        # Nobody may resend an unsafe effect; it waits for an operator, honestly.
        assert woke.status is EffectStatus.OUTCOME_UNKNOWN
    else:
        assert woke.status is EffectStatus.SUCCEEDED


def test_the_gate_refuses_once_the_lease_cannot_be_proved_even_if_nobody_took_it(
    bench,
) -> None:
    """No sweeper ran yet: the lease may still be in the database, but the worker can
    no longer prove it holds, so it does not send; the attempt ends as not sent."""
    record = bench.submit(RECONCILABLE)
    before_send(
        bench,
        RECONCILABLE,
        lambda: bench.advance(LEASE - TIMING.send_margin.total_seconds()),
    )
    after = dispatch(record.effect_id, worker="w1")
    assert after.status is EffectStatus.RETRYABLE
    assert bench.targets[RECONCILABLE].requests == 0
    attempt = EffectAttempt.objects.get(effect_id=record.effect_id)
    assert attempt.outcome == "not_committed"
    assert attempt.bytes_may_have_left is False
    assert "lease cannot be proved" in attempt.error_category
    assert after.outcome_in_doubt is False


def test_the_gate_refuses_once_the_attempt_time_limit_is_spent(bench) -> None:
    record = bench.submit(IDEMPOTENT)
    contract = bench.registry.for_tool("idempotent_charge")
    limit = deadlines.attempt_limit(get_runtime(), contract)
    assert limit == TIMING.lease - TIMING.send_margin  # the default: below the lease
    before_send(bench, IDEMPOTENT, lambda: bench.advance(limit.total_seconds()))
    assert dispatch(record.effect_id, worker="w1").status is EffectStatus.RETRYABLE
    assert bench.targets[IDEMPOTENT].requests == 0
    attempt = EffectAttempt.objects.get(effect_id=record.effect_id)
    assert "time limit" in attempt.error_category


# --- defect 2: settlement counted from the right moment ------------------------------


def test_a_slow_commit_with_a_lost_answer_is_found_not_resent(bench) -> None:
    """The attempt outlasts the settlement bound before the target commits, and the
    answer is lost. Counting the bound from the attempt's start probed at once, found
    nothing (the commit was not visible yet) and resent: two charges."""
    record = bench.submit(RECONCILABLE)
    target = bench.targets[RECONCILABLE]
    target.inject(Fault.LOSE_RESPONSE)
    before_send(bench, RECONCILABLE, lambda: bench.advance(5))
    unknown = dispatch(record.effect_id, worker="w1")
    assert unknown.status is EffectStatus.OUTCOME_UNKNOWN
    assert unknown.outcome_in_doubt is True
    # Straight after the lost answer nothing is conclusive yet: no probe at all.
    assert reconcile(record.effect_id, worker="w2").status is (
        EffectStatus.OUTCOME_UNKNOWN
    )
    assert target.lookups == 0
    bench.advance(SETTLEMENT)
    done = reconcile(record.effect_id, worker="w2")
    assert done.status is EffectStatus.SUCCEEDED
    assert target.requests == 1
    assert bench.target_rows(record) == 1


def test_after_a_dead_worker_settlement_counts_from_the_end_of_its_lease(bench) -> None:
    """A worker presumed dead may be paused and send as late as its lease's end."""
    record = bench.submit(RECONCILABLE)
    bench.switch.when = "before_send"
    with pytest.raises(WorkerKilled):
        dispatch(record.effect_id, worker="w1")
    claimed = reload(record)
    assert claimed.lease_expires_at is not None
    bench.advance(LEASE + 1)
    sweep()
    unknown = reload(record)
    assert unknown.status is EffectStatus.OUTCOME_UNKNOWN
    assert unknown.settlement_deadline == claimed.lease_expires_at + timedelta(
        seconds=SETTLEMENT
    )
    assert unknown.next_action_at == unknown.settlement_deadline


def test_a_probe_sent_before_the_bound_is_not_conclusive_even_if_it_answers_after(
    bench,
) -> None:
    """README: "not found" is conclusive only for a probe issued after the settlement
    bound, its time read on the database clock BEFORE it is sent (issue 19: moving
    that read after the probe left every reconciliation test green). A slow lookup
    that is sent before the bound and answers after it proves nothing: the target
    may show the commit only once the bound has passed."""
    # Given an unknown outcome whose settlement deadline is still ahead, made due for
    # a lookup now (a schedule change, as an operator's request would)
    record = bench.unknown_outcome(RECONCILABLE, Fault.TIMEOUT_BEFORE_COMMIT)
    deadline = record.settlement_deadline
    assert deadline is not None
    due_now = store.touch(
        record,
        event_type="schedule_changed",
        actor="tester",
        now=bench.clock.now(),
        changes={"next_action_at": db_time.after_now(bench.clock.database_offset())},
    )
    assert due_now.next_action_at is not None
    assert due_now.next_action_at < deadline
    # and a lookup that takes until past the deadline, then answers "not found"
    target = bench.targets[RECONCILABLE]
    adapter = bench.adapters[RECONCILABLE]
    slow_past = (
        deadline - store.database_now(bench.clock.database_offset())
    ).total_seconds()

    def slow_probe(request):  # type: ignore[no-untyped-def]
        bench.advance(slow_past + 1)
        return target_probe(request)

    target_probe = adapter.inner.probe
    adapter.inner.probe = slow_probe  # type: ignore[method-assign]
    scheduled = len(bench.scheduler.requests)
    # When it is reconciled
    after = reconcile(record.effect_id, worker="w2")
    # Then the lookup was made, and its "not found" counts as inconclusive, not as
    # proof: the effect stays unknown, nothing is requeued or resent
    assert target.lookups == 1
    assert after.status is EffectStatus.OUTCOME_UNKNOWN
    assert after.outcome_in_doubt is True
    last = EffectEvent.objects.filter(effect_id=record.effect_id).order_by("-sequence")[0]
    assert last.event_type == "reconcile_inconclusive"
    assert last.metadata["settled"] is False
    assert target.requests == 1
    assert [r[0] for r in bench.scheduler.requests[scheduled:]] == ["reconcile"]


def test_a_missing_settlement_deadline_is_never_conclusive() -> None:
    class Row:
        settlement_deadline = None

    assert deadlines.settled(Row(), datetime.max.replace(tzinfo=UTC)) is False  # type: ignore[arg-type]


# --- defect 3: unknown is sticky ------------------------------------------------------


def test_a_terminal_answer_to_a_resend_after_an_unknown_attempt_is_not_failed(
    bench,
) -> None:
    """Attempt 1 committed and its answer was lost; the resend is refused ("key in
    use", or any 4xx): that proves nothing about attempt 1, which holds the charge."""
    record = bench.submit(IDEMPOTENT)
    target = bench.targets[IDEMPOTENT]
    target.inject(Fault.LOSE_RESPONSE)
    assert dispatch(record.effect_id, worker="w1").status is (
        EffectStatus.OUTCOME_UNKNOWN
    )
    target.inject(Fault.TERMINAL)
    refused = reconcile(record.effect_id, worker="w2")
    assert refused.status is EffectStatus.OUTCOME_UNKNOWN
    assert refused.outcome_in_doubt is True
    event = EffectEvent.objects.filter(effect_id=record.effect_id).last()
    assert event is not None
    assert event.event_type == "refused_in_doubt"
    assert "cannot prove that nothing was charged" in event.metadata["reason"]
    done = reconcile(record.effect_id, worker="w3")  # the same key again: deduplicated
    assert done.status is EffectStatus.SUCCEEDED
    assert done.outcome_in_doubt is False  # the receipt settles the doubt
    assert bench.target_rows(record) == 1


def test_retry_exhaustion_after_an_unknown_attempt_goes_to_an_operator(bench) -> None:
    record = bench.submit(IDEMPOTENT)
    target = bench.targets[IDEMPOTENT]
    target.inject(Fault.LOSE_RESPONSE)
    dispatch(record.effect_id, worker="w1")
    target.inject(Fault.REJECT, times=10)  # every resend: "not committed, try later"
    statuses = [reconcile(record.effect_id, worker="w2").status]
    for _ in range(10):
        bench.advance(120)
        current = reload(record)
        if current.status is EffectStatus.RETRYABLE:
            statuses.append(dispatch(record.effect_id, worker="w3").status)
        elif current.status is EffectStatus.OUTCOME_UNKNOWN:
            statuses.append(reconcile(record.effect_id, worker="w4").status)
        else:
            break
    final = reload(record)
    assert EffectStatus.FAILED_FINAL not in statuses
    assert final.status is EffectStatus.MANUAL_REVIEW
    assert final.attempt_count == 4  # retry_limit 3: four attempts, then a person
    assert bench.target_rows(record) == 1


def test_a_terminal_answer_with_no_doubt_is_still_failed_final(bench) -> None:
    record = bench.submit(IDEMPOTENT)
    bench.targets[IDEMPOTENT].inject(Fault.TERMINAL)
    after = dispatch(record.effect_id, worker="w1")
    assert after.status is EffectStatus.FAILED_FINAL
    assert after.outcome_in_doubt is False


def test_a_conclusive_not_committed_ends_the_doubt(bench) -> None:
    record = bench.unknown_outcome(RECONCILABLE, Fault.TIMEOUT_BEFORE_COMMIT)
    assert record.outcome_in_doubt is True
    bench.advance(SETTLEMENT)
    requeued = reconcile(record.effect_id, worker="w2")
    assert requeued.status is EffectStatus.PREPARED
    assert requeued.outcome_in_doubt is False
    bench.targets[RECONCILABLE].inject(Fault.TERMINAL)
    # Proven not committed, then refused: failing it is the truth.
    assert dispatch(record.effect_id, worker="w3").status is EffectStatus.FAILED_FINAL
    assert bench.target_rows(record) == 0


# --- defect 7: one host's clock must not decide ---------------------------------------


def test_a_sweeper_whose_clock_runs_ahead_expires_no_live_lease(bench) -> None:
    record = bench.submit(IDEMPOTENT)
    bench.switch.when = "before_send"
    with pytest.raises(WorkerKilled):
        dispatch(record.effect_id, worker="w1")
    ahead = skewed_runtime(bench, LEASE + 10)
    assert sweep(runtime=ahead).leases_expired == 0
    assert reload(record).status is EffectStatus.DISPATCHING
    bench.advance(LEASE + 1)  # the database's clock passes the lease
    assert sweep(runtime=ahead).leases_expired == 1


def test_a_reconciler_whose_clock_runs_ahead_does_not_conclude_early(bench) -> None:
    record = bench.unknown_outcome(RECONCILABLE, Fault.TIMEOUT_BEFORE_COMMIT)
    target = bench.targets[RECONCILABLE]
    ahead = skewed_runtime(bench, 20)
    after = reconcile(record.effect_id, worker="skewed", runtime=ahead)
    assert after.status is EffectStatus.OUTCOME_UNKNOWN
    assert target.lookups == 0
    assert target.requests == 1
    bench.advance(SETTLEMENT)
    assert reconcile(record.effect_id, worker="w2", runtime=ahead).status is (
        EffectStatus.PREPARED
    )


def test_deadlines_are_written_by_the_database_clock(bench) -> None:
    """A worker whose clock is an hour ahead writes the same lease and retention as
    any other: the database computes them."""
    record = bench.submit(IDEMPOTENT)
    bench.switch.when = "before_send"
    before = store.database_now(bench.clock.database_offset())
    with pytest.raises(WorkerKilled):
        dispatch(record.effect_id, worker="w1", runtime=skewed_runtime(bench, 3600))
    after = store.database_now(bench.clock.database_offset())
    claimed = reload(record)
    assert claimed.lease_expires_at is not None
    assert claimed.retention_deadline is not None
    assert before + TIMING.lease <= claimed.lease_expires_at <= after + TIMING.lease
    assert before + timedelta(hours=1) <= claimed.retention_deadline
    assert claimed.retention_deadline <= after + timedelta(hours=1)


# --- defect 8: the lease keeper survives a transient database error -------------------


@pytest.fixture
def committed_bench(transactional_db: None) -> Iterator[Bench]:
    """The bench on committed rows: the heartbeat thread has its own connection."""
    with engine_bench() as b:
        yield b


def _claimed(bench: Bench) -> tuple[EffectRecord, Runtime]:
    rt = replace(
        get_runtime(), timing=replace(TIMING, heartbeat=timedelta(milliseconds=50))
    )
    record = bench.submit(IDEMPOTENT)
    contract = bench.registry.for_tool("idempotent_charge")
    claimed, _ = store.start_attempt(
        record,
        worker="w1",
        now=bench.clock.now(),
        changes=deadlines.claim_changes(rt, record, contract, worker="w1"),
    )
    return claimed, rt


def _wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_the_lease_keeper_survives_transient_errors(committed_bench, monkeypatch) -> None:
    claimed, rt = _claimed(committed_bench)
    failures = {"left": 3}
    real_touch = store.touch

    def flaky_touch(*args, **kwargs):  # type: ignore[no-untyped-def]
        if failures["left"] > 0:
            failures["left"] -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return real_touch(*args, **kwargs)

    monkeypatch.setattr(lease.store, "touch", flaky_touch)
    keeper = LeaseKeeper(
        rt,
        claimed,
        worker="w1",
        claimed_at=rt.clock.monotonic(),
        attempt_limit=timedelta(seconds=60),
    )
    with keeper:
        _wait_for(lambda: keeper.current().version > claimed.version)
        keeper.check()  # still provably held: the gate stays open
    assert keeper.lost is False
    assert failures["left"] == 0


def test_a_lease_taken_away_closes_the_gate(committed_bench) -> None:
    claimed, rt = _claimed(committed_bench)
    keeper = LeaseKeeper(
        rt,
        claimed,
        worker="w1",
        claimed_at=rt.clock.monotonic(),
        attempt_limit=timedelta(seconds=60),
    )
    with keeper:
        # Another actor (the sweeper) wrote the effect: the next beat is fenced out.
        store.touch(
            reload(claimed),
            event_type="lease_extended",
            actor="thief",
            now=committed_bench.clock.now(),
        )
        _wait_for(lambda: keeper.lost)
        with pytest.raises(SendRefusedError) as refused:
            keeper.check()
    assert refused.value.details["reason"] == "lease_lost"
