"""A Hypothesis rule-based state machine over the service layer.

Random submits and replays, dispatch outcomes (lost responses, rejections, refusals,
timeouts), worker kills before send and after the target committed, lease expiries,
probes and clock moves - all on the real Postgres ledger. Invariants after every step:

* never more than one target effect for idempotent, reconcilable and transactional
  effects, and never a broker-issued duplicate for unsafe ones;
* every recorded transition is in the spec's table; versions strictly increase, one
  event per version; every event chain verifies;
* a SUCCEEDED effect has exactly one receipt and exactly one target effect.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from effect_broker import store
from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.states import EffectStatus, SafetyClass, check_transition
from effect_broker.models import EffectEvent, EffectReceipt
from effect_broker.services.dispatch import dispatch
from effect_broker.services.reconcile import reconcile
from effect_broker.services.sweeper import sweep
from tests.integration.engine.harness import Bench, WorkerKilled, engine_bench

# Events that rewrite the row without changing its status (fenced like any other write).
SAME_STATUS_EVENTS = {"lease_extended"}

FAULTS = [
    None,
    Fault.LOSE_RESPONSE,
    Fault.LOSE_RESPONSE,
    Fault.REJECT,
    Fault.REFUSE_CONNECTION,
    Fault.TIMEOUT_BEFORE_COMMIT,
    Fault.TERMINAL,
    Fault.PROBE_UNAVAILABLE,
]


class EngineMachine(RuleBasedStateMachine):
    """Drives submit/dispatch/reconcile/sweep in random orders and checks the ledger."""

    effects = Bundle("effects")

    def __init__(self) -> None:
        super().__init__()
        self._ctx = engine_bench()
        self.bench: Bench = self._ctx.__enter__()
        self.records: dict[str, object] = {}
        self.last_version: dict[str, int] = {}

    def teardown(self) -> None:
        self._ctx.__exit__(None, None, None)

    @initialize(target=effects, safety=st.sampled_from(list(SafetyClass)))
    def first_submit(self, safety: SafetyClass) -> str:
        return self._submit(safety)

    # Few effects per run: rules then revisit the same effects, which is what long
    # failure chains (lose, wait past a horizon, recover) need.
    @precondition(lambda self: len(self.records) < 3)
    @rule(target=effects, safety=st.sampled_from(list(SafetyClass)))
    def submit(self, safety: SafetyClass) -> str:
        return self._submit(safety)

    def _submit(self, safety: SafetyClass) -> str:
        record = self.bench.submit(safety)
        self.records[record.effect_id] = record
        return record.effect_id

    @rule(effect_id=effects)
    def replay(self, effect_id: str) -> None:
        record = self.records[effect_id]
        again = self.bench.submit(record.safety, key=record.operation_key)  # type: ignore[attr-defined]
        assert again.effect_id == effect_id

    @rule(
        data=st.data(),
        fault=st.sampled_from(FAULTS),
        kill=st.sampled_from([None, None, None, "before_send", "after_commit"]),
    )
    def run_dispatch(
        self, data: st.DataObject, fault: Fault | None, kill: str | None
    ) -> None:
        effect_id = self._pick(data, {EffectStatus.PREPARED, EffectStatus.RETRYABLE})
        if effect_id is None:
            return
        self._arm(effect_id, fault, kill)
        try:
            dispatch(effect_id, worker="w-dispatch")
        except WorkerKilled:
            pass
        finally:
            self._disarm()

    @rule(
        data=st.data(),
        fault=st.sampled_from(FAULTS),
        kill=st.sampled_from([None, None, "after_commit"]),
    )
    def run_reconcile(
        self, data: st.DataObject, fault: Fault | None, kill: str | None
    ) -> None:
        effect_id = self._pick(data, {EffectStatus.OUTCOME_UNKNOWN})
        if effect_id is None:
            return
        self._arm(effect_id, fault, kill)
        try:
            reconcile(effect_id, worker="w-reconcile")
        except WorkerKilled:
            pass
        finally:
            self._disarm()

    @rule(effect_id=effects)
    def redelivered_jobs_run_anyway(self, effect_id: str) -> None:
        # Queues redeliver: a job may run for an effect in any state, at any time.
        for job in (dispatch, reconcile):
            job(effect_id, worker="w-redelivered")

    def _pick(self, data: st.DataObject, statuses: set[EffectStatus]) -> str | None:
        """Choose an effect a worker would pick up, and run its job when it is due."""
        ready = [
            record
            for record in map(store.load_effect_for_worker, self.records)
            if record.status in statuses
        ]
        if not ready:
            return None
        record = data.draw(st.sampled_from(ready))
        if (
            record.next_action_at is not None
            and record.next_action_at > self.bench.clock.now()
        ):
            self.bench.clock.advance(record.next_action_at - self.bench.clock.now())
        return record.effect_id

    def _arm(self, effect_id: str, fault: Fault | None, kill: str | None) -> None:
        safety = self.records[effect_id].safety  # type: ignore[attr-defined]
        self.bench.switch.when = kill
        if fault is not None and safety is not SafetyClass.TRANSACTIONAL:
            self.bench.targets[safety].inject(fault)

    def _disarm(self) -> None:
        self.bench.switch.when = None
        for target in self.bench.targets.values():
            target.clear_faults()

    @rule()
    def run_sweep(self) -> None:
        sweep()

    # Weighted toward the horizons that matter: settlement (2 s), lease (30 s) and
    # the idempotency key's retention (1 h).
    @rule(seconds=st.sampled_from([0.5, 2, 3, 31, 40, 1800, 3600, 3600]))
    def advance_clock(self, seconds: float) -> None:
        self.bench.advance(seconds)

    @invariant()
    def target_effects_are_never_duplicated(self) -> None:
        for effect_id, record in self.records.items():
            rows = self.bench.target_rows(record)  # type: ignore[arg-type]
            assert rows <= 1, f"{record.safety} effect {effect_id} applied {rows} times"  # type: ignore[attr-defined]

    @invariant()
    def succeeded_means_one_receipt_and_one_effect(self) -> None:
        for effect_id, record in self.records.items():
            current = store.load_effect_for_worker(effect_id)
            if current.status is EffectStatus.SUCCEEDED:
                assert EffectReceipt.objects.filter(effect_id=effect_id).count() == 1
                assert self.bench.target_rows(record) == 1  # type: ignore[arg-type]

    @invariant()
    def ledger_history_is_legal_and_verifiable(self) -> None:
        for effect_id in self.records:
            current = store.load_effect_for_worker(effect_id)
            assert current.version >= self.last_version.get(effect_id, 1)
            self.last_version[effect_id] = current.version
            events = list(
                EffectEvent.objects.filter(effect_id=effect_id).order_by("sequence")
            )
            assert [e.sequence for e in events] == list(range(1, current.version + 1))
            for event in events[1:]:
                if event.event_type in SAME_STATUS_EVENTS:
                    assert event.old_status == event.new_status
                else:
                    check_transition(event.old_status, event.new_status)
            assert store.verify_event_chain(effect_id) == current.version


@pytest.mark.django_db
def test_engine_state_machine() -> None:
    run_state_machine_as_test(
        EngineMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
