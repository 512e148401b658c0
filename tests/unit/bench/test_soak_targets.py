"""The soak's targets read what they claim to: a growing job table, a lost effect, a
duplicate at the target or a slower last window each turn a target into a miss."""

from __future__ import annotations

import math

import pytest

from examples.bench.soak_options import DEFAULT_EFFECTS, soak_from_cli
from examples.bench.soak_report import SoakResult, SoakWindow, soak_table, soak_targets

MS = 1e-3


def window(index: int, *, submit: float, claim: float, jobs: int) -> SoakWindow:
    return SoakWindow(
        index=index,
        effects=10_000,
        submitted_at=100.0 * (index + 1),
        submit_median=submit,
        submit_p99=submit * 3,
        claim_median=claim,
        claim_p99=claim * 3,
        receipt_median=claim * 2,
        receipt_p99=claim * 6,
        kills=index * 5,
        tables={
            "effect_intents": (10_000 * (index + 1), 1 << 20),
            "effect_events": (30_000 * (index + 1), 1 << 20),
            "procrastinate_jobs": (jobs, 1 << 20),
            "procrastinate_events": (jobs * 3, 1 << 20),
        },
        rss_mb={"steady": (100.0, 60.0), "restarted": (99.0, 5.0)},
    )


def soak(*windows: SoakWindow, lost: int = 0, target_rows: int = 20_000) -> SoakResult:
    result = SoakResult(
        options={"window": 10_000, "rate": 80.0, "kill_seconds": 20.0, "seed": 13},
        contract="charge_idempotent",
        windows=list(windows),
        submitted=20_000,
        statuses={"succeeded": 20_000 - lost, "dispatching": lost},
        lost=lost,
        target_rows=target_rows,
        target_keys=min(target_rows, 20_000 - lost),
    )
    result.jobs_end = windows[-1].tables["procrastinate_jobs"][0] if windows else 0
    return result


def met(result: SoakResult) -> list[bool | None]:
    """Submit ratio, claim ratio, job tables bounded, nothing lost or duplicated."""
    return [ok for _, _, _, ok, _ in soak_targets(result)]


def test_a_flat_run_meets_every_target() -> None:
    flat = soak(
        window(0, submit=5 * MS, claim=20 * MS, jobs=500),
        window(1, submit=5.5 * MS, claim=21 * MS, jobs=520),
    )
    assert met(flat) == [True, True, True, True]
    assert "; 0 lost (no final receipt)" in soak_table(flat)


def test_growth_loss_and_duplicates_are_misses() -> None:
    grown = soak(
        window(0, submit=5 * MS, claim=20 * MS, jobs=10_000),
        window(1, submit=7 * MS, claim=30 * MS, jobs=20_000),
    )
    assert met(grown)[:3] == [False, False, False]
    lost = soak(
        window(0, submit=5 * MS, claim=20 * MS, jobs=500),
        window(1, submit=5 * MS, claim=20 * MS, jobs=500),
        lost=1,
    )
    assert met(lost)[3] is False
    duplicated = soak(
        window(0, submit=5 * MS, claim=20 * MS, jobs=500),
        window(1, submit=5 * MS, claim=20 * MS, jobs=500),
        target_rows=20_001,
    )
    assert met(duplicated)[3] is False


def test_job_tables_near_empty_throughout_are_bounded() -> None:
    # 0 -> 3 rows over 100k effects is flat, not "3x" (a run of 2026-12-04).
    nearly_empty = soak(
        window(0, submit=5 * MS, claim=20 * MS, jobs=0),
        window(1, submit=5 * MS, claim=20 * MS, jobs=1),
    )
    assert met(nearly_empty)[2] is True


def test_one_window_measures_no_ratio() -> None:
    single = soak(window(0, submit=5 * MS, claim=20 * MS, jobs=500))
    rows = soak_targets(single)
    assert [ok for *_, ok, _ in rows][:3] == [None, None, None]
    assert rows[0][1] == "-"
    assert not math.isnan(single.windows[0].submit_median)


def test_soak_options() -> None:
    assert soak_from_cli({}) is None
    opts = soak_from_cli({"soak": DEFAULT_EFFECTS})
    assert opts is not None
    assert (opts.effects, opts.window, opts.rate) == (100_000, 10_000, 80.0)
    small = soak_from_cli({"soak": 300, "soak_kill_seconds": 0})
    assert small is not None
    assert (small.window, small.kill_seconds) == (30, 0.0)
    with pytest.raises(Exception, match="--soak must be between"):
        soak_from_cli({"soak": 5})


def test_with_soak_runs_every_phase_then_the_soak() -> None:
    from examples.bench.options import from_cli

    alone = from_cli({"soak": 300})
    assert alone.soak_only
    assert alone.soak is not None
    both = from_cli({"with_soak": DEFAULT_EFFECTS})
    assert both.with_soak
    assert not both.soak_only
    assert both.soak is not None
    assert both.soak.effects == DEFAULT_EFFECTS
    assert not from_cli({}).soak_only
    with pytest.raises(Exception, match="--with-soak must be between"):
        soak_from_cli({"with_soak": 5})
    with pytest.raises(Exception, match="exclude each other"):
        soak_from_cli({"soak": 300, "with_soak": 300})


def test_a_run_with_a_soak_measures_its_rows_in_the_same_table() -> None:
    from examples.bench.report import BenchResult, evaluate

    def result(*, with_soak: bool) -> BenchResult:
        flat = soak(
            window(0, submit=5 * MS, claim=20 * MS, jobs=50),
            window(1, submit=5 * MS, claim=20 * MS, jobs=50),
        )
        return BenchResult(
            started_at="",
            machine={},
            server={},
            where="",
            options={"with_soak": with_soak},
            soak=flat,
        )

    combined = [t.name for t in evaluate(result(with_soak=True))]
    alone = [t.name for t in evaluate(result(with_soak=False))]
    assert len(alone) == 4  # --soak: the soak's rows only
    assert combined[-4:] == alone  # --with-soak: every row, the soak's measured
    assert len(combined) > len(alone)
    assert all(
        t.met is not None
        for t in evaluate(result(with_soak=True))
        if t.name.startswith("soak")
    )
