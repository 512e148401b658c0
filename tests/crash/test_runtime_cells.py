"""The crash matrix's runtime cells (issue 23), read from the session's one full run
(tests/crash/conftest.py): a real DBOS, LangGraph, Celery and Temporal process
SIGKILLed after the target committed, recovered; alone it charged twice, through the
broker with its recipe once."""

from __future__ import annotations

import pytest

from examples.crash_matrix.plan import RUNTIME_CASE, RUNTIME_SCENARIOS

pytestmark = pytest.mark.slow


def runtime_cells(data: dict) -> dict[str, dict]:
    return {c["scenario"]: c for c in data["cells"] if c["case"] == RUNTIME_CASE}


def test_every_runtime_charges_once_through_the_broker_and_twice_alone(matrix) -> None:
    _, _, data = matrix
    cells = runtime_cells(data)
    assert sorted(cells) == sorted(RUNTIME_SCENARIOS)
    table = {
        scenario: (c["naive_effects"], c["target_effects"], c["receipts"], c["status"])
        for scenario, c in cells.items()
    }
    assert table == {
        scenario: (2, 1, 1, "succeeded") for scenario in RUNTIME_SCENARIOS
    }, [c["note"] for c in cells.values()]
    assert {c["verdict"] for c in cells.values()} == {"pass"}


def test_the_runtime_rows_say_which_count_is_the_runtime_alone(matrix) -> None:
    _, output, data = matrix
    for scenario, cell in runtime_cells(data).items():
        runtime = scenario.removeprefix("runtime-")
        assert cell["note"] == (
            f"{runtime} alone (the step calls the target itself) left 2 charges; the "
            "recipe through the broker left 1"
        )
        assert f"| {scenario} | {RUNTIME_CASE} | 1 | succeeded | 1 | 2 |" in output
