"""No crash-matrix cell ends "skipped" without a test saying so (issue 20, item 6).

The database-restart cells need the embedded server (they restart it); on a
``DATABASE_URL`` server the rig marks them "skipped", and the other crash tests read
past a skipped cell. Here a skip either cannot happen (embedded server: every cell
must run) or is reported as this test's own skip, with the cells and the reason.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytestmark = pytest.mark.slow

#: The only cells the rig may skip, and only on a DATABASE_URL server.
RESTART_CASES = {"postgres restart", "postgres restart under load"}
EXTERNAL = "needs the embedded server (DATABASE_URL is external)"


def skipped_cells(cells: list[dict[str, Any]], *, embedded: bool) -> list[str]:
    """The skipped cells, as ``scenario/case: note``; fails on a skip that may not be."""
    skipped = [c for c in cells if c["verdict"] == "skipped"]
    names = [f"{c['scenario']}/{c['case']}: {c['note']}" for c in skipped]
    if embedded:
        assert names == [], "cells skipped on the embedded server"
    for cell in skipped:
        assert cell["case"] in RESTART_CASES, cell
        assert cell["note"] == EXTERNAL, cell
    return names


def test_every_cell_runs_or_its_skip_is_reported(matrix) -> None:
    _, _, data = matrix
    # The matrix subprocess runs on DATABASE_URL when it is set (tests/crash/conftest.py)
    embedded = not os.environ.get("DATABASE_URL")
    names = skipped_cells(data["cells"], embedded=embedded)
    if names:
        pytest.skip(f"{len(names)} crash-matrix cells did not run: {'; '.join(names)}")


def _cell(case: str, verdict: str, note: str = "") -> dict[str, Any]:
    return {"scenario": "idempotent", "case": case, "verdict": verdict, "note": note}


def test_the_check_refuses_a_skip_on_the_embedded_server() -> None:
    # The test above is only worth something if a skipped cell can fail it.
    cells = [_cell("postgres restart", "skipped", EXTERNAL), _cell("x", "pass")]
    with pytest.raises(AssertionError, match="skipped on the embedded server"):
        skipped_cells(cells, embedded=True)
    assert skipped_cells(cells, embedded=False) == [
        f"idempotent/postgres restart: {EXTERNAL}"
    ]
    with pytest.raises(AssertionError):  # nothing else may skip, anywhere
        skipped_cells([_cell("after_target_commit", "skipped", "?")], embedded=False)
