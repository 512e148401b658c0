"""One crash-matrix cell each: arrange a fault, let it happen, read the truth, judge.

Verdicts (issue "Crash matrix", spec "Killer demo"):

* idempotent, reconcilable, transactional: exactly one target effect, one receipt,
  status succeeded - in every cell;
* unsafe: at most one target effect, never a broker-issued duplicate, and
  ``outcome_unknown`` whenever the kill came after the request may have left.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from django.db import connection

from effect_broker import embedded_pg
from effect_broker.domain.states import EffectStatus
from examples.crash_matrix.plan import safety_of
from examples.crash_matrix.rig import OPERATION_KEY, Rig, WorkerExit
from examples.crash_matrix.workers import wait_until

RESERVATION_FAILPOINTS = ("before_reservation_commit", "after_reservation_commit")
#: Worker-side kills after which an unsafe request may have left the process.
MAY_HAVE_LEFT = ("before_request_write", "after_target_commit", "before_receipt_commit")


@dataclass
class CellResult:
    """One row of the matrix."""

    scenario: str
    case: str
    target_effects: int
    status: str
    receipts: int
    naive_effects: int | None
    verdict: str  # "pass" | "FAIL" | "skipped"
    note: str
    seconds: float
    #: Target charges of the agent-ledger baseline under the same fault (None: not run).
    ledger_effects: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def charge_body(
    scenario: str, case: str, run: str, *, naive: bool = False
) -> dict[str, Any]:
    """A body unique to one cell, so every target row maps back to the cell."""
    who = "naive" if naive else "broker"
    return {
        "order": "42",
        "amount_minor": 1999,
        "currency": "EUR",
        "cell": f"{who}/{scenario}/{case}/{run}",
    }


def judge(
    scenario: str, case: str, effects: int, status: str, receipts: int
) -> tuple[bool, str]:
    """Whether a cell keeps the promise of its safety class, and why not."""
    if safety_of(scenario) != "unsafe":
        ok = effects == 1 and receipts == 1 and status == EffectStatus.SUCCEEDED.value
        return ok, "" if ok else f"expected 1 effect, 1 receipt, succeeded; got {effects}"
    if effects > 1:
        return False, f"broker-issued duplicate: {effects} effects"
    if case in MAY_HAVE_LEFT:
        ok = status == EffectStatus.OUTCOME_UNKNOWN.value and receipts == 0
        return ok, "" if ok else f"expected outcome_unknown, got {status}"
    ok = (status == EffectStatus.SUCCEEDED.value and effects == 1 and receipts == 1) or (
        status == EffectStatus.OUTCOME_UNKNOWN.value and receipts == 0
    )
    return ok, "" if ok else f"unexpected {status} with {effects} effects"


def _finish(
    rig: Rig,
    scenario: str,
    case: str,
    tenant: Any,
    body: dict[str, Any],
    started: float,
    naive: int | None,
    note: str = "",
) -> CellResult:
    record = rig.wait_settled(tenant, scenario)
    effects = rig.target_effects(scenario, body, record.downstream_key)
    receipts = rig.receipts(record)
    ok, why = judge(scenario, case, effects, record.status.value, receipts)
    connection.close()
    return CellResult(
        scenario=scenario,
        case=case,
        target_effects=effects,
        status=record.status.value,
        receipts=receipts,
        naive_effects=naive,
        verdict="pass" if ok else "FAIL",
        note=why or note,
        seconds=round(time.monotonic() - started, 1),
    )


def kill_cell(rig: Rig, scenario: str, failpoint: str, run: str) -> CellResult:
    """SIGKILL a broker process at ``failpoint`` while it handles this cell's charge."""
    started = time.monotonic()
    tenant = rig.new_tenant(f"{scenario}-{failpoint}")
    body = charge_body(scenario, failpoint, run)
    rig.arm(tenant, failpoint)
    if failpoint in RESERVATION_FAILPOINTS:
        code = rig.submit_in_child(tenant, scenario, body)
        if code != -9:
            raise RuntimeError(f"submitter should have been SIGKILLed, exit code {code}")
        rig.submit(tenant, scenario, body)  # the agent retries its call
    else:
        rig.submit(tenant, scenario, body)
        wait_until(lambda: rig.fired(tenant, failpoint), timeout=60, what=failpoint)
    naive_body = charge_body(scenario, failpoint, run, naive=True)
    naive = rig.run_naive(scenario, naive_body, f"{tenant.id}:{OPERATION_KEY}", failpoint)
    return _finish(rig, scenario, failpoint, tenant, body, started, naive)


def mcp_kill_cell(rig: Rig, scenario: str, failpoint: str, run: str) -> CellResult:
    """SIGKILL the worker at ``failpoint`` while the mcp adapter dispatches this
    cell's charge through the payments MCP server (no baselines: they speak HTTP)."""
    started = time.monotonic()
    tenant = rig.new_tenant(f"{scenario}-{failpoint}")
    body = charge_body(scenario, failpoint, run)
    rig.arm(tenant, failpoint)
    rig.submit(tenant, scenario, body)
    wait_until(lambda: rig.fired(tenant, failpoint), timeout=60, what=failpoint)
    return _finish(rig, scenario, failpoint, tenant, body, started, None)


