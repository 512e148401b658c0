"""Edge cells about answers: a slow commit whose answer is lost, and refusals to the
resend after an unknown attempt (issue 9, defects 2 and 3; ``edge_cells``)."""

from __future__ import annotations

import time
from typing import Any

from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.models import Tenant
from examples.crash_matrix.cells import charge_body
from examples.crash_matrix.contracts import EDGE_TOOLS
from examples.crash_matrix.edge_support import (
    IN_PROGRESS,
    SLOW_COMMIT,
    TERMINAL,
    Checks,
    EdgeCellResult,
    charges,
    edge_result,
    event_types,
    ever_failed_final,
    reason_of,
    receipts,
    requests_seen,
    settled,
    submit_tool,
    wait_for,
)
from examples.crash_matrix.rig import Rig
from examples.crash_matrix.workers import wait_until

# --- 2. slow commit, answer lost ----------------------------------------------------


def slow_commit_cell(rig: Rig, run: str) -> EdgeCellResult:
    """A short stall before the send, then a commit slower than the attempt's limit.

    Contract ``charge_reconcilable_slow``: attempt limit 2 s, settlement bound 2.5 s.
    The worker stalls 0.8 s after its claim (a GC pause the gate lets through), sends;
    the target holds the charge's transaction 2.2 s (visible 2.2 s after the send, in
    the bound); the worker's limit ends first: outcome unknown at ~2 s, the row not
    yet visible. The first lookup is due at ~5 s (unknown + send margin 0.5 s + bound),
    2 s after the commit at ~3 s. Counting the bound from the attempt's start would
    probe at 2.5 s, before the commit, conclude "not found" and resend: two charges.
    """
    scenario, case = "reconcilable", SLOW_COMMIT
    started = time.monotonic()
    tenant = rig.new_tenant("reconcilable-slowcommit")
    body = charge_body(scenario, "slowcommit", run)
    requests_before = requests_seen(rig)
    rig.arm(tenant, "before_request_write", pause=0.8)
    rig.target.inject("slow_commit", times=1, seconds=2.2)
    submit_tool(tenant, EDGE_TOOLS["reconcilable_slow"], body)
    record = wait_for(tenant, settled, what="settlement")
    effects = charges(rig, scenario, record, body)
    held = receipts(record)
    kinds = event_types(record)
    sent = requests_seen(rig) - requests_before
    checks = Checks()
    checks.expect(effects == 1, f"expected 1 charge by key, got {effects}")
    checks.expect(
        record.status is EffectStatus.SUCCEEDED and held == 1,
        f"expected succeeded with 1 receipt, got {record.status.value}/{held}",
    )
    checks.expect(sent == 1, f"expected 1 request (no resend), got {sent}")
    checks.expect("outcome_unknown" in kinds, "the lost answer was not unknown")
    checks.expect("reconciled_committed" in kinds, "the lookup did not find it")
    checks.expect(
        "reconciled_not_committed" not in kinds, "a lookup concluded 'not found'"
    )
    return edge_result(
        scenario,
        case,
        started=started,
        checks=checks,
        passed_note="answer lost at the limit; the lookup after the bound found it",
        effects=effects,
        record=record,
        receipts=held,
        facts={
            "charges": effects,
            "requests": sent,
            "events": kinds,
            "unknown_reason": reason_of(record, "outcome_unknown"),
        },
    )


# --- 3 and 4. refusals after an unknown attempt -------------------------------------


def _lose_first_answer(
    rig: Rig, tenant: Tenant, tool: str, body: dict[str, Any]
) -> EffectRecord:
    """Attempt 1 commits at the target and gets no answer within its time limit.

    Returns once the charge is in the target's table; the resend comes only when the
    attempt's limit (4 s after the claim, ``charge_idempotent_short``) ends, so a
    fault queued now meets the resend (faults are taken in a fixed order, not FIFO:
    queued together, a refusal would meet attempt 1).
    """
    rig.target.inject("hang_after_commit", times=1, seconds=6.0)
    record = submit_tool(tenant, tool, body)
    wait_until(
        lambda: rig.target.count_charges(mode="idempotent", key=record.downstream_key),
        timeout=30,
        what="attempt 1 to commit",
    )
    return record


def refusal_after_unknown_cell(rig: Rig, case: str, run: str) -> EdgeCellResult:
    """Attempt 1's answer is lost after its commit; the resend meets a refusal."""
    scenario = "idempotent"
    started = time.monotonic()
    tenant = rig.new_tenant(f"idempotent-{case.split()[0]}")
    body = charge_body(scenario, case.replace(" ", "-"), run)
    # retry_limit 2: attempt 1 lost, attempt 2 refused, attempt 3 the last allowed.
    tool = EDGE_TOOLS["idempotent_short"]
    requests_before = requests_seen(rig)
    _lose_first_answer(rig, tenant, tool, body)
    if case == IN_PROGRESS:
        rig.target.inject("in_progress_next", times=1)
    elif case == TERMINAL:
        rig.target.inject("terminal_next", times=1)
    else:
        # retry_limit 2: attempts 2 and 3 are refused with 429, then the budget is
        # spent - with attempt 1 still in doubt.
        rig.target.inject("reject_next", times=2)
    record = wait_for(tenant, settled, what="settlement")
    effects = charges(rig, scenario, record, body)
    held = receipts(record)
    kinds = event_types(record)
    sent = requests_seen(rig) - requests_before
    checks = Checks()
    checks.expect(effects == 1, f"expected 1 charge by key, got {effects}")
    checks.expect(not ever_failed_final(record), "failed_final while a charge exists")
    checks.expect(sent == 3, f"expected 3 requests, got {sent}")
    checks.expect(kinds.count("outcome_unknown") >= 1, "attempt 1 was not unknown")
    succeeded = record.status is EffectStatus.SUCCEEDED and held == 1
    if case == IN_PROGRESS:
        reason = reason_of(record, "dispatch_rejected")
        checks.expect("in progress" in reason, f"no 'key in use' retry: {reason!r}")
        checks.expect(succeeded, f"expected succeeded, got {record.status.value}")
        note = "409 -> retried later with the same key -> succeeded"
    elif case == TERMINAL:
        reason = reason_of(record, "refused_in_doubt")
        checks.expect(bool(reason), "the 400 was not recorded as refused in doubt")
        checks.expect(
            succeeded
            or record.status
            in (EffectStatus.OUTCOME_UNKNOWN, EffectStatus.MANUAL_REVIEW),
            f"expected unknown, review or a receipt, got {record.status.value}",
        )
        note = f"400 -> back to unknown (in doubt) -> {record.status.value}"
    else:
        reason = reason_of(record, "manual_review_required")
        checks.expect(
            "retries_exhausted_in_doubt" in kinds, "no retries_exhausted_in_doubt event"
        )
        checks.expect(
            record.status is EffectStatus.MANUAL_REVIEW and bool(reason),
            f"expected manual_review with a reason, got {record.status.value}",
        )
        note = f"budget spent in doubt -> manual_review ({reason})"
    return edge_result(
        scenario,
        case,
        started=started,
        checks=checks,
        passed_note=note,
        effects=effects,
        record=record,
        receipts=held,
        facts={"charges": effects, "requests": sent, "events": kinds, "reason": reason},
    )
