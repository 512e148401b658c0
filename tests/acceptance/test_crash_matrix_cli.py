"""``effect-broker demo crash-matrix`` options as a user runs them: ``--only`` (a typo
is one line and exit 2), ``--png`` and ``--json`` on a one-cell run, and a charge that
no cell counted failing the run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from effect_broker import embedded_pg
from examples.crash_matrix import plan

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: Runs the matrix on one real cell, then (STRAY=stray) adds a charge no cell made, or
#: (STRAY=drop) throws the cell's result away: the real rig, audit and exit code.
STRAY = """
import os, sys
from pathlib import Path
import django
import httpx

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()
from examples.crash_matrix import matrix

real_cells = matrix._run_cells

def cells_then_fault(rig, *args, **options):
    results = real_cells(rig, *args, **options)
    if os.environ["STRAY"] == "stray":
        httpx.post(
            rig.target.url + "/unsafe/charges", json={"stray": True}, trust_env=False
        ).raise_for_status()
    return [] if os.environ["STRAY"] == "drop" else results

matrix._run_cells = cells_then_fault
sys.exit(matrix.run_matrix(
    sys.stdout, only=["idempotent/after_receipt_commit"], json_path=Path(sys.argv[1])
))
"""


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A state directory of this module's own (EFFECT_BROKER_STATE_DIR), so the matrix
    runs here on an embedded server of their own: the session's full matrix run
    (tests/crash/) restarts and stops its server under the checkout meanwhile."""
    state = tmp_path_factory.mktemp("matrix-state")
    yield state
    project = state / ".effect-broker" / "crash-matrix"
    embedded_pg.stop(project, mode="immediate")
    # The server's own directory (data, socket) is under /tmp, named by the project.
    shutil.rmtree(embedded_pg._state_dir(project), ignore_errors=True)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    return {**env, **extra}


def run(
    state_dir: Path, *args: str, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=clean_env(EFFECT_BROKER_STATE_DIR=str(state_dir), **env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def demo_crash_matrix(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``effect-broker demo crash-matrix ARGS`` as a user types it."""
    return run(state_dir, "-m", "effect_broker.cli", "demo", "crash-matrix", *args)


def test_an_only_pattern_that_selects_no_cell_is_one_line_and_exit_2(
    state_dir: Path,
) -> None:
    result = demo_crash_matrix(state_dir, "--only", "idempotent,nosuch")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "effect-broker: error [invalid_request]: --only 'nosuch' matches no cell;"
    )
    assert result.stdout == ""  # refused before any rig was started


@pytest.mark.slow
def test_one_cell_run_draws_the_png_and_shows_the_gate(
    state_dir: Path, tmp_path: Path
) -> None:
    png, out = tmp_path / "m.png", tmp_path / "m.json"
    result = demo_crash_matrix(
        state_dir,
        "--only",
        "reconcilable/after_target_commit",
        "--png",
        str(png),
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"selected 1 of {len(plan.all_cells())} cells" in result.stdout
    assert "stop/go gate holds" in result.stdout
    data = json.loads(out.read_text())
    [cell] = data["cells"]
    # The broker settles once; both baselines resend after the kill and charge twice.
    assert (cell["target_effects"], cell["naive_effects"], cell["ledger_effects"]) == (
        1,
        2,
        2,
    )
    assert data["gate"] == ["reconcilable/after_target_commit"]
    assert data["unattributed"] == []
    assert png.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "code"), [("none", 0), ("stray", 1), ("drop", 1)])
def test_a_charge_or_a_cell_no_verdict_saw_fails_the_run(
    state_dir: Path, tmp_path: Path, fault: str, code: int
) -> None:
    out = tmp_path / "m.json"
    result = run(state_dir, "-c", STRAY, str(out), STRAY=fault)
    assert result.returncode == code, result.stdout[-3000:] + result.stderr[-2000:]
    data = json.loads(out.read_text())
    if fault == "stray":
        [charge] = data["unattributed"]
        assert charge["mode"] == "unsafe"
        assert "UNATTRIBUTED target charge" in result.stdout
        assert "; 1 unattributed target charges" in result.stdout
    else:
        # The cell's own charges (broker, naive, agent-ledger) are all attributed.
        assert data["unattributed"] == []
    if fault == "drop":
        assert data["not_run"] == ["idempotent/after_receipt_commit"]
        assert "PLANNED CELL WITHOUT A RESULT" in result.stdout
    else:
        assert data["not_run"] == []
        [cell] = data["cells"]
        assert (cell["target_effects"], cell["naive_effects"]) == (1, 1)
        assert cell["ledger_effects"] == 1
