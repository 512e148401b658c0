"""Issue 24: an operator's approval before dispatch, bound to the payload, single-use,
on the database's clock.

Acceptance, on the engine bench (real PostgreSQL, simulated targets that count what
they receive): a contract with ``approval = "required"``: submit -> awaiting_approval
and the target receives nothing; the operator's approval -> succeeded with one charge;
a second approval is refused without a second dispatch; a denial -> failed_final and
no request. Plus the edges: a dispatch job that runs anyway, the deadline on the
database's clock, a redeploy that changes the pinned contract, two operators at once.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from effect_broker import store
from effect_broker.domain.approval import approval_binding
from effect_broker.domain.contracts import ContractRegistry, parse_contracts
from effect_broker.domain.errors import (
    AlreadyApprovedError,
    ApprovalExpiredError,
    ApprovalNotPendingError,
    OperatorForbiddenError,
)
from effect_broker.domain.records import EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.scheduling import ProcrastinateScheduler
from effect_broker.services import approvals, runtime, sweeper
from effect_broker.services.batch_submission import CREATED, submit_many
from effect_broker.services.dispatch import dispatch
from effect_broker.services.runtime import get_runtime
from tests.integration.approval_support import (
    APPROVED,
    LARGE,
    approval_contracts,
    attempts,
    charge,
    dispatch_jobs,
    events,
    registry,
)
from tests.integration.conftest import make_operator
from tests.integration.engine.harness import Bench

S = EffectStatus
IDEMPOTENT = SafetyClass.IDEMPOTENT
V2 = """
[[contract]]
name = "t.approved"
version = "2"
tool = "approved_charge"
safety = "idempotent"
key_retention = "2h"
approval = "required"
"""


@pytest.fixture
def approving(bench: Bench) -> Any:
    """The bench with the approval contracts deployed."""
    with approval_contracts():
        yield bench


def db_now(bench: Bench) -> datetime:
    return store.database_now(bench.clock.database_offset())


def sent(bench: Bench) -> int:
    """Requests the idempotent target received, from its own counter."""
    return bench.targets[IDEMPOTENT].requests


# --- acceptance ------------------------------------------------------------------------


def test_a_submit_waits_for_approval_and_the_target_receives_nothing(
    approving: Bench,
) -> None:
    # Given a contract with approval = "required"
    before = db_now(approving)
    # When an effect is submitted
    record = charge(approving)
    after = db_now(approving)
    # Then it awaits approval, its deadline the database's now + 1 h (the default)
    assert record.status is S.AWAITING_APPROVAL
    assert record.next_action_at is not None
    assert before + timedelta(hours=1) <= record.next_action_at
    assert record.next_action_at <= after + timedelta(hours=1)
    # And no dispatch job was asked for, and nothing was sent
    assert dispatch_jobs(approving, record) == 0
    # Even by a dispatch job that runs anyway: it refuses
    again = dispatch(record.effect_id, worker="stray-job")
    assert (again.status, again.version) == (S.AWAITING_APPROVAL, record.version)
    assert sent(approving) == 0
    assert attempts(record) == 0
    assert events(record)[0][:2] == ("reserved", "awaiting_approval")
    assert events(record)[0][3]["approval_rule"] == "every effect"


def test_the_operators_approval_dispatches_once_and_charges_once(
    approving: Bench, operator: Any
) -> None:
    record = charge(approving)
    # When the operator approves it
    approved = approvals.approve(
        approving.tenant, record.effect_id, operator=operator, reason="invoice checked"
    )
    # Then it is prepared, with exactly one dispatch job
    assert approved.status is S.PREPARED
    assert dispatch_jobs(approving, record) == 1
    # And the approval event binds the effect, its payload and its pinned contract
    kind, status, actor, facts = events(record)[-1]
    assert (kind, status, actor, facts["reason"]) == (
        "approved",
        "prepared",
        "ann",
        "invoice checked",
    )
    contract = get_runtime().registry.get("t.approved", "1")
    binding = approval_binding(record.effect_id, record.request_hash, contract)
    assert facts["binding"] == binding
    assert facts["contract"] == "t.approved@1"
    # When the job runs: succeeded, one request, one charge in the target's table
    done = dispatch(record.effect_id, worker="w1")
    assert done.status is S.SUCCEEDED
    assert (sent(approving), approving.target_rows(done)) == (1, 1)
    # And the attempt's claim names the approval it consumed
    started = [e for e in events(record) if e[0] == "dispatch_started"]
    assert [e[3]["approval"] for e in started] == [binding]


def test_a_second_approval_is_refused_without_a_second_dispatch(
    approving: Bench, operator: Any
) -> None:
    record = charge(approving)
    approvals.approve(approving.tenant, record.effect_id, operator=operator, reason="ok")
    second = make_operator("bob")
    chain = len(events(record))
    # Before the dispatch and after it, a second approval is refused, naming the first
    for moment in ("queued", "dispatched"):
        with pytest.raises(AlreadyApprovedError) as refused:
            approvals.approve(
                approving.tenant, record.effect_id, operator=second, reason="me too"
            )
        assert refused.value.code == "already_approved"
        assert refused.value.details["approved_by"] == "ann"
        assert dispatch_jobs(approving, record) == 1, moment
        if moment == "queued":
            assert len(events(record)) == chain
            dispatch(record.effect_id, worker="w1")
    # A denial after the approval is refused the same way: it cannot stop a dispatch
    with pytest.raises(AlreadyApprovedError):
        approvals.deny(approving.tenant, record.effect_id, operator=second, reason="no")
    assert (sent(approving), approving.target_rows(record)) == (1, 1)
    assert store.load_effect_for_worker(record.effect_id).status is S.SUCCEEDED


def test_a_denial_ends_failed_final_and_nothing_is_ever_sent(
    approving: Bench, operator: Any
) -> None:
    record = charge(approving)
    denied = approvals.deny(
        approving.tenant, record.effect_id, operator=operator, reason="wrong amount"
    )
    assert denied.status is S.FAILED_FINAL
    kind, status, actor, facts = events(record)[-1]
    assert (kind, status, actor, facts["reason"]) == (
        "approval_denied",
        "failed_final",
        "ann",
        "wrong amount",
    )
    # Nothing queued, and a job that runs anyway sends nothing
    dispatch(record.effect_id, worker="stray-job")
    assert dispatch_jobs(approving, record) == 0
    assert (sent(approving), attempts(record)) == (0, 0)
    # The decision is final: an approval now is refused
    with pytest.raises(ApprovalNotPendingError, match="denied by ann"):
        approvals.approve(
            approving.tenant, record.effect_id, operator=operator, reason="oops"
        )
    assert store.verify_event_chain(record.effect_id) == len(events(record))


def test_only_an_operator_may_decide(approving: Bench) -> None:
    record = charge(approving)
    clerk = make_operator("clerk", permitted=False)
    for decide in (approvals.approve, approvals.deny):
        with pytest.raises(OperatorForbiddenError):
            decide(approving.tenant, record.effect_id, operator=clerk, reason="mine")
    assert store.load_effect_for_worker(record.effect_id).version == record.version


# --- the rule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "waits"),
    [
        ({"amount_minor": 50000}, False),
        ({"amount_minor": 50001}, True),
        ({"amount_minor": "60000"}, True),  # a number sent as text cannot slip past
        ({"amount": 60000}, True),  # nor a missing one
        ({"amount_minor": True}, True),
    ],
)
def test_approval_when_asks_only_for_amounts_above_the_threshold(
    approving: Bench, arguments: dict[str, Any], waits: bool
) -> None:
    record = charge(approving, LARGE, **arguments)
    assert record.status is (S.AWAITING_APPROVAL if waits else S.PREPARED)
    assert dispatch_jobs(approving, record) == (0 if waits else 1)


# --- the deadline, on the database's clock ----------------------------------------------


class AheadClock:
    """A host whose wall clock runs ``skew`` ahead; the database's clock is the
    bench's (the offset a test moved)."""

    def __init__(self, bench: Bench, skew: timedelta) -> None:
        self.inner, self.skew = bench.clock, skew

    def now(self) -> datetime:
        return self.inner.now() + self.skew

    def monotonic(self) -> float:
        return self.inner.monotonic()

    def database_offset(self) -> timedelta:
        return self.inner.database_offset()


