"""Approval cells (issue 24): an operator's approval is bound to one effect, consumed by
one dispatch, and survives any crash - proved with real worker processes and counted
in the target's own table.

1. Approved, then the dispatching worker SIGKILLed at each of its boundaries (before
   the request is written, after the target committed, before and after the receipt
   commit): exactly one charge, by the downstream key, and one receipt.
2. The submit redelivered three times before the approval and three times after it:
   one effect, one charge (an unsafe endpoint: any second dispatch would be a second
   row).
3. Denied: failed_final, no attempt, no dispatch job, no charge.
4. Not approved within its ``approval_ttl`` (2 s): the sweeper ends it failed_final,
   ``approval_expired``; no attempt, no charge; an approval afterwards is refused.
5. Five operators approving at once: one approval, four ``already_approved``, one
   attempt, one charge (unsafe endpoint again).

Each cell's rules must all hold (``edge_support.Checks``); the operator acts in this
process through ``services.approvals``, the workers dispatch as in production.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection

from effect_broker.domain.errors import ApprovalExpiredError, EffectBrokerError
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.models import Tenant
from effect_broker.scheduling import DISPATCH_TASK
from effect_broker.services import approvals
from examples.crash_matrix.cells import charge_body
from examples.crash_matrix.contracts import APPROVAL_TOOLS
from examples.crash_matrix.edge_support import (
    Checks,
    EdgeCellResult,
    attempts,
    edge_result,
    effect_by_key,
    event_types,
    receipts,
    submit_tool,
    wait_for,
)
from examples.crash_matrix.plan import (
    APPROVAL,
    APPROVAL_KILLS,
    APPROVED_KILLED,
    CONCURRENT_APPROVALS,
    DENIED,
    EXPIRED,
    REDELIVERED,
)
from examples.crash_matrix.rig import Rig
from examples.crash_matrix.workers import wait_until

__all__ = ["approval_cell_jobs"]


def operator(name: str = "matrix-approver") -> Any:
    """A staff user holding ``effect_broker.resolve_effect`` (fresh permission cache)."""
    users = get_user_model()
    user, _ = users.objects.get_or_create(username=name, defaults={"is_staff": True})
    user.user_permissions.add(
        Permission.objects.get(
            codename="resolve_effect", content_type__app_label="effect_broker"
        )
    )
    return users.objects.get(pk=user.pk)


def decide(
    checks: Checks, verb: str, tenant: Tenant, record: EffectRecord, **how: Any
) -> str:
    """Approve or deny as an operator; a refusal is a broken rule of the cell (its
    code returned), never an exception that would end the whole matrix run."""
    act = approvals.approve if verb == "approve" else approvals.deny
    try:
        act(
            tenant,
            record.effect_id,
            **{"operator": operator(), "reason": "matrix", **how},
        )
    except EffectBrokerError as exc:
        checks.expect(False, f"{verb} refused: [{exc.code}] {exc}")
        return exc.code
    return ""


def await_state(
    checks: Checks, tenant: Tenant, status: EffectStatus, *, what: str
) -> EffectRecord:
    """The effect once it reaches ``status``; on a timeout, a broken rule and the
    effect as it is (the cell fails, the run goes on)."""
    try:
        return wait_for(tenant, lambda r: r.status is status, what=what, timeout=60)
    except TimeoutError as exc:
        checks.expect(False, str(exc))
        return effect_by_key(tenant)


def dispatch_jobs(record: EffectRecord) -> int:
    """procrastinate dispatch jobs that name the effect (any status)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM procrastinate_jobs "
            "WHERE task_name = %s AND args->>'effect_id' = %s",
            [DISPATCH_TASK, record.effect_id],
        )
        row = cur.fetchone()
    return int(row[0]) if row else 0


def _waiting(
    tenant: Tenant, tool: str, body: dict[str, Any], checks: Checks
) -> EffectRecord:
    """Submit and check that the effect waits, unsent, with no dispatch job."""
    record = submit_tool(tenant, tool, body)
    checks.expect(
        record.status is EffectStatus.AWAITING_APPROVAL,
        f"submitted as {record.status.value}, not awaiting_approval",
    )
    checks.expect(dispatch_jobs(record) == 0, "a dispatch job before any approval")
    return record


def _mode(tool: str) -> str:
    """The target endpoint (and so the count) a tool's contract uses."""
    return "idempotent" if tool == APPROVAL_TOOLS["idempotent"] else "unsafe"


def _charges(rig: Rig, tool: str, body: dict[str, Any], record: EffectRecord) -> int:
    # Through the rig: every count is also a claim (attribution of every charge).
    return rig.target_effects(_mode(tool), body, record.downstream_key)


