"""Issue 24's crash cells, read from the full ``effect-broker demo crash-matrix`` run
(tests/crash/conftest.py: three real workers, the target service, counts in the
target's own table).

An approval is bound to one effect and consumed by one dispatch: approved and then a
worker SIGKILLed at every boundary -> exactly one charge; the submit redelivered 3x
around the approval -> one effect, one charge; denied -> no charge; expired -> no
charge and failed_final; five operators at once -> one approval, one dispatch. Each
cell's rules must all hold; the facts are asserted again here, so that a loosened rule
in a cell cannot hide.
"""

from __future__ import annotations

from typing import Any

import pytest

from examples.crash_matrix.plan import (
    APPROVAL,
    APPROVAL_CASES,
    APPROVAL_KILLS,
    APPROVED_KILLED,
    CONCURRENT_APPROVALS,
    DENIED,
    EXPIRED,
    REDELIVERED,
)

pytestmark = pytest.mark.slow

Cells = dict[str, Any]


@pytest.fixture(scope="module")
def cells(matrix) -> Cells:
    _, _, data = matrix
    assert data, "the crash matrix wrote no results"
    return {r["case"]: r for r in data["cells"] if r["scenario"] == APPROVAL}


def test_every_approval_cell_ran_and_passed(cells: Cells) -> None:
    assert sorted(cells) == sorted(APPROVAL_CASES)
    failed = {case: r["note"] for case, r in cells.items() if r["verdict"] != "pass"}
    assert failed == {}


@pytest.mark.parametrize("failpoint", APPROVAL_KILLS)
def test_approved_then_killed_charges_exactly_once(cells: Cells, failpoint: str) -> None:
    cell = cells[APPROVED_KILLED.format(failpoint=failpoint)]
    assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
        1,
        1,
        "succeeded",
    )
    assert cell["facts"]["charges"] == 1  # by downstream key, in the target's table
    assert cell["facts"]["events"].count("approved") == 1


def test_a_redelivered_submit_is_one_effect_and_one_charge(cells: Cells) -> None:
    cell = cells[REDELIVERED]
    assert len(cell["facts"]["effect_ids"]) == 1
    assert (cell["target_effects"], cell["status"]) == (1, "succeeded")


def test_denied_and_expired_are_never_sent(cells: Cells) -> None:
    for case, last in ((DENIED, "approval_denied"), (EXPIRED, "approval_expired")):
        cell = cells[case]
        assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
            0,
            0,
            "failed_final",
        ), case
        assert cell["facts"]["events"][-1] == last
        assert "dispatch_started" not in cell["facts"]["events"]
    assert cells[EXPIRED]["facts"]["late_approval"] == "approval_expired"


def test_concurrent_approvals_make_one_dispatch(cells: Cells) -> None:
    cell = cells[CONCURRENT_APPROVALS]
    assert cell["facts"]["answers"] == ["already_approved"] * 4 + ["approved"]
    assert cell["facts"]["events"].count("approved") == 1
    assert cell["facts"]["events"].count("dispatch_started") == 1
    assert (cell["target_effects"], cell["status"]) == (1, "succeeded")
