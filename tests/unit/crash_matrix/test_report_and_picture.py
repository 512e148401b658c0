"""The matrix's report: baselines held to their class's count promise, the stop/go gate
line, the table's agent-ledger column, and the ``--png`` picture."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.crash_matrix.cells import CellResult
from examples.crash_matrix.picture import write_png
from examples.crash_matrix.report import (
    baseline_kept,
    gate_cells,
    gate_lines,
    random_lines,
    render_table,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def cell(
    scenario: str,
    case: str,
    naive: int | None,
    ledger: int | None,
    *,
    effects: int = 1,
    status: str = "succeeded",
    verdict: str = "pass",
) -> CellResult:
    return CellResult(
        scenario=scenario,
        case=case,
        target_effects=effects,
        status=status,
        receipts=1 if status == "succeeded" else 0,
        naive_effects=naive,
        verdict=verdict,
        note="",
        seconds=1.0,
        ledger_effects=ledger,
    )


RESULTS = [
    cell("idempotent", "after_target_commit", 2, 1),
    cell("reconcilable", "after_target_commit", 2, 2),
    cell("unsafe", "after_target_commit", 2, 2, status="outcome_unknown"),
    cell("unsafe", "before_request_write", 1, 1, effects=0, status="outcome_unknown"),
    cell("unsafe", "zombie worker", None, None, status="outcome_unknown"),
]


@pytest.mark.parametrize(
    ("scenario", "effects", "kept"),
    [
        ("idempotent", 1, True),
        ("idempotent", 2, False),
        ("reconcilable", 0, False),  # a lost charge breaks a safe class too
        ("unsafe", 0, True),
        ("unsafe", 1, True),
        ("unsafe", 2, False),
        ("transactional", None, None),
    ],
)
def test_a_baseline_is_held_to_its_class_count_promise(
    scenario: str, effects: int | None, kept: bool | None
) -> None:
    assert baseline_kept(scenario, effects) is kept


def test_the_gate_names_cells_both_baselines_failed_and_the_broker_passed() -> None:
    assert [(r.scenario, r.case) for r in gate_cells(RESULTS)] == [
        ("reconcilable", "after_target_commit"),
        ("unsafe", "after_target_commit"),
    ]
    lines = gate_lines(RESULTS, None)
    assert lines[0].startswith("stop/go gate holds: the broker kept its promise in 2")
    assert (
        "reconcilable/after_target_commit: broker 1 charge (succeeded), naive 2, "
        in (lines[1])
    )


def test_a_failed_broker_cell_never_counts_for_the_gate() -> None:
    failing = [cell("reconcilable", "after_target_commit", 2, 2, verdict="FAIL")]
    assert gate_cells(failing) == []
    assert gate_lines(failing, None)[0].startswith("stop/go gate: NOT shown")


def test_without_agent_ledger_the_column_and_the_gate_say_so() -> None:
    results = [cell("idempotent", "after_target_commit", 2, None)]
    missing = "agent-ledger is not installed (agent_ledger cannot be imported)"
    row = render_table(results, missing).splitlines()[2]
    assert row == (
        "| idempotent | after_target_commit | 1 | succeeded | 1 | 2 | not installed "
        "| pass |"
    )
    assert gate_lines(results, missing) == [f"stop/go gate: not checked, {missing}"]


def test_the_table_has_an_agent_ledger_column() -> None:
    lines = render_table(RESULTS).splitlines()
    assert "| naive baseline effects | agent-ledger effects | verdict |" in lines[0]
    assert lines[3] == (
        "| reconcilable | after_target_commit | 1 | succeeded | 1 | 2 | 2 | pass |"
    )
    assert lines[6].startswith(
        "| unsafe | zombie worker | 1 | outcome_unknown | 0 | - | - |"
    )


def test_png_is_a_valid_picture_of_every_row(tmp_path: Path) -> None:
    import matplotlib.image

    path = tmp_path / "sub" / "matrix.png"
    write_png(path, RESULTS, title="test")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width, _ = matplotlib.image.imread(path).shape
    assert width > 600
    assert height > 250


def test_random_runs_report_how_many_effects_a_kill_hit_in_flight() -> None:
    totals = {
        "idempotent": {"runs": 4, "effects": 4, "killed_in_flight": 2},
        "unsafe": {"runs": 2, "effects": 2, "killed_in_flight": 1},
    }
    lines = random_lines(totals, 6, 7)
    assert lines[0] == "random kill timing, 6 runs (seed 7):"
    assert "killed_in_flight=2" in lines[1]
    assert lines[-1] == (
        "  kills landed while 3 of 6 effects were in flight (their lease had to expire)"
    )
    quiet = {"idempotent": {"runs": 6, "effects": 6}}
    assert random_lines(quiet, 6, 7)[-1].endswith(
        "- NONE: these runs did not test a mid-flight kill"
    )