def test_the_deadline_is_the_databases_not_a_hosts(
    approving: Bench, operator: Any
) -> None:
    # Given a submitting API host and a sweeper whose wall clocks run 2 h ahead
    with runtime.override(clock=AheadClock(approving, timedelta(hours=2))):
        before = db_now(approving)
        record = charge(approving)
        swept = sweeper.sweep()
    # Then the deadline is the database's now + 1 h, and nothing expired it
    assert record.next_action_at is not None
    assert record.next_action_at - before < timedelta(hours=1, seconds=5)
    assert swept.approvals_expired == 0
    assert store.load_effect_for_worker(record.effect_id).status is S.AWAITING_APPROVAL
    # When the database's clock passes the deadline
    approving.advance(3600 + 1)
    swept = sweeper.sweep()
    # Then the sweeper ends it failed_final, approval_expired, never sent
    assert swept.approvals_expired == 1
    expired = store.load_effect_for_worker(record.effect_id)
    assert expired.status is S.FAILED_FINAL
    kind, _, _, facts = events(record)[-1]
    assert (kind, facts["reason"], facts["attempts"]) == (
        "approval_expired",
        "approval_expired",
        0,
    )
    assert (sent(approving), attempts(record), dispatch_jobs(approving, record)) == (
        0,
        0,
        0,
    )
    # And an approval now is refused as expired
    with pytest.raises(ApprovalExpiredError):
        approvals.approve(
            approving.tenant, record.effect_id, operator=operator, reason="x"
        )