# --- 1. approved, then killed -----------------------------------------------------------


def approved_then_killed_cell(rig: Rig, failpoint: str, run: str) -> EdgeCellResult:
    """Approve, then SIGKILL the worker that dispatches it at ``failpoint``."""
    case = APPROVED_KILLED.format(failpoint=failpoint)
    started = time.monotonic()
    tool = APPROVAL_TOOLS["idempotent"]
    tenant = rig.new_tenant(f"approval-{failpoint}")
    body = charge_body(APPROVAL, failpoint, run)
    checks = Checks()
    record = _waiting(tenant, tool, body, checks)
    before = _charges(rig, tool, body, record)
    if checks.broken:  # not waiting: arming a kill would aim at a dispatch under way
        settled = effect_by_key(tenant)
    else:
        rig.arm(tenant, failpoint)
        if not decide(checks, "approve", tenant, record):
            wait_until(lambda: rig.fired(tenant, failpoint), timeout=60, what=failpoint)
        settled = rig.wait_settled(tenant, "idempotent")
    effects = _charges(rig, tool, body, settled)
    held = receipts(settled)
    kinds = event_types(settled)
    checks.expect(before == 0, f"{before} charge(s) before the approval")
    checks.expect(effects == 1, f"expected 1 charge by key, got {effects}")
    checks.expect(held == 1, f"expected 1 receipt, got {held}")
    checks.expect(
        settled.status is EffectStatus.SUCCEEDED,
        f"expected succeeded, got {settled.status.value}",
    )
    checks.expect(kinds.count("approved") == 1, f"approvals in the events: {kinds}")
    return edge_result(
        APPROVAL,
        case,
        started=started,
        checks=checks,
        passed_note="approved once; worker killed; one charge",
        effects=effects,
        record=settled,
        receipts=held,
        facts={"charges": effects, "events": kinds, "attempts": attempts(settled)},
    )


# --- 2. redelivered submits -------------------------------------------------------------


def redelivered_cell(rig: Rig, run: str) -> EdgeCellResult:
    """The agent's transport delivers the submit again and again around the approval."""
    started = time.monotonic()
    tool = APPROVAL_TOOLS["unsafe"]
    tenant = rig.new_tenant("approval-redelivered")
    body = charge_body(APPROVAL, "redelivered", run)
    checks = Checks()
    record = _waiting(tenant, tool, body, checks)
    ids = {submit_tool(tenant, tool, body).effect_id for _ in range(3)}
    decide(checks, "approve", tenant, record)
    ids |= {submit_tool(tenant, tool, body).effect_id for _ in range(3)}
    settled = await_state(
        checks, tenant, EffectStatus.SUCCEEDED, what="the approved charge"
    )
    effects = _charges(rig, tool, body, settled)
    checks.expect(ids == {record.effect_id}, f"redeliveries made effects {ids}")
    checks.expect(effects == 1, f"expected 1 charge (unsafe endpoint), got {effects}")
    checks.expect(len(attempts(settled)) == 1, f"attempts: {attempts(settled)}")
    return edge_result(
        APPROVAL,
        REDELIVERED,
        started=started,
        checks=checks,
        passed_note="6 redelivered submits, one effect, one charge",
        effects=effects,
        record=settled,
        receipts=receipts(settled),
        facts={
            "effect_ids": sorted(ids),
            "charges": effects,
            "jobs": dispatch_jobs(settled),
        },
    )


# --- 3. denied, 4. expired --------------------------------------------------------------


def _never_sent(
    rig: Rig, checks: Checks, tool: str, body: dict[str, Any], record: EffectRecord
) -> int:
    effects = _charges(rig, tool, body, record)
    checks.expect(
        record.status is EffectStatus.FAILED_FINAL,
        f"expected failed_final, got {record.status.value}",
    )
    checks.expect(effects == 0, f"{effects} charge(s) of an effect never approved")
    checks.expect(attempts(record) == [], f"attempts: {attempts(record)}")
    checks.expect(dispatch_jobs(record) == 0, "a dispatch job was queued")
    return effects


