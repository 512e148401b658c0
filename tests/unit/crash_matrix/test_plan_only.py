"""``--only``: which crash-matrix cells a pattern selects, and the error for a typo."""

from __future__ import annotations

import pytest

from examples.crash_matrix import plan


def names(cells: list[plan.CellId]) -> list[str]:
    return [cell.name for cell in cells]


def test_a_full_run_plans_72_cells_with_unique_names() -> None:
    cells = plan.all_cells()
    # 4 classes x 6 failpoints, 4 concurrency cells, 3 zombies, 3 target-down,
    # 4 restarts, 1 restart under load, 15 edge cells, 3 classes x 2 kills behind
    # the mcp adapter, 4 runtimes, 8 approval cells
    assert len(cells) == 72
    assert len(set(names(cells))) == 72
    # --only splits on commas: no cell name may hold one
    assert not [name for name in names(cells) if "," in name]


def test_only_values_are_repeatable_and_comma_lists() -> None:
    assert plan.parse_only(["a,b", " c ", "d,,", ""]) == ["a", "b", "c", "d"]
    assert plan.parse_only(None) == []


def test_no_pattern_selects_every_cell_in_plan_order() -> None:
    cells = plan.all_cells()
    assert plan.select(cells, []) == cells


def test_a_plain_pattern_is_a_substring_of_scenario_slash_case() -> None:
    chosen = plan.select(plan.all_cells(), ["after_target_commit"])
    assert names(chosen) == [
        "idempotent/after_target_commit",
        "reconcilable/after_target_commit",
        "transactional/after_target_commit",
        "unsafe/after_target_commit",
        "mcp-idempotent/after_target_commit",
        "mcp-reconcilable/after_target_commit",
        "mcp-unsafe/after_target_commit",
        "approval/approved then killed at after_target_commit",
    ]
    assert names(plan.select(plan.all_cells(), ["Unsafe/ZOMBIE"])) == [
        "unsafe/zombie worker"
    ]


def test_a_pattern_with_a_wildcard_is_a_glob_over_the_whole_name() -> None:
    chosen = plan.select(plan.all_cells(), ["reconcilable/*commit"])
    assert names(chosen) == [
        "reconcilable/before_reservation_commit",
        "reconcilable/after_reservation_commit",
        "reconcilable/after_target_commit",
        "reconcilable/before_receipt_commit",
        "reconcilable/after_receipt_commit",
    ]
    # A glob is anchored: without a leading * it does not match mid-name.
    with pytest.raises(ValueError, match="matches no cell"):
        plan.select(plan.all_cells(), ["after_*"])


def test_several_patterns_select_their_union_once_each() -> None:
    chosen = plan.select(
        plan.all_cells(), ["idempotent/after_target_commit", "idempotent/after_t*"]
    )
    # A whole cell name selects that cell, not the same kill behind the mcp adapter
    assert names(chosen) == ["idempotent/after_target_commit"]


def test_mcp_glob_selects_the_mcp_adapter_cells_only() -> None:
    chosen = plan.select(plan.all_cells(), ["mcp*"])
    assert names(chosen) == [
        f"mcp-{safety}/{failpoint}"
        for safety in ("idempotent", "reconcilable", "unsafe")
        for failpoint in ("after_target_commit", "before_receipt_commit")
    ]
    assert {cell.kind for cell in chosen} == {plan.MCP_KILL}
    assert [plan.safety_of(cell.scenario) for cell in chosen[::2]] == [
        "idempotent",
        "reconcilable",
        "unsafe",
    ]


def test_only_runtime_selects_one_cell_per_runtime() -> None:
    chosen = plan.select(plan.all_cells(), ["runtime"])
    assert names(chosen) == [
        f"runtime-{runtime}/killed after target commit"
        for runtime in ("dbos", "langgraph", "celery", "temporal")
    ]
    assert {cell.kind for cell in chosen} == {plan.RUNTIME_KILL}
    assert names(plan.select(plan.all_cells(), ["runtime-dbos"])) == [
        "runtime-dbos/killed after target commit"
    ]


def test_a_pattern_that_selects_nothing_is_named_in_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="matches no cell") as caught:
        plan.select(plan.all_cells(), ["idempotent", "idempotnt/after"])
    message = str(caught.value)
    assert message.startswith("--only 'idempotnt/after' matches no cell")
    assert "\n" not in message


def test_every_planned_kind_has_a_runner() -> None:
    from examples.crash_matrix.matrix import RUNNABLE

    assert {cell.kind for cell in plan.all_cells()} <= RUNNABLE


def test_a_kind_without_a_runner_is_refused_before_any_cell_runs() -> None:
    from examples.crash_matrix import matrix

    with pytest.raises(RuntimeError, match=r"no runner for planned cell kind\(s\)"):
        matrix._run_cells(
            None,  # type: ignore[arg-type]  # refused before the rig is touched
            [plan.CellId("frozen worker", "idempotent", "frozen worker")],
            "run",
            parallel=1,
            ledger=False,
            report=None,  # type: ignore[arg-type]
            between=lambda: None,
        )


def test_only_approval_selects_the_approval_cells_only() -> None:
    # Issue 24: approved then killed at every worker boundary, redelivered, denied,
    # expired, approved by several operators at once
    chosen = plan.select(plan.all_cells(), ["approval"])
    assert names(chosen) == [
        *(
            f"approval/approved then killed at {failpoint}"
            for failpoint in (
                "before_request_write",
                "after_target_commit",
                "before_receipt_commit",
                "after_receipt_commit",
            )
        ),
        "approval/approved with the submit redelivered 3x",
        "approval/denied",
        "approval/expired",
        "approval/concurrent approvals",
    ]
    assert {cell.kind for cell in chosen} == {plan.APPROVAL}
