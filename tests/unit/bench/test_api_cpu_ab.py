"""The API CPU A/B script's arguments and its arithmetic, from figures made up here."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.bench.api_cpu_ab import Arm, _line, _print_breakdown, parse_args

ROOT = Path(__file__).resolve().parents[3]


def test_an_arm_is_a_label_and_a_source_tree() -> None:
    args = parse_args(["--arm", f"here={ROOT}", "--rounds", "2"])
    assert [(arm.label, arm.root) for arm in args.arms] == [("here", ROOT)]
    assert args.rounds == 2


@pytest.mark.parametrize("spec", ["no-equals-sign", "x=/nonexistent/tree"])
def test_an_arm_that_is_not_a_source_tree_is_refused(spec: str) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--arm", spec])


def test_a_round_reads_rates_cpu_and_the_ratio() -> None:
    row = {"submit": 150.0, "submit_cpu": 5.0, "healthz": 300.0, "healthz_cpu": 3.0}
    line = _line({**row, "errors": 0})
    assert "submit  150.0/s (5.00 ms CPU)" in line
    assert "ratio 0.500x" in line


def test_the_breakdown_is_the_median_of_each_stage_difference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    arm = Arm("a", ROOT)
    for extra in (0.0, 0.2, 0.4):
        arm.rounds.append(
            {
                "healthz_cpu": 3.0,
                "no_key_cpu": 3.1,
                "bad_key_cpu": 4.0 + extra,
                "bad_tool_cpu": 4.5 + extra,
                "submit_cpu": 5.5 + extra,
            }
        )
    _print_breakdown([arm])
    out = capsys.readouterr().out
    assert "| key lookup: unknown key - malformed key | 1.10 (0.90 - 1.30) |" in out
    assert "| reservation and 202: submit - unknown tool | 1.00 (1.00 - 1.00) |" in out
