"""The crash matrix, in full, as a test: the project's main job is also its proof.

Runs ``effect-broker demo crash-matrix`` exactly as a user would (a subprocess with its
own embedded server or DATABASE_URL scratch database) and checks every verdict. No
subset: CI runs every scenario x failpoint cell, concurrency, zombie, target-down and
database-restart faults, plus a short burst of random kill timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict]:
    folder = tmp_path_factory.mktemp("matrix")
    out, log = folder / "matrix.json", folder / "matrix.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    # Output to a file, not a pipe: a pipe's reader waits for EOF from every process
    # that inherited it, so one leaked grandchild would hang the test.
    with log.open("w") as sink:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "effect_broker.cli",
                "demo",
                "crash-matrix",
                "--runs",
                "24",
                "--seed",
                "7",
                "--json",
                str(out),
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=900,
            check=False,
        )
    data = json.loads(out.read_text()) if out.exists() else {}
    return result.returncode, log.read_text(errors="replace"), data


def test_every_cell_keeps_its_safety_class_promise(matrix) -> None:
    code, output, data = matrix
    assert code == 0, output[-4000:]
    cells = data["cells"]
    failed = [c for c in cells if c["verdict"] == "FAIL"]
    assert failed == []
    # 4 classes x 6 failpoints, 4 concurrency cells, 3 zombies, 3 target-down, 4 restarts
    assert len(cells) == 38


def test_safe_classes_leave_exactly_one_charge_in_the_target_table(matrix) -> None:
    _, _, data = matrix
    for cell in data["cells"]:
        if cell["scenario"] != "unsafe" and cell["verdict"] != "skipped":
            assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
                1,
                1,
                "succeeded",
            ), cell


def test_unsafe_never_duplicates_and_reports_unknown_plainly(matrix) -> None:
    _, _, data = matrix
    unsafe = {c["case"]: c for c in data["cells"] if c["scenario"] == "unsafe"}
    assert all(c["target_effects"] <= 1 for c in unsafe.values())
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
