"""``effect-broker demo crash-matrix``: kill real broker processes at every boundary and
count charges in the target's own table, next to a naive retry loop under the same kills.
"""

from __future__ import annotations

import json
import random
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
from examples.crash_matrix.cells import (
    CellResult,
    charge_body,
    concurrent_cell,
    db_restart_cells,
    judge,
    kill_cell,
    target_down_cells,
    zombie_cell,
)
from examples.crash_matrix.rig import Rig, open_rig

if TYPE_CHECKING:
    from effect_broker.management.crash_matrix_options import TextSink

SCENARIOS = ["idempotent", "reconcilable", "transactional", "unsafe"]
NETWORK = ["idempotent", "reconcilable", "unsafe"]
HEADLINE = ("idempotent", "after_target_commit")


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
        naive = "" if result.naive_effects is None else f", naive {result.naive_effects}"
        self.say(
            f"[{self.done:>2}/{self.total}] {time.monotonic() - self.started:5.1f}s "
            f"{result.scenario:<13} {result.case:<26} -> {result.target_effects} effect, "
            f"{result.status}{naive}  {result.verdict}"
        )


def _in_pool(
    rig: Rig, jobs: list[Callable[[], CellResult]], parallel: int, report: Reporter
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


def render_table(results: list[CellResult]) -> str:
    """The matrix as a markdown table."""
    lines = [
        "| scenario | fault | target effects | broker status | receipts "
        "| naive baseline effects | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        naive = "-" if r.naive_effects is None else str(r.naive_effects)
        verdict = r.verdict + (f" ({r.note})" if r.note else "")
        lines.append(
            f"| {r.scenario} | {r.case} | {r.target_effects} | {r.status} | {r.receipts} "
            f"| {naive} | {verdict} |"
        )
    return "\n".join(lines)


def run_matrix(
    out: TextSink,
    *,
    workers: int = 3,
    parallel: int = 3,
    runs: int = 0,
    seed: int = 42,
    json_path: Path | None = None,
) -> int:
    """Run the whole matrix; print progress, the table and a summary; return exit code."""
    run_id = time.strftime("%H%M%S")
    where = (
        "DATABASE_URL"
        if settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
        else "embedded PostgreSQL"
    )
    kills = [(s, fp) for s in SCENARIOS for fp in FAILPOINTS]
    total = len(kills) + len(SCENARIOS) + len(NETWORK) * 2 + len(SCENARIOS)
    report = Reporter(out, total)
    report.say(
        f"crash matrix: {len(SCENARIOS)} safety classes x {len(FAILPOINTS)} kill points, "
        f"plus concurrency, zombie, target-down and database-restart faults ({where}, "
        f"{workers} real worker processes)"
    )
    with open_rig(workers=workers) as rig:
        report.say(
            f"rig ready in {time.monotonic() - report.started:.1f}s: scratch "
            f"database, target service at {rig.target.url}"
        )
        first = kill_cell(rig, *HEADLINE, run_id)
        report.cell(first)
        report.say(
            f"  => worker SIGKILLed after the target committed: the broker left "
            f"{first.target_effects} charge; the naive retry loop left "
            f"{first.naive_effects} charges"
        )
        rest = [k for k in kills if k != HEADLINE]
        results = [first]
        results += _in_pool(
            rig,
            [lambda s=s, fp=fp: kill_cell(rig, s, fp, run_id) for s, fp in rest],
            parallel,
            report,
        )
        results += _in_pool(
            rig,
            [lambda s=s: concurrent_cell(rig, s, run_id) for s in SCENARIOS],
            parallel,
            report,
        )
        for scenario in NETWORK:
            result = zombie_cell(rig, scenario, run_id)
            report.cell(result)
            results.append(result)
        for result in target_down_cells(rig, NETWORK, run_id):
            report.cell(result)
            results.append(result)
        totals = random_runs(rig, runs, seed, report) if runs else None
        for result in db_restart_cells(rig, SCENARIOS, run_id):
            report.cell(result)
            results.append(result)
        restarts = rig.pool.restarts if rig.pool else 0
    order = {s: i for i, s in enumerate(SCENARIOS)}
    cases = {fp: i for i, fp in enumerate(FAILPOINTS)}
    results.sort(key=lambda r: (order[r.scenario], cases.get(r.case, len(cases))))
    failed = [r for r in results if r.verdict == "FAIL"]
    elapsed = time.monotonic() - report.started
    report.say("")
    report.say(render_table(results))
    report.say("")
    if totals is not None:
        report.say(f"random kill timing, {runs} runs (seed {seed}):")
        for scenario, t in totals.items():
            report.say(
                f"  {scenario:<13} runs={t.get('runs', 0)} effects={t.get('effects', 0)} "
                f"killed_in_flight={t.get('killed_in_flight', 0)} "
                f"duplicates={t.get('duplicates', 0)} unknown={t.get('unknown', 0)} "
                f"missing={t.get('missing', 0)} violations={t.get('violations', 0)}"
            )
        failed_runs = sum(t.get("violations", 0) for t in totals.values())
    else:
        failed_runs = 0
    passed = sum(r.verdict == "pass" for r in results)
    skipped = sum(r.verdict == "skipped" for r in results)
    naive_dupes = sum(1 for r in results if (r.naive_effects or 0) > 1)
    report.say(
        f"summary: {passed} passed, {len(failed)} failed, {skipped} skipped cells in "
        f"{elapsed:.0f}s; {restarts} worker processes killed and replaced; naive "
        f"baseline duplicated the charge in {naive_dupes} cells"
    )
    if json_path is not None:
        json_path.write_text(
            json.dumps(
                {
                    "cells": [r.as_dict() for r in results],
                    "random_runs": totals,
                    "seconds": round(elapsed, 1),
                    "worker_restarts": restarts,
                },
                indent=2,
            )
        )
    return 1 if failed or failed_runs else 0
