"""Spec "State machine" rules 1-8, one scenario each, on the real ledger.

Negative tests count rows at the target: "did not happen" is asserted, not assumed.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from effect_broker.adapters.base import DispatchRequest, DispatchResult
from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectAttempt, EffectReceipt, StaleWrite
from effect_broker.services.dispatch import dispatch
from effect_broker.services.reconcile import reconcile
from effect_broker.services.sweeper import sweep
from effect_broker.store import load_effect_for_worker, verify_event_chain
from effect_broker.store.reads import database_now
from tests.integration.engine.harness import TIMING, Bench, WorkerKilled, engine_bench

IDEMPOTENT = SafetyClass.IDEMPOTENT
RECONCILABLE = SafetyClass.RECONCILABLE
UNSAFE = SafetyClass.UNSAFE
TRANSACTIONAL = SafetyClass.TRANSACTIONAL
#: Seconds from a lost answer until "not found" is conclusive for the bench's
#: reconcilable contract: the send margin plus its 2 s settlement bound.
SETTLEMENT = TIMING.send_margin.total_seconds() + 2


def status(record) -> EffectStatus:
    return load_effect_for_worker(record.effect_id).status


@pytest.mark.parametrize("safety", [IDEMPOTENT, RECONCILABLE, UNSAFE, TRANSACTIONAL])
def test_a_clean_dispatch_succeeds_with_one_effect_and_one_receipt(bench, safety) -> None:
    record = bench.submit(safety)
    assert ("dispatch", record.effect_id, None) in bench.scheduler.requests
    done = dispatch(record.effect_id, worker="w1")
    assert done.status is EffectStatus.SUCCEEDED
    assert bench.target_rows(record) == 1
    assert EffectReceipt.objects.filter(effect_id=record.effect_id).count() == 1
    assert verify_event_chain(record.effect_id) == done.version


def test_rule1_dispatching_and_the_attempt_commit_before_any_io(bench) -> None:
    record = bench.submit(IDEMPOTENT)
    seen: dict[str, object] = {}
    adapter = bench.adapters[IDEMPOTENT]
    original = adapter.inner.dispatch

    def spying_dispatch(request: DispatchRequest) -> DispatchResult:
        # Inside the test's transaction: both rows exist before the adapter is called.
        # That they are COMMITTED is proved from a second connection below.
        with connection.cursor() as cur:
            cur.execute(
                "SELECT status FROM effect_intents WHERE id = %s", [record.effect_id]
            )
            seen["status"] = cur.fetchone()[0]
            cur.execute(
                "SELECT count(*) FROM effect_attempts WHERE effect_id = %s",
                [record.effect_id],
            )
            seen["attempts"] = cur.fetchone()[0]
        return original(request)

    adapter.inner.dispatch = spying_dispatch  # type: ignore[method-assign]
    dispatch(record.effect_id, worker="w1")
    assert seen == {"status": "dispatching", "attempts": 1}


@pytest.fixture
def committed_bench(transactional_db: None) -> Iterator[Bench]:
    """The engine bench without the test's wrapping transaction: what the engine
    commits is committed, so another connection can see it."""
    with engine_bench() as b:
        yield b


def _second_connection() -> psycopg.Connection:
    """A connection of its own (not Django's): it sees only what was committed."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


def test_rule1_seen_from_another_connection_before_the_adapter_runs(
    committed_bench: Bench,
) -> None:
    # Given an effect and an observer on a second connection
    record = committed_bench.submit(IDEMPOTENT)
    adapter = committed_bench.adapters[IDEMPOTENT]
    original = adapter.inner.dispatch
    seen: dict[str, object] = {}

    def observed_dispatch(request: DispatchRequest) -> DispatchResult:
        # When the adapter is about to do I/O, the observer reads the ledger:
        # only committed rows are visible to it.
        with _second_connection() as other:
            seen["status"] = other.execute(
                "SELECT status FROM effect_intents WHERE id = %s", [record.effect_id]
            ).fetchone()[0]
            seen["open_attempts"] = other.execute(
                "SELECT count(*) FROM effect_attempts"
                " WHERE effect_id = %s AND ended_at IS NULL",
                [record.effect_id],
            ).fetchone()[0]
            seen["target_rows"] = committed_bench.target_rows(record)
        return original(request)

    adapter.inner.dispatch = observed_dispatch  # type: ignore[method-assign]
    done = dispatch(record.effect_id, worker="w1")

    # Then DISPATCHING and the open attempt were committed before anything was sent
    assert seen == {"status": "dispatching", "open_attempts": 1, "target_rows": 0}
    assert done.status is EffectStatus.SUCCEEDED


def test_rule2_a_proved_rejection_is_retryable_with_backoff(bench) -> None:
    record = bench.submit(IDEMPOTENT)
    bench.targets[IDEMPOTENT].inject(Fault.REJECT)
    backoff = bench.registry.for_tool("idempotent_charge").backoff(1)
    # The retry time is written on the database's clock, in the write itself.
    before = database_now(bench.clock.database_offset())
    after = dispatch(record.effect_id, worker="w1")
    written_by = database_now(bench.clock.database_offset())
    assert after.status is EffectStatus.RETRYABLE
    assert after.next_action_at is not None
    assert before + backoff <= after.next_action_at <= written_by + backoff
    assert (
        "dispatch",
        record.effect_id,
        after.next_action_at,
    ) in bench.scheduler.requests
    assert bench.target_rows(record) == 0
    # Not due yet: a second job does nothing.
    assert dispatch(record.effect_id, worker="w2").status is EffectStatus.RETRYABLE
    bench.advance(60)
    assert dispatch(record.effect_id, worker="w2").status is EffectStatus.SUCCEEDED
    assert bench.target_rows(record) == 1


def test_rule2_connection_refused_never_reaches_the_target_and_is_retryable(
    bench,
) -> None:
    record = bench.submit(UNSAFE)
    bench.targets[UNSAFE].inject(Fault.REFUSE_CONNECTION)
    assert dispatch(record.effect_id, worker="w1").status is EffectStatus.RETRYABLE
    assert bench.targets[UNSAFE].requests == 0
    attempt = EffectAttempt.objects.get(effect_id=record.effect_id)
    assert attempt.bytes_may_have_left is False
    assert attempt.outcome == "not_committed"


def test_retries_stop_at_the_contract_limit(bench) -> None:
    record = bench.submit(IDEMPOTENT)
    bench.targets[IDEMPOTENT].inject(Fault.REJECT, times=10)
    for _ in range(4):  # retry_limit = 3: four attempts in all
        dispatch(record.effect_id, worker="w1")
        bench.advance(120)
    assert status(record) is EffectStatus.FAILED_FINAL
    assert bench.targets[IDEMPOTENT].requests == 4
    assert bench.target_rows(record) == 0


def test_a_terminal_refusal_is_final(bench) -> None:
    record = bench.submit(RECONCILABLE)
    bench.targets[RECONCILABLE].inject(Fault.TERMINAL)
    assert dispatch(record.effect_id, worker="w1").status is EffectStatus.FAILED_FINAL
    assert bench.target_rows(record) == 0


@pytest.mark.parametrize("safety", [IDEMPOTENT, RECONCILABLE, UNSAFE])
def test_rule3_a_lost_response_is_outcome_unknown_never_a_retry(bench, safety) -> None:
    record = bench.submit(safety)
    bench.targets[safety].inject(Fault.LOSE_RESPONSE)
    after = dispatch(record.effect_id, worker="w1")
    assert after.status is EffectStatus.OUTCOME_UNKNOWN
    assert bench.target_rows(record) == 1
    # A dispatch job that runs again (redelivery) must not resend.
    assert dispatch(record.effect_id, worker="w2").status is EffectStatus.OUTCOME_UNKNOWN
    assert bench.target_rows(record) == 1
    reconcile_requested = ("reconcile", record.effect_id) in {
        (kind, eid) for kind, eid, _ in bench.scheduler.requests
    }
    assert reconcile_requested is (safety is not UNSAFE)


def test_rule4_idempotent_unknown_redispatches_with_the_same_key(bench) -> None:
    record = bench.submit(IDEMPOTENT)
    bench.targets[IDEMPOTENT].inject(Fault.LOSE_RESPONSE)
    dispatch(record.effect_id, worker="w1")
    done = reconcile(record.effect_id, worker="w2")
    assert done.status is EffectStatus.SUCCEEDED
    target = bench.targets[IDEMPOTENT]
    assert target.requests == 2  # two requests on the wire ...
    assert bench.target_rows(record) == 1  # ... one effect: the key deduplicated
    assert {row.key for row in target.rows} == {record.downstream_key}


def test_rule4_idempotent_redispatch_stops_when_the_key_may_be_forgotten(bench) -> None:
    record = bench.submit(IDEMPOTENT)
    bench.targets[IDEMPOTENT].inject(Fault.LOSE_RESPONSE)
    dispatch(record.effect_id, worker="w1")
    bench.advance(3600 - 30)  # inside the 60 s safety margin before 1 h retention
    after = reconcile(record.effect_id, worker="w2")
    assert after.status is EffectStatus.MANUAL_REVIEW
    assert bench.targets[IDEMPOTENT].requests == 1


def test_rule5_reconcilable_probe_before_the_bound_is_inconclusive(bench) -> None:
    record = bench.submit(RECONCILABLE)
    bench.targets[RECONCILABLE].inject(Fault.TIMEOUT_BEFORE_COMMIT)
    dispatch(record.effect_id, worker="w1")
    # Reconcile is only due at the settlement deadline; force the probe early anyway.
    bench.advance(0.5)
    early = reconcile(record.effect_id, worker="w2")
    assert early.status is EffectStatus.OUTCOME_UNKNOWN  # not yet due: no probe
    assert bench.targets[RECONCILABLE].lookups == 0
    bench.advance(SETTLEMENT)
    requeued = reconcile(record.effect_id, worker="w2")
    # Past the bound, NOT_COMMITTED is conclusive: only now may it be sent again.
    assert requeued.status is EffectStatus.PREPARED
    assert bench.target_rows(record) == 0
    assert dispatch(record.effect_id, worker="w3").status is EffectStatus.SUCCEEDED
    assert bench.target_rows(record) == 1


def test_rule5_reconcilable_commit_found_by_probe_is_not_resent(bench) -> None:
    record = bench.submit(RECONCILABLE)
    bench.targets[RECONCILABLE].inject(Fault.LOSE_RESPONSE)
    dispatch(record.effect_id, worker="w1")
    bench.advance(SETTLEMENT)
    done = reconcile(record.effect_id, worker="w2")
    assert done.status is EffectStatus.SUCCEEDED
    assert bench.targets[RECONCILABLE].requests == 1
    assert bench.target_rows(record) == 1
    assert EffectReceipt.objects.get(effect_id=record.effect_id).external_id


def test_rule5_an_unavailable_lookup_is_never_taken_as_absence(bench) -> None:
    record = bench.submit(RECONCILABLE)
    bench.targets[RECONCILABLE].inject(Fault.TIMEOUT_BEFORE_COMMIT)
    dispatch(record.effect_id, worker="w1")
    bench.advance(3)
    bench.targets[RECONCILABLE].inject(Fault.PROBE_UNAVAILABLE)
    after = reconcile(record.effect_id, worker="w2")
    assert after.status is EffectStatus.OUTCOME_UNKNOWN
    assert bench.targets[RECONCILABLE].requests == 1


def test_rule6_unsafe_unknown_is_never_redispatched(bench) -> None:
    record = bench.submit(UNSAFE)
    bench.targets[UNSAFE].inject(Fault.LOSE_RESPONSE)
    dispatch(record.effect_id, worker="w1")
    for _ in range(3):
        bench.advance(3600)
        reconcile(record.effect_id, worker="w2")
        dispatch(record.effect_id, worker="w3")
        sweep()
    assert status(record) is EffectStatus.OUTCOME_UNKNOWN
    assert bench.targets[UNSAFE].requests == 1


@pytest.mark.parametrize("safety", [IDEMPOTENT, RECONCILABLE, UNSAFE])
def test_worker_death_after_commit_becomes_unknown_at_lease_expiry(bench, safety) -> None:
    record = bench.submit(safety)
    bench.switch.when = "after_commit"
    with pytest.raises(WorkerKilled):
        dispatch(record.effect_id, worker="w1")
    assert status(record) is EffectStatus.DISPATCHING
    sweep()
    assert status(record) is EffectStatus.DISPATCHING  # the lease is still valid
    bench.advance(31)
    report = sweep()
    assert report.leases_expired == 1
    assert status(record) is EffectStatus.OUTCOME_UNKNOWN
    attempt = EffectAttempt.objects.get(effect_id=record.effect_id)
    assert (attempt.outcome, attempt.bytes_may_have_left) == ("unknown", True)
    assert attempt.ended_at is not None
    bench.advance(3)
    reconcile(record.effect_id, worker="w2")
    expected = (
        EffectStatus.OUTCOME_UNKNOWN if safety is UNSAFE else EffectStatus.SUCCEEDED
    )
    assert status(record) is expected
    assert bench.target_rows(record) == 1


def test_transactional_death_rolls_back_mutation_and_attempt_together(bench) -> None:
    record = bench.submit(TRANSACTIONAL)
    bench.switch.when = "after_commit"
    with pytest.raises(WorkerKilled):
        dispatch(record.effect_id, worker="w1")
    assert status(record) is EffectStatus.PREPARED
    assert bench.target_rows(record) == 0
    assert EffectAttempt.objects.filter(effect_id=record.effect_id).count() == 0
    assert dispatch(record.effect_id, worker="w2").status is EffectStatus.SUCCEEDED
    assert bench.target_rows(record) == 1


def test_a_zombie_writer_is_fenced_out_and_counted(bench) -> None:
    # Given a worker that committed DISPATCHING and then stalled past its lease
    record = bench.submit(IDEMPOTENT)
    bench.switch.when = "after_commit"
    with pytest.raises(WorkerKilled):
        dispatch(record.effect_id, worker="zombie")
    zombie_view = load_effect_for_worker(record.effect_id)
    bench.advance(31)
    sweep()
    bench.advance(1)
    assert reconcile(record.effect_id, worker="w2").status is EffectStatus.SUCCEEDED
    # When the zombie wakes and records its (old) success
    from effect_broker.services.outcomes import record_success
    from effect_broker.services.runtime import get_runtime

    rt = get_runtime()
    contract = bench.registry.for_tool("idempotent_charge")
    from effect_broker.domain.errors import StaleWriteError
    from effect_broker.services.dispatch import note_stale_write

    with pytest.raises(StaleWriteError) as err:
        record_success(
            rt,
            zombie_view,
            contract,
            DispatchResult(external_id="ch_zombie", output={"id": "ch_zombie"}),
            actor="zombie",
            attempt_id=None,
            event_type="dispatch_succeeded",
        )
    note_stale_write(rt, err.value, actor="zombie")
    # Then nothing it wrote survived, the target saw one effect, and the write is counted
    receipt = EffectReceipt.objects.get(effect_id=record.effect_id)
    assert receipt.external_id != "ch_zombie"
    assert bench.target_rows(record) == 1
    assert (
        StaleWrite.objects.filter(effect_id=record.effect_id, actor="zombie").count() == 1
    )


def test_rule7_a_succeeded_effect_is_never_dispatched_again(bench) -> None:
    record = bench.submit(IDEMPOTENT)
    dispatch(record.effect_id, worker="w1")
    for _ in range(3):
        dispatch(record.effect_id, worker="w2")
        reconcile(record.effect_id, worker="w2")
        sweep()
    assert bench.targets[IDEMPOTENT].requests == 1
    assert EffectReceipt.objects.filter(effect_id=record.effect_id).count() == 1


def test_rule5_not_committed_before_the_bound_counts_as_unknown(bench) -> None:
    # Given a lost request whose row, if any, may not be visible yet
    from effect_broker import store
    from effect_broker.services import reconcile as reconcile_module
    from effect_broker.services.runtime import get_runtime

    record = bench.submit(RECONCILABLE)
    bench.targets[RECONCILABLE].inject(Fault.TIMEOUT_BEFORE_COMMIT)
    unknown = dispatch(record.effect_id, worker="w1")
    claimed = store.transition(
        unknown,
        EffectStatus.RECONCILING,
        event_type="reconcile_started",
        actor="w2",
        now=bench.clock.now(),
    )
    # When the lookup answers NOT_COMMITTED before the settlement deadline
    contract = bench.registry.for_tool("reconcilable_charge")
    after = reconcile_module._reconcile_by_probe(
        get_runtime(), claimed, contract, worker="w2"
    )
    # Then it is not conclusive: still unknown, nothing resent, probe again at the bound
    assert bench.targets[RECONCILABLE].lookups == 1
    assert after.status is EffectStatus.OUTCOME_UNKNOWN
    assert after.next_action_at == unknown.settlement_deadline
    assert bench.targets[RECONCILABLE].requests == 1
