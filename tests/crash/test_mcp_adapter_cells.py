"""The mcp adapter under worker kills (issue 10, item 4), read from the one crash-matrix
run of the session (``matrix`` in conftest.py).

A worker is SIGKILLed after the example payments MCP server answered that the target
committed, and again just before the receipt commit. The verdict counts charges in the
target service's own table: exactly one for the idempotent and reconcilable contracts,
and for the unsafe one never two, with ``outcome_unknown`` shown plainly, because the
``tools/call`` had left when the worker died.
"""

from __future__ import annotations

import pytest

from examples.crash_matrix.plan import MCP_FAILPOINTS, MCP_SCENARIOS

pytestmark = pytest.mark.slow

Cells = dict[tuple[str, str], dict]


@pytest.fixture(scope="module")
def cells(matrix: tuple[int, str, dict]) -> Cells:
    _, _, data = matrix
    return {
        (c["scenario"], c["case"]): c
        for c in data["cells"]
        if c["scenario"] in MCP_SCENARIOS
    }


def test_every_mcp_cell_ran_and_passed(cells: Cells) -> None:
    assert set(cells) == {(s, fp) for s in MCP_SCENARIOS for fp in MCP_FAILPOINTS}
    assert [c for c in cells.values() if c["verdict"] != "pass"] == []


@pytest.mark.parametrize("failpoint", MCP_FAILPOINTS)
@pytest.mark.parametrize("scenario", ["mcp-idempotent", "mcp-reconcilable"])
def test_keyed_upstream_tools_leave_exactly_one_charge(
    cells: Cells, scenario: str, failpoint: str
) -> None:
    cell = cells[(scenario, failpoint)]
    assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
        1,
        1,
        "succeeded",
    )


@pytest.mark.parametrize("failpoint", MCP_FAILPOINTS)
def test_an_unsafe_upstream_tool_is_never_charged_twice_and_stays_unknown(
    cells: Cells, failpoint: str
) -> None:
    cell = cells[("mcp-unsafe", failpoint)]
    # The tools/call left before the kill: it charged once, and nobody may claim
    # to know that without an operator.
    assert cell["target_effects"] == 1
    assert (cell["status"], cell["receipts"]) == ("outcome_unknown", 0)