def test_an_approval_after_the_deadline_is_too_late_even_before_the_sweeper(
    approving: Bench, operator: Any
) -> None:
    record = charge(approving)
    approving.advance(3600 + 1)
    with pytest.raises(ApprovalExpiredError) as late:
        approvals.approve(
            approving.tenant, record.effect_id, operator=operator, reason="x"
        )
    assert late.value.code == "approval_expired"
    # The refusal expired it, in the transaction that checked the deadline
    assert store.load_effect_for_worker(record.effect_id).status is S.FAILED_FINAL
    assert events(record)[-1][0] == "approval_expired"
    assert dispatch_jobs(approving, record) == 0
    assert sent(approving) == 0


# --- a redeploy -------------------------------------------------------------------------


def test_an_approval_does_not_survive_a_redeploy_that_changes_the_pinned_contract(
    approving: Bench, operator: Any
) -> None:
    record = charge(approving)
    approvals.approve(approving.tenant, record.effect_id, operator=operator, reason="ok")
    # Given a redeploy that edits t.approved v1 in place (its retry budget) after the
    # approval, before the worker dispatches
    with approval_contracts(extra="retry_limit = 9"):
        held = dispatch(record.effect_id, worker="w-new-deploy")
        # Then nothing is sent: the effect waits for an operator again, fresh deadline
        assert held.status is S.AWAITING_APPROVAL
        assert (sent(approving), attempts(record)) == (0, 0)
        kind, status, actor, facts = events(record)[-1]
        assert (kind, status, actor) == (
            "approval_invalidated",
            "awaiting_approval",
            "w-new-deploy",
        )
        assert "a redeploy changed the contract" in facts["reason"]
        assert held.next_action_at is not None
        assert held.next_action_at > db_now(approving) + timedelta(minutes=59)
        # And an approval under the terms now deployed is sent, once
        approvals.approve(
            approving.tenant, record.effect_id, operator=operator, reason="new terms ok"
        )
        done = dispatch(record.effect_id, worker="w-new-deploy")
    assert done.status is S.SUCCEEDED
    assert (sent(approving), approving.target_rows(done)) == (1, 1)


def test_deploying_a_new_version_leaves_an_approval_of_the_pinned_one_valid(
    approving: Bench, operator: Any
) -> None:
    record = charge(approving)
    approvals.approve(approving.tenant, record.effect_id, operator=operator, reason="ok")
    # Given v2 deployed: v1 deactivated, otherwise unchanged (the effect is pinned)
    v1 = registry(extra="active = false")
    v2 = parse_contracts(V2, source="v2")
    with runtime.override(registry=ContractRegistry([*v1, *v2], source="deployed")):
        assert get_runtime().registry.for_tool(APPROVED).version == "2"
        done = dispatch(record.effect_id, worker="w1")
    assert done.status is S.SUCCEEDED
    assert (sent(approving), approving.target_rows(done)) == (1, 1)


