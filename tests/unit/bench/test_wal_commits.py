"""The arithmetic of the commits-and-WAL phase (issue 13): what is subtracted from a
drain window, how an effect's commits split by component, and pg_waldump's table."""

from __future__ import annotations

import pytest

from examples.bench.report import BenchResult, evaluate
from examples.bench.wal_commits import Counters, WalCommits, Window
from examples.bench.wal_meter import _analysed, _changed, parse_waldump_stats


def window(name: str, items: int, seconds: float, commits: int, wal: int) -> Window:
    return Window(name, items, seconds, Counters(commits, 0, wal, 0, 0), own_commits=0)


def measured() -> WalCommits:
    """Idle worker: 2 commits/s and 100 WAL B/s, 30 commits / 3,000 B to start and
    stop. Jobs: 3 commits and 1,000 B each; effects: 1 to submit, 7 to dispatch."""
    result = WalCommits(10, 10.0, {}, {"effect_intents": 6})
    for w in (
        window("idle_short", 0, 1.0, 30 + 2, 3_000 + 100),
        window("idle_long", 0, 11.0, 30 + 22, 3_000 + 1_100),
        window("defer", 10, 0.1, 10, 5_000),
        window("jobs", 10, 2.0, 30 + 4 + 30, 3_000 + 200 + 10_000),
        window("submit", 10, 0.2, 10, 30_000),
        window("dispatch", 10, 5.0, 30 + 10 + 70, 3_000 + 500 + 40_000),
    ):
        result.windows[w.name] = w
    return result


def test_the_idle_windows_give_background_per_second_and_start_stop_cost() -> None:
    result = measured()
    assert result.background_per_second() == pytest.approx(2.0)
    assert result.lifecycle() == pytest.approx(30.0)
    assert result.background_per_second("wal_bytes") == pytest.approx(100.0)
    assert result.lifecycle("wal_bytes") == pytest.approx(3_000.0)


def test_an_effects_commits_split_into_submit_fetch_finish_claim_outcome_other() -> None:
    parts = dict(measured().components())
    assert list(parts.values()) == pytest.approx([1.0, 3.0, 4.0, 1.0])
    assert measured().per_effect() == pytest.approx(9.0)
    assert measured().per_job() == pytest.approx(1.0 + 3.0 + 0.4)


def test_commits_this_process_made_to_measure_are_not_counted() -> None:
    w = Window("submit", 10, 0.2, Counters(14, 0, 0, 0, 0), own_commits=4)
    assert w.commits == 10


def test_the_target_rows_reach_the_bench_targets_table() -> None:
    result = BenchResult("now", {}, {}, "here", {}, wal_commits=measured())
    rows = {t.name: t for t in evaluate(result)}
    commits = rows["committed transactions per effect, by component"]
    # issue 25: at most 5 (issue 13's limit was 8)
    assert (commits.measured, commits.limit, commits.met) == ("9.00", "≤ 5", False)
    wal = rows["WAL bytes per effect vs bare job"]
    assert wal.measured.startswith(f"{(3_000 + 4_000 + 50) / (500 + 1_000 + 20):.2f}x")
    assert wal.met is True


def test_without_the_phase_the_commit_target_shows_as_not_measured() -> None:
    rows = {t.name: t for t in evaluate(BenchResult("now", {}, {}, "here", {}))}
    assert rows["committed transactions per effect"].met is None


# pg_waldump 18's layout, its runs of spaces shortened.
WALDUMP = """\
WAL statistics between 0/2000040 and 0/2087F58:
Type          N      (%)   Record size      (%)   FPI size      (%)   Combined size  (%)
----          -      ---   -----------      ---   --------      ---   -------------  ---
XLOG         14 (  0.25)           797 (  0.16)      41488 (100.00)        42285 (  7.72)
Transaction 357 (  6.45)         15777 (  3.11)          0 (  0.00)        15777 (  2.88)
CLOG          0 (  0.00)             0 (  0.00)          0 (  0.00)            0 (  0.00)
Heap       1804 ( 32.60)        238759 ( 47.13)          0 (  0.00)       238759 ( 43.57)
                --------              --------           --------         --------
Total      5534                 506548 [92.43%]      41488 [7.57%]        548036 [100%]
"""


def test_waldump_stats_parse_per_resource_manager_without_empty_ones_or_total() -> None:
    assert parse_waldump_stats(WALDUMP) == {
        "XLOG": (14, 797, 41488),
        "Transaction": (357, 15777, 0),
        "Heap": (1804, 238759, 0),
    }


def test_a_window_keeps_only_the_tables_whose_rows_moved() -> None:
    before = {"effect_intents": (5, 2, 0, 0), "tenants": (1, 0, 0, 0)}
    after = {"effect_intents": (7, 6, 1, 0), "tenants": (1, 0, 0, 0), "new": (0, 0, 0, 1)}
    assert _changed(before, after) == {
        "effect_intents": (2, 4, 1, 0),
        "new": (0, 0, 0, 1),
    }


def test_a_window_that_wrote_pg_statistic_met_an_autoanalyze() -> None:
    quiet = window("idle_long", 0, 11.0, 20, 600)
    quiet.rows = {"procrastinate_jobs": (1, 3, 0, 0)}
    analysed = window("idle_long", 0, 11.0, 25, 60_000)
    analysed.rows = {"pg_statistic": (27, 115, 33, 0)}
    assert (_analysed(quiet), _analysed(analysed)) == (False, True)