def concurrent_cell(rig: Rig, scenario: str, run: str, copies: int = 10) -> CellResult:
    """Ten agents submit the same operation key at the same moment."""
    started = time.monotonic()
    tenant = rig.new_tenant(f"{scenario}-concurrent")
    body = charge_body(scenario, "concurrent", run)
    barrier = threading.Barrier(copies)

    def agent() -> None:
        try:
            barrier.wait()
            rig.submit(tenant, scenario, body)
        finally:
            connection.close()

    threads = [threading.Thread(target=agent) for _ in range(copies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    naive_body = charge_body(scenario, "concurrent", run, naive=True)
    key = f"{tenant.id}:{OPERATION_KEY}"
    naive_threads = [
        threading.Thread(target=rig.run_naive, args=(scenario, naive_body, key, ""))
        for _ in range(copies)
    ]
    for thread in naive_threads:
        thread.start()
    for thread in naive_threads:
        thread.join()
    naive = (
        rig.naive_local_effects(key)
        if scenario == "transactional"
        else rig.target.count_by_body(naive_body)
    )
    return _finish(
        rig, scenario, f"{copies} concurrent submits", tenant, body, started, naive
    )


def zombie_cell(rig: Rig, scenario: str, run: str) -> CellResult:
    """Freeze the dispatching worker past its lease; another finishes; thaw it."""
    started = time.monotonic()
    tenant = rig.new_tenant(f"{scenario}-zombie")
    body = charge_body(scenario, "zombie", run)
    # The failpoint only stalls the dispatching thread for a moment, long enough to
    # SIGSTOP its whole process (heartbeat thread included) right after the commit.
    rig.arm(tenant, "after_target_commit", pause=2.0)
    rig.submit(tenant, scenario, body)
    wait_until(lambda: rig.fired(tenant, "after_target_commit"), timeout=60, what="pause")
    owner = rig.effect_of(tenant).lease_owner or ""
    assert rig.pool is not None
    worker = rig.pool.by_pid(int(owner.split(":")[1])) if owner.count(":") >= 2 else None
    if worker is None:
        raise RuntimeError(
            f"cannot find the dispatching worker from lease owner {owner!r}"
        )
    worker.pause()
    try:
        record = rig.wait_settled(tenant, scenario)
    finally:
        worker.resume()
    wait_until(lambda: rig.stale_writes(record) > 0, timeout=60, what="the fenced write")
    result = _finish(rig, scenario, "zombie worker", tenant, body, started, None)
    result.note = result.note or f"{rig.stale_writes(record)} stale write(s) fenced"
    return result


def db_restart_cells(rig: Rig, scenarios: list[str], run: str) -> list[CellResult]:
    """Restart the broker's Postgres (immediate stop) between target and receipt."""
    if rig.embedded_project_dir is None:
        return [
            CellResult(
                s,
                "postgres restart",
                0,
                "-",
                0,
                None,
                "skipped",
                "needs the embedded server (DATABASE_URL is external)",
                0.0,
            )
            for s in scenarios
        ]
    started = time.monotonic()
    cells = []
    for scenario in scenarios:
        tenant = rig.new_tenant(f"{scenario}-dbrestart")
        body = charge_body(scenario, "dbrestart", run)
        rig.arm(tenant, "before_receipt_commit", pause=2.0)
        rig.submit(tenant, scenario, body)
        cells.append((scenario, tenant, body))
    for _, tenant, _ in cells:
        wait_until(
            lambda t=tenant: rig.fired(t, "before_receipt_commit"),
            timeout=60,
            what="receipt failpoint",
        )
    connection.close()
    assert rig.pool is not None
    mark = rig.pool.exit_mark()
    embedded_pg.restart(rig.embedded_project_dir, stop_mode="immediate")
    results = [
        _finish(rig, scenario, "postgres restart", tenant, body, started, None)
        for scenario, tenant, body in cells
    ]
    # Issue 11: the same workers must finish the work; a replaced one fails the cell.
    if exited := rig.pool.exits_since(mark):
        for result in results:
            result.verdict = "FAIL"
            result.note = replaced_note(exited)
    return results


def replaced_note(exited: list[WorkerExit]) -> str:
    """The verdict note of a database-restart cell whose workers did not survive."""
    return (
        f"{len(exited)} worker(s) exited during the database restart and were "
        f"replaced: {', '.join(map(str, exited))}"
    )


def target_down_cells(rig: Rig, scenarios: list[str], run: str) -> list[CellResult]:
    """The target refuses connections (nothing sent); it comes back; effects converge."""
    started = time.monotonic()
    port = int(rig.target.url.rsplit(":", 1)[1])
    rig.target.stop()
    cells = []
    for scenario in scenarios:
        tenant = rig.new_tenant(f"{scenario}-targetdown")
        body = charge_body(scenario, "targetdown", run)
        rig.submit(tenant, scenario, body)
        cells.append((scenario, tenant, body))
    wait_until(
        lambda: all(
            rig.effect_of(t).status is EffectStatus.RETRYABLE for _, t, _ in cells
        ),
        timeout=60,
        what="connection refused to be recorded as retryable",
    )
    rig.restart_target(port)
    results = []
    for scenario, tenant, body in cells:
        result = _finish(rig, scenario, "target down", tenant, body, started, None)
        result.note = result.note or "refused before send -> retryable -> one effect"
        results.append(result)
    return results
