"""The crash matrix, in full, as a test: the project's main job is also its proof.

Runs ``effect-broker demo crash-matrix`` exactly as a user would (a subprocess with its
own embedded server or DATABASE_URL scratch database) and checks every verdict. No
subset: CI runs every scenario x failpoint cell, concurrency, zombie, target-down and
database-restart faults, plus a short burst of random kill timing. Both baselines (the
naive loop and agent-ledger) run under the same kills; every charge in the target's
table must belong to a cell.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.crash_matrix.plan import APPROVAL, EDGE_CASES, RUNTIME_PREFIX, safety_of

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_every_cell_keeps_its_safety_class_promise(matrix) -> None:
    code, output, data = matrix
    assert code == 0, output[-4000:]
    cells = data["cells"]
    failed = [c for c in cells if c["verdict"] == "FAIL"]
    assert failed == []
    # 4 classes x 6 failpoints, 4 concurrency cells, 3 zombies, 3 target-down,
    # 4 restarts, 1 restart under load, 15 edge cells (tests/crash/test_edge_cells.py
    # reads those), 3 classes x 2 kills behind the mcp adapter
    # (tests/crash/test_mcp_adapter_cells.py), 4 runtimes
    # (tests/crash/test_runtime_cells.py) and 8 approval cells
    # (tests/crash/test_approval_cells.py)
    assert len(cells) == 72


def test_safe_classes_leave_exactly_one_charge_in_the_target_table(matrix) -> None:
    _, _, data = matrix
    for cell in data["cells"]:
        if (cell["scenario"], cell["case"]) in EDGE_CASES:
            continue  # their own rules: tests/crash/test_edge_cells.py
        if cell["scenario"] == APPROVAL:
            continue  # their own rules: tests/crash/test_approval_cells.py
        if safety_of(cell["scenario"]) != "unsafe" and cell["verdict"] != "skipped":
            assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
                1,
                1,
                "succeeded",
            ), cell


def test_unsafe_never_duplicates_and_reports_unknown_plainly(matrix) -> None:
    _, _, data = matrix
    unsafe = {c["case"]: c for c in data["cells"] if c["scenario"] == "unsafe"}
    assert all(c["target_effects"] <= 1 for c in unsafe.values())
    behind_mcp = [c for c in data["cells"] if c["scenario"] == "mcp-unsafe"]
    assert behind_mcp
    assert all(c["target_effects"] <= 1 for c in behind_mcp)
    for case in ("before_request_write", "after_target_commit", "before_receipt_commit"):
        assert unsafe[case]["status"] == "outcome_unknown", case
        assert unsafe[case]["receipts"] == 0


def test_the_naive_baseline_duplicates_under_the_same_kills(matrix) -> None:
    _, _, data = matrix
    naive = {
        (c["scenario"], c["case"]): c["naive_effects"]
        for c in data["cells"]
        if c["naive_effects"] is not None
    }
    assert naive[("idempotent", "after_target_commit")] == 2
    assert sum(1 for n in naive.values() if n > 1) >= 4


def test_random_kill_timing_never_duplicates_a_safe_effect(matrix) -> None:
    _, _, data = matrix
    runs = data["random_runs"]
    assert sum(r.get("runs", 0) for r in runs.values()) == 24
    for scenario, totals in runs.items():
        assert totals.get("duplicates", 0) == 0, scenario
        assert totals.get("violations", 0) == 0, scenario


def test_every_target_charge_belongs_to_a_cell(matrix) -> None:
    _, output, data = matrix
    # Keyed broker charges were counted by their downstream key, the rest by body;
    # a charge none of those counts covered would be listed here (and fail the run).
    assert data["unattributed"] == []
    assert "; 0 unattributed target charges" in output


def test_agent_ledger_runs_under_the_same_kills(matrix) -> None:
    _, _, data = matrix
    assert data["agent_ledger"]["version"].startswith("0.2.")
    ledger = {
        (c["scenario"], c["case"]): c["ledger_effects"]
        for c in data["cells"]
        # A runtime cell's baseline is the runtime alone (test_runtime_cells.py)
        if c["naive_effects"] is not None and not c["scenario"].startswith(RUNTIME_PREFIX)
    }
    # A column next to every naive one: 24 kill cells and 4 concurrency cells.
    assert len(ledger) == 28
    assert None not in ledger.values()
    # Its idem_key, passed down as the Idempotency-Key, saves the idempotent class...
    assert ledger[("idempotent", "after_target_commit")] == 1
    # ...but its local ledger cannot tell a lost answer from a request never sent:
    # after the kill it takes the call over and charges again.
    assert ledger[("reconcilable", "after_target_commit")] == 2
    assert ledger[("unsafe", "after_target_commit")] == 2
    assert data["baseline_duplicates"]["agent_ledger"] >= 4


def test_the_stop_go_gate_holds_and_is_printed(matrix) -> None:
    _, output, data = matrix
    # Spec, "Apply the stop/go gate": a case the broker passes that both the naive
    # runtime and an unmodified local ledger fail.
    assert "reconcilable/after_target_commit" in data["gate"]
    assert "stop/go gate holds:" in output


def test_random_kills_landed_while_effects_were_in_flight(matrix) -> None:
    _, _, data = matrix
    runs = data["random_runs"]
    in_flight = sum(r.get("killed_in_flight", 0) for r in runs.values())
    assert data["killed_in_flight"] == in_flight
    assert in_flight > 0


def test_png_is_written(matrix) -> None:
    _, _, data = matrix
    assert data["png_head"] == b"\x89PNG\r\n\x1a\n"


def test_the_same_workers_outlive_every_database_restart(matrix) -> None:
    # Issue 11: a restart cell fails when any worker process exited during it (the
    # rig counts them), so a pass means no worker had to be replaced.
    _, _, data = matrix
    restarts = [c for c in data["cells"] if c["case"].startswith("postgres restart")]
    assert len(restarts) == 5
    assert [c for c in restarts if c["verdict"] == "FAIL"] == []
    under_load = [c for c in restarts if c["case"] == "postgres restart under load"]
    if under_load[0]["verdict"] == "pass":
        assert "none replaced" in under_load[0]["note"]
