"""Edge cells: issue 9's fixes proved with real worker processes and the target's table.

Each cell arranges one edge of the protocol, lets real processes run into it, reads
the truth (charges by downstream key in the target's own table, the target's request
counter, the ledger's rows and events) and judges it with its own rules
(``edge_support.judge_edge``: every rule must hold). Target faults are one global
queue, so the cells run one after another with nothing else in flight.

1. A worker frozen (SIGSTOP) between its claim commit and its send, for every class:
   the sweeper hands the effect on; the thawed worker's send gate refuses.
2. A slow commit whose answer is lost (reconcilable), after a short stall before the
   send: "not found" must not be concluded before the commit can be seen.
3. A "key in use" (409) and a terminal (400) answer to the resend after an unknown
   attempt (idempotent): never failed_final while a charge exists.
4. Retry exhaustion after an unknown attempt (idempotent): never failed_final.
5. An operator trying to requeue an unsafe effect: refused; a fork under a new key
   is dispatched by the workers and charges once.
6. One worker (and one sweeper) whose wall clock is off by +20 s, then -20 s: no live
   lease is expired, every effect charges once.
7. A worker frozen inside the write of its request (idempotent, reconcilable), between
   the headers and the body, and after the send gate's last check with a fencing
   header (``edge_wire``): the thawed worker sends nothing, or the target refuses it.

The reconcilable variant of 3 does not exist: a reconcilable effect is resent only
after a conclusive "not committed" lookup, which clears the doubt; and without an
idempotency key a 409 is a plain terminal answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from effect_broker.domain.states import EffectStatus
from examples.crash_matrix.cells import CellResult, charge_body
from examples.crash_matrix.edge_answers import (
    refusal_after_unknown_cell,
    slow_commit_cell,
)
from examples.crash_matrix.edge_clock import clock_skew_cell
from examples.crash_matrix.edge_operator import operator_cell
from examples.crash_matrix.edge_support import (
    CLASSES,
    CLOCK_AHEAD,
    CLOCK_BEHIND,
    EDGE_CASES,
    EXHAUSTED,
    FREEZE_PAUSE,
    FROZEN,
    IN_PROGRESS,
    LEASE_EXPIRY_EVENTS,
    OPERATOR,
    SLOW_COMMIT,
    TERMINAL,
    Checks,
    EdgeCellResult,
    attempts,
    charges,
    edge_result,
    effect_by_key,
    event_types,
    lock_waiters,
    receipts,
    requests_seen,
    settled,
    stale_writes,
    wait_for,
    worker_that_fired,
)
from examples.crash_matrix.edge_wire import (
    FROZEN_AFTER_GATE,
    FROZEN_MID_WRITE,
    frozen_in_write_cell,
)
from examples.crash_matrix.plan import WIRE_CLASSES
from examples.crash_matrix.rig import Rig
from examples.crash_matrix.workers import wait_until

# --- 1. frozen between claim and send ---------------------------------------------


def frozen_cell(rig: Rig, scenario: str, run: str) -> EdgeCellResult:
    """SIGSTOP the worker after its claim committed, before its send; thaw it after
    the effect was handed on (or, for transactional, once the next worker waits)."""
    started = time.monotonic()
    tenant = rig.new_tenant(f"{scenario}-frozen")
    body = charge_body(scenario, "frozen", run)
    requests_before = requests_seen(rig)
    # The failpoint stalls the dispatching thread after the claim (DISPATCHING and
    # the attempt are committed; transactional: inside its open transaction) and
    # before the send gate; SIGSTOP then freezes the whole process, heartbeat too.
    rig.arm(tenant, "before_request_write", pause=FREEZE_PAUSE)
    rig.submit(tenant, scenario, body)
    wait_until(
        lambda: rig.fired(tenant, "before_request_write"), timeout=60, what="claim"
    )
    # By the pid the failpoint recorded: a transactional claim is not committed yet,
    # so the ledger names no owner for it.
    worker = worker_that_fired(rig, tenant, "before_request_write")
    owner = effect_by_key(tenant).lease_owner or ""
    worker.pause()
    frozen_at = time.monotonic()
    facts: dict[str, Any] = {"frozen_worker": worker.name}
    try:
        if requests_seen(rig) != requests_before:
            raise RuntimeError("SIGSTOP came too late: the frozen worker already sent")
        if scenario == "transactional":
            wait_until(lambda: lock_waiters() > 0, timeout=60, what="a blocked takeover")
            facts["takeover_waited_on_row_lock"] = True
        elif scenario == "unsafe":
            wait_for(
                tenant, lambda r: r.status is EffectStatus.OUTCOME_UNKNOWN, what="unknown"
            )
        else:
            wait_for(
                tenant, lambda r: r.status is EffectStatus.SUCCEEDED, what="takeover"
            )
        facts["frozen_seconds"] = round(time.monotonic() - frozen_at, 1)
    finally:
        worker.resume()
    record = wait_for(tenant, settled, what="settlement")
    if scenario == "transactional":
        # The takeover's claim was blocked; the thawed worker committed; the
        # takeover's write is then refused by the fence.
        writes = wait_until(
            lambda: stale_writes(record), timeout=30, what="fenced takeover"
        )
    else:
        writes = wait_until(
            lambda: [w for w in stale_writes(record) if w["actor"] == owner],
            timeout=30,
            what="the thawed worker's fenced write",
        )
    effects = charges(rig, scenario, record, body)
    held = receipts(record)
    kinds = event_types(record)
    sent = requests_seen(rig) - requests_before
    facts.update(
        charges=effects,
        requests=sent,
        events=kinds,
        attempts=attempts(record),
        stale_writes=writes,
        thawed_log_says_send_refused="send refused" in worker.log_tail(200),
    )
    checks = Checks()
    if scenario == "transactional":
        checks.expect(effects == 1, f"expected 1 local effect, got {effects}")
        checks.expect(held == 1, f"expected 1 receipt, got {held}")
        checks.expect(record.status is EffectStatus.SUCCEEDED, "expected succeeded")
        note = "takeover blocked on the row lock; thawed worker committed once"
    else:
        thawed = writes[-1]["attempted"] if writes else ""
        checks.expect(
            thawed.startswith("dispatch_rejected:"),
            f"the thawed worker's write should be 'not sent' (dispatch_rejected), "
            f"got {thawed!r}",
        )
        checks.expect(
            any(k in LEASE_EXPIRY_EVENTS for k in kinds), "no lease_expired event"
        )
        if scenario == "unsafe":
            checks.expect(effects <= 1, f"broker-issued duplicate: {effects} charges")
            checks.expect(sent == 0, f"the thawed worker sent: {sent} request(s)")
            checks.expect(
                record.status is EffectStatus.OUTCOME_UNKNOWN and held == 0,
                f"expected outcome_unknown without receipt, got {record.status.value}",
            )
            note = "lease expired -> outcome_unknown; thawed worker refused to send"
        else:
            checks.expect(effects == 1, f"expected 1 charge by key, got {effects}")
            checks.expect(held == 1, f"expected 1 receipt, got {held}")
            checks.expect(record.status is EffectStatus.SUCCEEDED, "expected succeeded")
            checks.expect(sent == 1, f"expected 1 request (the takeover), got {sent}")
            note = "handed on after the lease; thawed worker refused to send"
    return edge_result(
        scenario,
        FROZEN,
        started=started,
        checks=checks,
        passed_note=note,
        effects=effects,
        record=record,
        receipts=held,
        facts=facts,
    )


# --- all of them ------------------------------------------------------------------


def edge_cells(
    rig: Rig,
    run: str,
    report: Callable[[CellResult], None],
    only: Callable[[str, str], bool] = lambda s, c: True,
) -> list[CellResult]:
    """Run every edge cell ``only`` selects, one after another; report each."""
    jobs: list[tuple[str, str, Callable[[], EdgeCellResult]]] = [
        *(
            (scenario, FROZEN, lambda s=scenario: frozen_cell(rig, s, run))
            for scenario in CLASSES
        ),
        *(
            (
                scenario,
                case,
                lambda s=scenario, c=case: frozen_in_write_cell(rig, s, c, run),
            )
            for case in (FROZEN_MID_WRITE, FROZEN_AFTER_GATE)
            for scenario in WIRE_CLASSES
        ),
        ("reconcilable", SLOW_COMMIT, lambda: slow_commit_cell(rig, run)),
        *(
            ("idempotent", case, lambda c=case: refusal_after_unknown_cell(rig, c, run))
            for case in (IN_PROGRESS, TERMINAL, EXHAUSTED)
        ),
        ("unsafe", OPERATOR, lambda: operator_cell(rig, run)),
        ("idempotent", CLOCK_AHEAD, lambda: clock_skew_cell(rig, "idempotent", 20, run)),
        (
            "reconcilable",
            CLOCK_BEHIND,
            lambda: clock_skew_cell(rig, "reconcilable", -20, run),
        ),
    ]
    assert [(s, c) for s, c, _ in jobs] == EDGE_CASES
    results: list[CellResult] = []
    for scenario, case, job in jobs:
        if not only(scenario, case):
            continue
        result = job()
        report(result)
        results.append(result)
    return results


__all__ = ["EDGE_CASES", "EdgeCellResult", "edge_cells", "frozen_cell"]
