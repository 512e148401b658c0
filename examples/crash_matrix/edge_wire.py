"""Edge cells inside the write of one request (issue 19, item 4; ``edge_cells``).

httpcore writes a request's headers and its body in two socket writes. A worker frozen
between them (SIGSTOP: its watchdog thread freezes with it) woke up after its lease
had been handed on and sent the body; the reconcilable target committed a second
charge (1 of 1 tries, 12 s stall, the default gate). The HTTP adapter now holds the
request and hands it to the socket in ONE write, checking the send gate immediately
before it (adapters/http_attempt.py). Two cells per keyed class:

* **frozen between headers and body** (the default contracts, no fencing header):
  the failpoint stalls the worker after httpcore handed over the headers, SIGSTOP
  freezes it until the takeover has charged, then SIGCONT. The thawed worker's gate
  refuses before the one write: not a byte of it - headers included - reaches the
  target. (Before the fix the headers had left at the freeze and the body followed on
  thawing: reconcilable charged twice, idempotent sent a second request.)
* **frozen after the send gate (fenced)**: the one stall no local check can catch -
  after the gate's last check, before the write. The contracts name a
  ``fencing_header`` and an attempt limit (30 s) no freeze here reaches, so the
  watchdog cannot cut the late write either: the late request DOES reach the target,
  after the takeover, and the target refuses it by its stale fencing token (409,
  nothing committed). Without a fencing header this window is the residual risk the
  guarantees page (docs/explanation/guarantees.md) states, with the measured figure
  (``examples/bench/gate_window.py``).
"""

from __future__ import annotations

import time
from typing import Any

from effect_broker.domain.states import EffectStatus
from examples.crash_matrix.cells import charge_body
from examples.crash_matrix.contracts import EDGE_TOOLS, TOOLS
from examples.crash_matrix.edge_support import (
    FREEZE_PAUSE,
    LEASE_EXPIRY_EVENTS,
    Checks,
    EdgeCellResult,
    charges,
    edge_result,
    effect_by_key,
    event_types,
    receipts,
    requests_seen,
    settled,
    stale_writes,
    submit_tool,
    wait_for,
    worker_that_fired,
)
from examples.crash_matrix.plan import FROZEN_AFTER_GATE, FROZEN_MID_WRITE
from examples.crash_matrix.rig import Rig
from examples.crash_matrix.workers import wait_until


def _stale_refusals(rig: Rig) -> int:
    return int(rig.target.stats()["stale_fencing_refusals"])


def frozen_in_write_cell(rig: Rig, scenario: str, case: str, run: str) -> EdgeCellResult:
    """Freeze the worker inside its request's write, thaw it after the takeover."""
    fenced = case == FROZEN_AFTER_GATE
    failpoint = "after_send_gate" if fenced else "between_headers_and_body"
    tool = EDGE_TOOLS[f"{scenario}_fenced"] if fenced else TOOLS[scenario]
    started = time.monotonic()
    label = "aftergate" if fenced else "midwrite"
    tenant = rig.new_tenant(f"{scenario}-{label}")
    body = charge_body(scenario, label, run)
    requests_before, refusals_before = requests_seen(rig), _stale_refusals(rig)
    rig.arm(tenant, failpoint, pause=FREEZE_PAUSE)
    submit_tool(tenant, tool, body)
    wait_until(lambda: rig.fired(tenant, failpoint), timeout=60, what=failpoint)
    worker = worker_that_fired(rig, tenant, failpoint)
    owner = effect_by_key(tenant).lease_owner or ""
    worker.pause()
    frozen_at = time.monotonic()
    # What the worker logged before this freeze: only what it logs after counts.
    logged_before = len(worker.log_tail(1_000_000))
    facts: dict[str, Any] = {"frozen_worker": worker.name, "failpoint": failpoint}
    try:
        wait_for(tenant, lambda r: r.status is EffectStatus.SUCCEEDED, what="takeover")
        facts["frozen_seconds"] = round(time.monotonic() - frozen_at, 1)
        # Counted once the takeover has charged, so a header the frozen worker had
        # already sent has long been read: before the fix this is 2.
        facts["requests_while_frozen"] = requests_seen(rig) - requests_before
    finally:
        worker.resume()
    record = wait_for(tenant, settled, what="settlement")
    writes = wait_until(
        lambda: [w for w in stale_writes(record) if w["actor"] == owner],
        timeout=30,
        what="the thawed worker's fenced write",
    )
    effects = charges(rig, scenario, record, body)
    held = receipts(record)
    kinds = event_types(record)
    sent = requests_seen(rig) - requests_before
    refused = _stale_refusals(rig) - refusals_before
    thawed = writes[-1]["attempted"]
    facts.update(
        charges=effects,
        requests=sent,
        stale_fencing_refusals=refused,
        events=kinds,
        stale_writes=writes,
        thawed_log_says_send_refused="send refused"
        in worker.log_tail(1_000_000)[logged_before:],
    )
    checks = Checks()
    checks.expect(effects == 1, f"expected 1 charge by key, got {effects}")
    checks.expect(held == 1, f"expected 1 receipt, got {held}")
    checks.expect(record.status is EffectStatus.SUCCEEDED, "expected succeeded")
    checks.expect(any(k in LEASE_EXPIRY_EVENTS for k in kinds), "no lease_expired event")
    if fenced:
        checks.expect(
            sent == 2, f"expected the takeover's and the late request, got {sent}"
        )
        checks.expect(
            refused == 1, f"expected the target to refuse 1 stale token, got {refused}"
        )
        note = "late request reached the target after the takeover; refused by its fence"
    else:
        checks.expect(
            sent == 1,
            f"the thawed worker sent (part of) its request: {sent} request(s) seen",
        )
        checks.expect(
            thawed.startswith("dispatch_rejected:"),
            f"the thawed worker's write should be 'not sent' (dispatch_rejected), "
            f"got {thawed!r}",
        )
        checks.expect(
            bool(facts["thawed_log_says_send_refused"]),
            "the thawed worker's log does not say 'send refused'",
        )
        note = "handed on; the thawed worker's one write refused by the gate: 0 bytes"
    return edge_result(
        scenario,
        case,
        started=started,
        checks=checks,
        passed_note=note,
        effects=effects,
        record=record,
        receipts=held,
        facts=facts,
    )


__all__ = ["FROZEN_AFTER_GATE", "FROZEN_MID_WRITE", "frozen_in_write_cell"]
