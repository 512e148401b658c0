"""``effect-broker demo crash-matrix``: kill real broker processes at every boundary and
count charges in the target's own table, next to two baselines under the same kills: a
naive retry loop and an unmodified agent-ledger local ledger.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection

from effect_broker.domain.states import EffectStatus
from effect_broker.failpoints import FAILPOINTS
from effect_broker.models import EffectEvent
from examples.crash_matrix import plan
from examples.crash_matrix.approval_cells import approval_cell_jobs
from examples.crash_matrix.cells import (
    CellResult,
    charge_body,
    concurrent_cell,
    db_restart_cells,
    judge,
    kill_cell,
    mcp_kill_cell,
    target_down_cells,
    zombie_cell,
)
from examples.crash_matrix.edge_cells import edge_cells
from examples.crash_matrix.ledger_runner import (
    STALE_AFTER_MS,
    ensure_ledger_schema,
    ledger_body,
    ledger_missing,
    ledger_version,
    local_effects,
    run_ledger,
)
from examples.crash_matrix.plan import HEADLINE, SCENARIOS
from examples.crash_matrix.report import (
    LEDGER,
    duplicated,
    gate_cells,
    gate_lines,
    random_lines,
    render_table,
    unattributed_line,
)
from examples.crash_matrix.restart_cells import db_restart_under_load_cell
from examples.crash_matrix.rig import Rig, open_rig
from examples.crash_matrix.runtime_cells import runtime_cells

if TYPE_CHECKING:
    from effect_broker.management.crash_matrix_options import TextSink

__all__ = ["SCENARIOS", "random_runs", "render_table", "run_matrix"]

#: The cell kinds ``_run_cells`` dispatches: a new kind in ``plan`` needs both.
RUNNABLE = frozenset(
    {
        plan.KILL,
        plan.CONCURRENT,
        plan.ZOMBIE,
        plan.TARGET_DOWN,
        plan.DB_RESTART,
        plan.DB_RESTART_LOAD,
        plan.EDGE,
        plan.MCP_KILL,
        plan.RUNTIME_KILL,
        plan.APPROVAL,
    }
)


class Reporter:
    """Progress lines while the matrix runs (flushed, so a pipe shows them live)."""

    def __init__(self, out: TextSink, total: int) -> None:
        self.out = out
        self.total = total
        self.done = 0
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        """Print one line now."""
        self.out.write(text + "\n")
        self.out.flush()

    def cell(self, result: CellResult) -> None:
        """Report a finished cell."""
        self.done += 1
        # A runtime cell's baseline is the runtime alone, not the naive loop.
        alone = result.scenario.startswith(plan.RUNTIME_PREFIX)
        naive = (
            ""
            if result.naive_effects is None
            else f", {'alone' if alone else 'naive'} {result.naive_effects}"
        )
        ledger = (
            "" if result.ledger_effects is None else f", {LEDGER} {result.ledger_effects}"
        )
        self.say(
            f"[{self.done:>2}/{self.total}] {time.monotonic() - self.started:5.1f}s "
            f"{result.scenario:<13} {result.case:<26} -> {result.target_effects} effect, "
            f"{result.status}{naive}{ledger}  {result.verdict}"
        )


def _in_pool(
    jobs: list[Callable[[], CellResult]], parallel: int, report: Reporter
) -> list[CellResult]:
    results: list[CellResult] = []

    def run(job: Callable[[], CellResult]) -> CellResult:
        try:
            return job()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for future in as_completed([pool.submit(run, job) for job in jobs]):
            result = future.result()
            report.cell(result)
            results.append(result)
    return results


def _kill(rig: Rig, scenario: str, failpoint: str, run: str, ledger: bool) -> CellResult:
    """A kill cell, then agent-ledger killed at the same failpoint."""
    result = kill_cell(rig, scenario, failpoint, run)
    if ledger:
        body = ledger_body(charge_body(scenario, failpoint, run, naive=True))
        result.ledger_effects = run_ledger(rig, scenario, body, failpoint)
    return result


def _concurrent(rig: Rig, scenario: str, run: str, ledger: bool) -> CellResult:
    """A concurrency cell, then ten agent-ledger processes with one call at once."""
    result = concurrent_cell(rig, scenario, run)
    if ledger:
        body = ledger_body(charge_body(scenario, "concurrent", run, naive=True))
        threads = [
            threading.Thread(target=run_ledger, args=(rig, scenario, body, ""))
            for _ in range(10)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        result.ledger_effects = (
            local_effects(rig.database_url, body["cell"])
            if scenario == "transactional"
            else rig.count_baseline(scenario, body)
        )
    return result


def random_runs(rig: Rig, runs: int, seed: int, report: Reporter) -> dict[str, Any]:
    """``runs`` effects under SIGKILLs of random workers at random moments."""
    rng = random.Random(seed)  # noqa: S311 - reproducible kill timing, not secrets
    totals: dict[str, Counter[str]] = {s: Counter() for s in SCENARIOS}
    assert rig.pool is not None
    batch = 6
    for start in range(0, runs, batch):
        cells = []
        picks = [rng.choice(SCENARIOS) for _ in range(start, min(runs, start + batch))]
        # Stretch each network request (commit, then a slow answer) so that a kill at a
        # random moment lands inside in-flight dispatches, not only between them.
        slow = sum(1 for s in picks if s != "transactional")
        if slow:
            rig.target.inject("slow_after_commit", times=slow, seconds=0.6)
        for i, scenario in enumerate(picks, start=start):
            tenant = rig.new_tenant(f"{scenario}-run{i}")
            body = charge_body(scenario, "random", f"{seed}-{i}")
            rig.submit(tenant, scenario, body)
            cells.append((scenario, tenant, body))
        time.sleep(rng.uniform(0.0, 1.5))
        for _ in range(rng.randint(1, 2)):
            rig.pool.kill_random(rng)
        for scenario, tenant, body in cells:
            record = rig.wait_settled(tenant, scenario)
            effects = rig.target_effects(scenario, body, record.downstream_key)
            ok, _ = judge(
                scenario,
                "random kill",
                effects,
                record.status.value,
                rig.receipts(record),
            )
            t = totals[scenario]
            t["runs"] += 1
            t["effects"] += effects
            t["duplicates"] += int(effects > 1)
            t["missing"] += int(effects == 0)
            t["unknown"] += int(record.status is EffectStatus.OUTCOME_UNKNOWN)
            # Killed while in flight: its lease had to expire before anyone could act.
            t["killed_in_flight"] += int(
                EffectEvent.objects.filter(
                    effect_id=record.effect_id, event_type="lease_expired"
                ).exists()
            )
            t["violations"] += int(not ok)
        report.say(f"      random runs: {min(runs, start + batch)}/{runs}")
    return {scenario: dict(counter) for scenario, counter in totals.items()}


def _run_cells(
    rig: Rig,
    chosen: list[plan.CellId],
    run_id: str,
    *,
    parallel: int,
    ledger: bool,
    report: Reporter,
    between: Callable[[], None],
) -> list[CellResult]:
    """Run the chosen cells, group by group; ``between`` runs before the restarts."""
    if unknown := sorted({cell.kind for cell in chosen} - RUNNABLE):
        # A planned cell nobody runs would silently drop out of the table.
        raise RuntimeError(f"no runner for planned cell kind(s) {unknown}")
    kinds: dict[str, list[str]] = {}
    kills = []
    mcp_kills = []
    approval_cases: set[str] = set()
    edges: set[tuple[str, str]] = set()
    for cell in chosen:
        if cell.kind == plan.KILL:
            kills.append((cell.scenario, cell.case))
        elif cell.kind == plan.MCP_KILL:
            mcp_kills.append((cell.scenario, cell.case))
        elif cell.kind == plan.APPROVAL:
            approval_cases.add(cell.case)
        elif cell.kind == plan.EDGE:
            edges.add((cell.scenario, cell.case))
        else:
            kinds.setdefault(cell.kind, []).append(cell.scenario)
    results: list[CellResult] = []
    if HEADLINE in kills:
        first = _kill(rig, *HEADLINE, run_id, ledger)
        report.cell(first)
        ledger_said = (
            f"; {LEDGER} left {first.ledger_effects}"
            if first.ledger_effects is not None
            else ""
        )
        report.say(
            f"  => worker SIGKILLed after the target committed: the broker left "
            f"{first.target_effects} charge; the naive retry loop left "
            f"{first.naive_effects} charges{ledger_said}"
        )
        results.append(first)
    results += _in_pool(
        [
            lambda s=s, fp=fp: _kill(rig, s, fp, run_id, ledger)
            for s, fp in kills
            if (s, fp) != HEADLINE
        ],
        parallel,
        report,
    )
    results += _in_pool(
        [lambda s=s, fp=fp: mcp_kill_cell(rig, s, fp, run_id) for s, fp in mcp_kills],
        parallel,
        report,
    )
    if kinds.get(plan.RUNTIME_KILL):
        results += runtime_cells(
            rig, kinds[plan.RUNTIME_KILL], run_id, report.cell, parallel
        )
    # Issue 24: approved, killed, denied, expired, approved at once (no baselines:
    # neither has an approval step to compare).
    results += _in_pool(approval_cell_jobs(rig, run_id, approval_cases), parallel, report)
    results += _in_pool(
        [
            lambda s=s: _concurrent(rig, s, run_id, ledger)
            for s in kinds.get(plan.CONCURRENT, [])
        ],
        parallel,
        report,
    )
    for scenario in kinds.get(plan.ZOMBIE, []):
        result = zombie_cell(rig, scenario, run_id)
        report.cell(result)
        results.append(result)
    if kinds.get(plan.TARGET_DOWN):
        for result in target_down_cells(rig, kinds[plan.TARGET_DOWN], run_id):
            report.cell(result)
            results.append(result)
    if edges:
        # One after another with nothing else in flight: they queue target faults,
        # freeze workers and start skewed ones.
        results += edge_cells(rig, run_id, report.cell, only=lambda s, c: (s, c) in edges)
    between()
    if kinds.get(plan.DB_RESTART):
        for result in db_restart_cells(rig, kinds[plan.DB_RESTART], run_id):
            report.cell(result)
            results.append(result)
    if kinds.get(plan.DB_RESTART_LOAD):
        result = db_restart_under_load_cell(rig, run_id)
        report.cell(result)
        results.append(result)
    return results


def run_matrix(
    out: TextSink,
    *,
    workers: int = 3,
    parallel: int = 3,
    runs: int = 0,
    seed: int = 42,
    json_path: Path | None = None,
    only: list[str] | None = None,
    png_path: Path | None = None,
) -> int:
    """Run the matrix (or the ``only`` cells); print progress, the table, a summary.

    Returns the exit code: 1 when a cell or a random run broke its class's promise, or
    when the target's table holds a charge that no cell counted.
    """
    run_id = time.strftime("%H%M%S")
    where = (
        "DATABASE_URL"
        if settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
        else "embedded PostgreSQL"
    )
    everything = plan.all_cells()
    chosen = plan.select(everything, only or [])
    report = Reporter(out, len(chosen))
    report.say(
        f"crash matrix: {len(SCENARIOS)} safety classes x {len(FAILPOINTS)} kill points, "
        f"plus concurrency, zombie, target-down, database-restart and "
        f"{len(plan.EDGE_CASES)} edge faults, {len(plan.MCP_SCENARIOS)} classes "
        f"behind the mcp adapter, {len(plan.RUNTIMES)} runtimes and "
        f"{len(plan.APPROVAL_CASES)} approval cells ({where}, "
        f"{workers} real worker processes)"
    )
    if only:
        report.say(
            f"--only {','.join(only)}: selected {len(chosen)} of {len(everything)} cells"
        )
    missing = ledger_missing()
    totals: dict[str, Any] | None = None
    with open_rig(workers=workers) as rig:
        report.say(
            f"rig ready in {time.monotonic() - report.started:.1f}s: scratch "
            f"database, target service at {rig.target.url}"
        )
        if missing is None:
            ensure_ledger_schema(rig.database_url)
            version = ledger_version()
            report.say(
                f"baselines: naive retry loop; {LEDGER} {version} (PostgresStore, "
                f"run() with stale takeover after {STALE_AFTER_MS} ms, its idem_key "
                "passed down as the request key)"
            )
        else:
            report.say(f"baselines: naive retry loop; {LEDGER} NOT RUN: {missing}")

        def between() -> None:
            nonlocal totals
            totals = random_runs(rig, runs, seed, report) if runs else None

        results = _run_cells(
            rig,
            chosen,
            run_id,
            parallel=parallel,
            ledger=missing is None,
            report=report,
            between=between,
        )
        unattributed = rig.unattributed()
        restarts = rig.pool.restarts if rig.pool else 0
    # By class, then in plan order (a cell the plan does not name goes last in its class).
    classes = {s: i for i, s in enumerate(SCENARIOS)}
    order = {c.name: i for i, c in enumerate(everything)}
    results.sort(
        key=lambda r: (
            classes.get(r.scenario, len(classes)),
            order.get(f"{r.scenario}/{r.case}", len(order)),
        )
    )
    failed = [r for r in results if r.verdict == "FAIL"]
    ran = {f"{r.scenario}/{r.case}" for r in results}
    # A planned cell with no row of that name was not judged: that fails the run too.
    not_run = [cell.name for cell in chosen if cell.name not in ran]
    elapsed = time.monotonic() - report.started
    report.say("")
    report.say(render_table(results, missing))
    report.say("")
    for name in not_run:
        report.say(f"PLANNED CELL WITHOUT A RESULT: {name}")
    failed_runs = 0
    in_flight: int | None = None
    if totals is not None:
        for line in random_lines(totals, runs, seed):
            report.say(line)
        failed_runs = sum(t.get("violations", 0) for t in totals.values())
        in_flight = sum(t.get("killed_in_flight", 0) for t in totals.values())
    for charge in unattributed:
        report.say(unattributed_line(charge))
    for line in gate_lines(results, missing):
        report.say(line)
    passed = sum(r.verdict == "pass" for r in results)
    skipped = sum(r.verdict == "skipped" for r in results)
    naive_dupes = sum(1 for r in results if duplicated(r.naive_effects))
    ledger_dupes = None if missing else sum(duplicated(r.ledger_effects) for r in results)
    ledger_said = (
        f"{LEDGER} in {ledger_dupes} cells" if missing is None else f"{LEDGER} not run"
    )
    report.say(
        f"summary: {passed} passed, {len(failed)} failed, {skipped} skipped cells in "
        f"{elapsed:.0f}s; {restarts} worker processes killed and replaced; baselines "
        f"duplicated the charge: naive in {naive_dupes} cells, {ledger_said}; "
        f"{len(unattributed)} unattributed target charges"
    )
    if png_path is not None:
        from examples.crash_matrix.picture import write_png

        write_png(
            png_path,
            results,
            title=(
                f"crash matrix: target charges per cell, broker vs. baselines under the "
                f"same faults ({passed} passed, {len(failed)} failed; {elapsed:.0f}s)"
            ),
            ledger_missing=missing,
        )
        report.say(f"picture written to {png_path}")
    if json_path is not None:
        document = {
            "cells": [r.as_dict() for r in results],
            "random_runs": totals,
            "killed_in_flight": in_flight,
            "seconds": round(elapsed, 1),
            "worker_restarts": restarts,
            "selected": len(chosen),
            "only": only or [],
            "agent_ledger": (
                {"missing": missing}
                if missing
                else {"version": ledger_version(), "stale_after_ms": STALE_AFTER_MS}
            ),
            "baseline_duplicates": {"naive": naive_dupes, "agent_ledger": ledger_dupes},
            "gate": [f"{r.scenario}/{r.case}" for r in gate_cells(results)],
            "unattributed": [charge.as_dict() for charge in unattributed],
            "not_run": not_run,
        }
        json_path.write_text(json.dumps(document, indent=2))
    return 1 if failed or failed_runs or unattributed or not_run else 0