# --- two operators at once --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_operators_approving_at_once_make_one_dispatch(approving: Bench) -> None:
    record = charge(approving)
    operators = [make_operator(f"op{n}") for n in range(4)]
    barrier = threading.Barrier(len(operators))
    outcomes: list[str] = []

    def decide(user: Any) -> None:
        try:
            barrier.wait()
            approvals.approve(
                approving.tenant, record.effect_id, operator=user, reason="go"
            )
            outcomes.append("approved")
        except AlreadyApprovedError as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(u,)) for u in operators]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # One approval, the others told "already approved"; one dispatch job, one charge
    assert sorted(outcomes) == ["already_approved"] * 3 + ["approved"]
    assert [e[0] for e in events(record)].count("approved") == 1
    assert dispatch_jobs(approving, record) == 1
    done = dispatch(record.effect_id, worker="w1")
    assert done.status is S.SUCCEEDED
    assert (sent(approving), approving.target_rows(done)) == (1, 1)


def test_a_replayed_submit_returns_the_waiting_effect_and_queues_nothing(
    approving: Bench, operator: Any
) -> None:
    first = charge(approving, key="order:7:charge")
    for _ in range(3):
        again = charge(approving, key="order:7:charge")
        assert (again.effect_id, again.status) == (first.effect_id, S.AWAITING_APPROVAL)
    approvals.approve(approving.tenant, first.effect_id, operator=operator, reason="ok")
    dispatch(first.effect_id, worker="w1")
    replay = charge(approving, key="order:7:charge")
    assert replay.status is S.SUCCEEDED
    assert dispatch_jobs(approving, first) == 1
    assert (sent(approving), approving.target_rows(first)) == (1, 1)


# --- a batch ---------------------------------------------------------------------------


def test_a_batch_reserves_each_item_as_its_contract_says(approving: Bench) -> None:
    # Given a batch of a small amount (no approval) and a large one (approval)
    small = EffectRequest(
        operation_key="batch:small", tool=LARGE, arguments={"amount_minor": 100}
    )
    large = EffectRequest(
        operation_key="batch:large", tool=LARGE, arguments={"amount_minor": 90000}
    )
    before = db_now(approving)
    results = submit_many(approving.tenant, [small, large])
    after = db_now(approving)
    assert [r.outcome for r in results] == [CREATED, CREATED]
    prepared, waiting = (r.effect for r in results)
    assert prepared is not None
    assert waiting is not None
    # Then the small one is prepared with its dispatch job, the large one waits (its
    # 10 minute deadline on the database's clock, its first event saying so), unsent
    assert prepared.status is S.PREPARED
    assert dispatch_jobs(approving, prepared) == 1
    assert waiting.status is S.AWAITING_APPROVAL
    assert dispatch_jobs(approving, waiting) == 0
    assert waiting.next_action_at is not None
    assert before + timedelta(minutes=10) <= waiting.next_action_at
    assert waiting.next_action_at <= after + timedelta(minutes=10)
    assert events(waiting)[0][:2] == ("reserved", "awaiting_approval")
    assert store.verify_event_chain(waiting.effect_id) == 1


@pytest.mark.django_db(transaction=True)
def test_a_batch_queues_dispatch_jobs_only_for_the_items_that_need_no_approval(
    approving: Bench,
) -> None:
    requests = [
        EffectRequest(
            operation_key=f"batch:jobs:{amount}",
            tool=LARGE,
            arguments={"amount_minor": amount},
        )
        for amount in (100, 90000, 200)
    ]
    # With the real scheduler: the jobs ride in the batch's one statement
    with runtime.override(scheduler=ProcrastinateScheduler()):
        results = submit_many(approving.tenant, requests)
    ids = [r.effect.effect_id for r in results if r.effect is not None]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT args->>'effect_id', task_name FROM procrastinate_jobs "
            "WHERE args->>'effect_id' = ANY(%s)",
            [ids],
        )
        jobs = dict(cur.fetchall())
    assert jobs == {
        ids[0]: "effect_broker.dispatch_effect",
        ids[2]: "effect_broker.dispatch_effect",
    }