def denied_cell(rig: Rig, run: str) -> EdgeCellResult:
    """An operator denies the effect: it is never sent."""
    started = time.monotonic()
    tool = APPROVAL_TOOLS["unsafe"]
    tenant = rig.new_tenant("approval-denied")
    body = charge_body(APPROVAL, "denied", run)
    checks = Checks()
    record = _waiting(tenant, tool, body, checks)
    decide(checks, "deny", tenant, record, reason="matrix: no")
    denied = effect_by_key(tenant)
    effects = _never_sent(rig, checks, tool, body, denied)
    checks.expect(event_types(denied)[-1] == "approval_denied", "no approval_denied")
    return edge_result(
        APPROVAL,
        DENIED,
        started=started,
        checks=checks,
        passed_note="denied: failed_final, no attempt, no charge",
        effects=effects,
        record=denied,
        receipts=receipts(denied),
        facts={"events": event_types(denied)},
    )


def expired_cell(rig: Rig, run: str) -> EdgeCellResult:
    """Nobody approves within the contract's 2 s: the sweeper expires it, unsent."""
    started = time.monotonic()
    tool = APPROVAL_TOOLS["brief"]
    tenant = rig.new_tenant("approval-expired")
    body = charge_body(APPROVAL, "expired", run)  # amount_minor 1999 > 1000: it waits
    checks = Checks()
    record = _waiting(tenant, tool, body, checks)
    expired = await_state(
        checks, tenant, EffectStatus.FAILED_FINAL, what="the sweeper's expiry"
    )
    refusal = ""
    try:
        approvals.approve(tenant, record.effect_id, operator=operator(), reason="late")
    except ApprovalExpiredError as exc:
        refusal = exc.code
    effects = _never_sent(rig, checks, tool, body, effect_by_key(tenant))
    kinds = event_types(expired)
    checks.expect(kinds[-1] == "approval_expired", f"events: {kinds}")
    checks.expect(refusal == "approval_expired", f"a late approval: {refusal!r}")
    return edge_result(
        APPROVAL,
        EXPIRED,
        started=started,
        checks=checks,
        passed_note="expired after 2 s: failed_final, no attempt, no charge",
        effects=effects,
        record=expired,
        receipts=receipts(expired),
        facts={"events": kinds, "late_approval": refusal},
    )


# --- 5. concurrent approvals ------------------------------------------------------------


def concurrent_approvals_cell(rig: Rig, run: str, approvers: int = 5) -> EdgeCellResult:
    """Five operators press Approve at the same moment."""
    started = time.monotonic()
    tool = APPROVAL_TOOLS["unsafe"]
    tenant = rig.new_tenant("approval-concurrent")
    body = charge_body(APPROVAL, "concurrent-approvals", run)
    checks = Checks()
    record = _waiting(tenant, tool, body, checks)
    users = [operator(f"matrix-approver-{n}") for n in range(approvers)]
    barrier = threading.Barrier(approvers)
    answers: list[str] = []

    def approve(user: Any) -> None:
        try:
            barrier.wait()
            approvals.approve(tenant, record.effect_id, operator=user, reason="matrix")
            answers.append("approved")
        except EffectBrokerError as exc:
            answers.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=approve, args=(u,)) for u in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    settled = await_state(
        checks, tenant, EffectStatus.SUCCEEDED, what="the approved charge"
    )
    effects = _charges(rig, tool, body, settled)
    kinds = event_types(settled)
    checks.expect(
        sorted(answers) == ["already_approved"] * (approvers - 1) + ["approved"],
        f"answers: {answers}",
    )
    checks.expect(kinds.count("approved") == 1, f"events: {kinds}")
    checks.expect(len(attempts(settled)) == 1, f"attempts: {attempts(settled)}")
    checks.expect(effects == 1, f"expected 1 charge (unsafe endpoint), got {effects}")
    return edge_result(
        APPROVAL,
        CONCURRENT_APPROVALS,
        started=started,
        checks=checks,
        passed_note=f"{approvers} approvals at once: one approved, one dispatch",
        effects=effects,
        record=settled,
        receipts=receipts(settled),
        facts={"answers": sorted(answers), "events": kinds},
    )


def approval_cell_jobs(rig: Rig, run: str, cases: set[str]) -> list[Any]:
    """The chosen approval cells as jobs for the matrix's pool (each independent)."""
    jobs: dict[str, Any] = {
        APPROVED_KILLED.format(failpoint=fp): (
            lambda fp=fp: approved_then_killed_cell(rig, fp, run)
        )
        for fp in APPROVAL_KILLS
    }
    jobs[REDELIVERED] = lambda: redelivered_cell(rig, run)
    jobs[DENIED] = lambda: denied_cell(rig, run)
    jobs[EXPIRED] = lambda: expired_cell(rig, run)
    jobs[CONCURRENT_APPROVALS] = lambda: concurrent_approvals_cell(rig, run)
    return [job for case, job in jobs.items() if case in cases]
