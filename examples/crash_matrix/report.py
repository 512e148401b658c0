"""What the crash matrix prints: the table, the baselines' tally, the stop/go gate line.

A baseline has no receipts or states to judge, only its charges in the target's table,
so it is held to the count part of each class's promise: exactly one charge for the
safe classes, at most one for unsafe (spec "Killer demo").
"""

from __future__ import annotations

from typing import Any

from examples.crash_matrix.cells import CellResult
from examples.crash_matrix.target_client import Charge

LEDGER = "agent-ledger"


def baseline_kept(scenario: str, effects: int | None) -> bool | None:
    """Whether a baseline's charge count keeps the class's promise (None: not run)."""
    if effects is None:
        return None
    return effects <= 1 if scenario == "unsafe" else effects == 1


def duplicated(effects: int | None) -> bool:
    """Whether a baseline charged more than once."""
    return (effects or 0) > 1


def gate_cells(results: list[CellResult]) -> list[CellResult]:
    """Cells the broker passed while the naive loop AND agent-ledger both failed.

    The spec's stop/go gate: "the crash demo clearly passes a case that agent-runtime
    and an unmodified local ledger fail".
    """
    return [
        r
        for r in results
        if r.verdict == "pass"
        and baseline_kept(r.scenario, r.naive_effects) is False
        and baseline_kept(r.scenario, r.ledger_effects) is False
    ]


def gate_lines(results: list[CellResult], ledger_missing: str | None) -> list[str]:
    """The stop/go gate, said plainly whether or not it holds in this run."""
    if ledger_missing:
        return [f"stop/go gate: not checked, {ledger_missing}"]
    cells = gate_cells(results)
    if not cells:
        return [
            "stop/go gate: NOT shown by this run - no cell where the broker passed and "
            f"both the naive loop and {LEDGER} failed"
        ]
    lines = [
        f"stop/go gate holds: the broker kept its promise in {len(cells)} cell(s) that "
        f"both the naive retry loop and an unmodified local ledger ({LEDGER}) failed:"
    ]
    lines += [
        f"  {r.scenario}/{r.case}: broker {r.target_effects} charge ({r.status}), "
        f"naive {r.naive_effects}, {LEDGER} {r.ledger_effects}"
        for r in cells
    ]
    return lines


def render_table(results: list[CellResult], ledger_missing: str | None = None) -> str:
    """The matrix as a markdown table."""
    lines = [
        "| scenario | fault | target effects | broker status | receipts "
        f"| naive baseline effects | {LEDGER} effects | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        naive = "-" if r.naive_effects is None else str(r.naive_effects)
        if r.ledger_effects is not None:
            ledger = str(r.ledger_effects)
        else:
            # Not a number it did not produce: say it was never run.
            ledger = (
                "not installed" if ledger_missing and r.naive_effects is not None else "-"
            )
        verdict = r.verdict + (f" ({r.note})" if r.note else "")
        lines.append(
            f"| {r.scenario} | {r.case} | {r.target_effects} | {r.status} | {r.receipts} "
            f"| {naive} | {ledger} | {verdict} |"
        )
    return "\n".join(lines)


def random_lines(totals: dict[str, Any], runs: int, seed: int) -> list[str]:
    """The random-kill runs' tally per class; how many effects a kill hit in flight."""
    lines = [f"random kill timing, {runs} runs (seed {seed}):"]
    for scenario, t in totals.items():
        lines.append(
            f"  {scenario:<13} runs={t.get('runs', 0)} effects={t.get('effects', 0)} "
            f"killed_in_flight={t.get('killed_in_flight', 0)} "
            f"duplicates={t.get('duplicates', 0)} unknown={t.get('unknown', 0)} "
            f"missing={t.get('missing', 0)} violations={t.get('violations', 0)}"
        )
    in_flight = sum(t.get("killed_in_flight", 0) for t in totals.values())
    lines.append(
        f"  kills landed while {in_flight} of {runs} effects were in flight (their "
        "lease had to expire)"
        + ("" if in_flight else " - NONE: these runs did not test a mid-flight kill")
    )
    return lines


def unattributed_line(charge: Charge) -> str:
    """One charge in the target's table that no cell counted."""
    return (
        f"UNATTRIBUTED target charge {charge.id}: mode={charge.mode} "
        f"key={charge.key or '-'} body_hash={charge.body_hash.hex()[:16]}... - no "
        "cell counted it, so no verdict saw it"
    )
