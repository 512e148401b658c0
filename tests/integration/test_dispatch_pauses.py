"""Operator pauses of dispatch (issue 24, item 7), driven through the engine bench.

A paused tool dispatches nothing until it is resumed, and its effects wait (never
failed); a pause holds only what it names; nothing already sent is affected (an
attempt in flight finishes, a reconcilable lookup still runs); nothing polls while
paused (the job ends, the sweeper leaves held effects alone) and resume re-defers
them. A pause is an audit record: who, when, why, resumed once, never rewritten.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from effect_broker.adapters.base import DispatchRequest, DispatchResult, EffectAdapter
from effect_broker.domain.errors import (
    AlreadyPausedError,
    InvalidRequestError,
    OperatorForbiddenError,
    PauseNotFoundError,
    TenantNotFoundError,
    UnknownContractError,
)
from effect_broker.domain.records import EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import DispatchPause
from effect_broker.observability import metrics
from effect_broker.services import pauses, runtime, sweeper
from effect_broker.services.dispatch import dispatch
from effect_broker.services.reconcile import reconcile
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from effect_broker.store import load_effect_for_worker
from tests.integration.conftest import make_operator
from tests.integration.engine.harness import TOOLS, Bench

S = EffectStatus
IDEMPOTENT, RECONCILABLE = SafetyClass.IDEMPOTENT, SafetyClass.RECONCILABLE


@pytest.fixture
def ann(db: None) -> Any:
    return make_operator("ann")


def asked(bench: Bench, kind: str, effect_id: str) -> bool:
    """Whether the services asked for a ``kind`` job of ``effect_id``."""
    return any(k == kind and e == effect_id for k, e, _ in bench.scheduler.requests)


def deferred(record: Any, reason: str) -> float:
    return metrics.DEFERRED.labels(*metrics.record_labels(record), reason)._value.get()


def test_a_paused_tool_dispatches_nothing_until_resumed(bench: Bench, ann: Any) -> None:
    # Given an operator paused the idempotent tool
    paused = pauses.pause(
        tool=TOOLS[IDEMPOTENT], reason="stripe incident INC-42", operator=ann
    )
    record = bench.submit(IDEMPOTENT)
    other = bench.submit(SafetyClass.UNSAFE)  # another tool, not paused
    bench.scheduler.requests.clear()
    before = deferred(record, "paused")
    # When its dispatch job runs
    after = dispatch(record.effect_id, worker="w1")
    # Then nothing was sent, the effect waits (not failed), and its job asked for
    # no later run: nothing polls while paused
    assert after.status is S.PREPARED
    assert after.attempt_count == 0
    assert bench.adapters[IDEMPOTENT].sends == []
    assert bench.target_rows(record) == 0
    assert bench.scheduler.requests == []
    assert deferred(record, "paused") == before + 1
    # ... nor does the sweeper re-defer it, while it does re-defer the other tool's
    bench.advance(60)
    sweeper.sweep(actor="sweeper")
    assert not asked(bench, "dispatch", record.effect_id)
    assert asked(bench, "dispatch", other.effect_id)
    assert pauses.held_count(paused.pause_id) == 1
    # When the operator resumes the pause
    resumed = pauses.resume(paused.pause_id, operator=ann, reason="incident over")
    # Then its held effect's job is deferred again, and it is sent once
    assert resumed.redeferred == 1
    assert asked(bench, "dispatch", record.effect_id)
    assert (resumed.pause.resumed_by, resumed.pause.resume_reason) == (
        "ann",
        "incident over",
    )
    done = dispatch(record.effect_id, worker="w1")
    assert done.status is S.SUCCEEDED
    assert bench.target_rows(record) == 1
    assert pauses.held_count(paused.pause_id) == 0


def test_a_pause_holds_only_what_it_names(bench: Bench, ann: Any) -> None:
    # Given a second tenant, and a pause of one tool for the bench's tenant only
    other_tenant = create_tenant(f"other-{uuid.uuid4().hex[:6]}")[0]
    pauses.pause(
        tool=TOOLS[IDEMPOTENT],
        tenant=bench.tenant.name,
        reason="fraud review",
        operator=ann,
    )
    mine = bench.submit(IDEMPOTENT)
    theirs = submit(
        other_tenant,
        EffectRequest(
            operation_key="op:theirs", tool=TOOLS[IDEMPOTENT], arguments={"k": 1}
        ),
    ).effect
    also_mine = bench.submit(SafetyClass.UNSAFE)
    # When their jobs run, then only the tenant's effect of that tool waits
    assert dispatch(mine.effect_id, worker="w1").status is S.PREPARED
    assert dispatch(theirs.effect_id, worker="w1").status is S.SUCCEEDED
    assert dispatch(also_mine.effect_id, worker="w1").status is S.SUCCEEDED


def test_a_contract_version_pause_holds_that_version_only(bench: Bench, ann: Any) -> None:
    contract = bench.registry.for_tool(TOOLS[IDEMPOTENT])
    record = bench.submit(IDEMPOTENT)
    with pytest.raises(UnknownContractError, match=r"no contract 't\.idempotent@9'"):
        pauses.pause(contract=f"{contract.name}@9", reason="x", operator=ann)
    paused = pauses.pause(contract=contract.label, reason="bad deploy", operator=ann)
    assert paused.describe() == f"contract {contract.label}"
    assert dispatch(record.effect_id, worker="w1").status is S.PREPARED


class PausingAdapter(EffectAdapter):
    """Sends through ``inner``, after an operator paused the tool mid-attempt."""

    def __init__(self, inner: EffectAdapter, operator: Any) -> None:
        super().__init__(inner.contract)
        self.inner, self.operator = inner, operator

    def dispatch(self, request: DispatchRequest) -> DispatchResult:
        pauses.pause(tool=request.contract.tool, reason="mid-air", operator=self.operator)
        return self.inner.dispatch(request)

    def _send(self, request: DispatchRequest) -> DispatchResult:  # pragma: no cover
        raise NotImplementedError

    def probe(self, request: Any) -> Any:  # pragma: no cover
        return self.inner.probe(request)


def test_an_attempt_in_flight_when_the_pause_comes_finishes(
    bench: Bench, ann: Any
) -> None:
    record = bench.submit(IDEMPOTENT)
    inner = bench.adapters[IDEMPOTENT]
    with runtime.override(adapter_for=lambda contract: PausingAdapter(inner, ann)):
        done = dispatch(record.effect_id, worker="w1")
    assert done.status is S.SUCCEEDED
    assert bench.target_rows(record) == 1
    # ... and the next one waits
    later = bench.submit(IDEMPOTENT)
    assert dispatch(later.effect_id, worker="w1").status is S.PREPARED


def test_a_lookup_runs_while_paused_but_a_same_key_resend_waits(
    bench: Bench, ann: Any
) -> None:
    # Given two lost answers: a reconcilable one (settled by a lookup) and an
    # idempotent one (settled by a same-key resend), and both tools paused
    looked_up = bench.unknown_outcome(RECONCILABLE)
    resent = bench.unknown_outcome(IDEMPOTENT)
    for safety in (RECONCILABLE, IDEMPOTENT):
        pauses.pause(tool=TOOLS[safety], reason="target incident", operator=ann)
    bench.advance(5)  # past the reconcilable settlement bound
    bench.scheduler.requests.clear()
    # When their reconcile jobs run
    probed = reconcile(looked_up.effect_id, worker="w1")
    held = reconcile(resent.effect_id, worker="w1")
    # Then the lookup (a read, creating nothing) settled what was already sent
    assert probed.status is S.SUCCEEDED
    assert bench.target_rows(looked_up) == 1
    # ... while the resend (a request that could charge) waits, without a new
    # attempt and without polling, and the sweeper leaves it alone too
    assert held.status is S.OUTCOME_UNKNOWN
    assert held.attempt_count == resent.attempt_count
    sweeper.sweep(actor="sweeper")
    assert not asked(bench, "reconcile", resent.effect_id)
    # When its pause is resumed, then its reconciliation runs and it settles once
    (pause,) = [p for p in pauses.active_pauses() if p.scope.tool == TOOLS[IDEMPOTENT]]
    assert pauses.resume(pause.pause_id, operator=ann).redeferred == 1
    assert asked(bench, "reconcile", resent.effect_id)
    assert reconcile(resent.effect_id, worker="w1").status is S.SUCCEEDED
    assert bench.target_rows(resent) == 1


def test_pausing_and_resuming_are_an_operators_acts_with_a_reason(
    bench: Bench, ann: Any
) -> None:
    tool = TOOLS[IDEMPOTENT]
    outsider = make_operator("eve", permitted=False)
    with pytest.raises(OperatorForbiddenError):
        pauses.pause(tool=tool, reason="x", operator=outsider)
    with pytest.raises(InvalidRequestError, match="reason is required"):
        pauses.pause(tool=tool, reason="  ", operator=ann)
    with pytest.raises(InvalidRequestError, match="needs a scope"):
        pauses.pause(reason="x", operator=ann)
    with pytest.raises(UnknownContractError, match="no contract for tool 'charge_crad'"):
        pauses.pause(tool="charge_crad", reason="typo", operator=ann)
    with pytest.raises(TenantNotFoundError):
        pauses.pause(tenant="nobody", reason="x", operator=ann)
    assert not DispatchPause.objects.exists()  # none of them recorded anything
    first = pauses.pause(tool=tool, reason="incident", operator=ann)
    with pytest.raises(AlreadyPausedError) as again:
        pauses.pause(tool=tool, reason="another reason", operator=ann)
    assert again.value.details["pause_id"] == first.pause_id
    with pytest.raises(OperatorForbiddenError):
        pauses.resume(first.pause_id, operator=outsider)
    pauses.resume(tool=tool, operator=ann)  # by its exact scope
    with pytest.raises(PauseNotFoundError):
        pauses.resume(first.pause_id, operator=ann)  # resumed once
    with pytest.raises(PauseNotFoundError, match="no pause is active"):
        pauses.resume(tool=tool, operator=ann)
    with pytest.raises(PauseNotFoundError):
        pauses.resume("not-a-uuid", operator=ann)
    # A new pause of the same scope is a new record; the old one is kept
    pauses.pause(tool=tool, reason="incident 2", operator=ann)
    assert [p.active for p in pauses.list_pauses(include_resumed=True)] == [True, False]


def test_a_pause_row_is_an_audit_record_raw_sql_cannot_rewrite(
    bench: Bench, ann: Any
) -> None:
    paused = pauses.pause(tool=TOOLS[IDEMPOTENT], reason="incident", operator=ann)
    for statement in (
        "UPDATE dispatch_pauses SET reason = 'nothing happened' WHERE id = %s",
        "UPDATE dispatch_pauses SET paused_by = 'mallory' WHERE id = %s",
        "UPDATE dispatch_pauses SET resumed_at = now() WHERE id = %s",  # by nobody
        "DELETE FROM dispatch_pauses WHERE id = %s",
    ):
        with (
            pytest.raises(DatabaseError),
            transaction.atomic(),
            connection.cursor() as cur,
        ):
            cur.execute(statement, [paused.pause_id])
    pauses.resume(paused.pause_id, operator=ann)
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            "UPDATE dispatch_pauses SET resumed_by = 'mallory' WHERE id = %s",
            [paused.pause_id],
        )
    row = pauses.get_pause(paused.pause_id)
    assert (row.reason, row.paused_by, row.resumed_by) == ("incident", "ann", "ann")


def test_a_held_effect_says_why_it_waits_and_a_sent_one_does_not(
    bench: Bench, ann: Any
) -> None:
    record = bench.submit(IDEMPOTENT)
    assert pauses.pause_holding(record) is None
    paused = pauses.pause(tool=TOOLS[IDEMPOTENT], reason="incident", operator=ann)
    assert pauses.pause_holding(record) == paused
    dispatch(record.effect_id, worker="w1")
    assert pauses.pause_holding(load_effect_for_worker(record.effect_id)) == paused
    pauses.resume(paused.pause_id, operator=ann)
    done = dispatch(record.effect_id, worker="w1")
    pauses.pause(tool=TOOLS[IDEMPOTENT], reason="again", operator=ann)
    assert pauses.pause_holding(done) is None  # succeeded: nothing left to hold
