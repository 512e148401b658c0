"""The parallel-submit row of the bench's Targets table, from figures made up here."""

from __future__ import annotations

import math

from examples.bench.parallel_submit import ParallelSubmits
from examples.bench.report import BenchResult, evaluate

NAME = "submits/s with 2 client processes vs 1"


def _result(parallel: ParallelSubmits | None) -> BenchResult:
    machine = {"nproc": 2, "cpu": "x", "ram_gb": 1, "os": "x", "python": "3"}
    return BenchResult("now", machine, {}, "here", {}, parallel=parallel)


def _row(parallel: ParallelSubmits | None):  # type: ignore[no-untyped-def]
    return next(t for t in evaluate(_result(parallel)) if t.name == NAME)


def test_the_ratio_is_the_median_of_2_over_the_median_of_1() -> None:
    # Issue 25 restates issue 13's "8 processes >= 3x one" for 2 vCPUs.
    figures = ParallelSubmits(2.0, {1: [100.0, 120.0, 80.0], 2: [160.0, 175.0, 190.0]})
    row = _row(figures)
    assert (row.measured, row.limit, row.met) == ("1.75x", "≥ 1.7x", True)
    assert row.detail.startswith("1 process 100/s, 2 processes 175/s; 3 rounds")


def test_below_1_7x_is_missed() -> None:
    assert _row(ParallelSubmits(2.0, {1: [100.0], 2: [169.0]})).met is False


def test_not_measured_when_a_side_is_missing() -> None:
    assert math.isnan(ParallelSubmits(2.0, {1: [100.0]}).ratio())
    assert _row(ParallelSubmits(2.0, {1: [100.0]})).met is None
    assert _row(None).met is None
