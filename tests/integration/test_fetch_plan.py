"""procrastinate's fetch keeps a per-candidate lock lookup after an empty-queue
ANALYZE (issue 13; migration 0013_fetch_plan_statistics; upstream #1242).

The plan's shape is asserted, never its time (examples/bench/fetch_plan.py prints
the times): with 10k queued jobs, the stale plan procrastinate gets on its own throws
away every queued job per candidate; the broker's must not.
"""

from __future__ import annotations

import pytest
from django.db import connection

from examples.bench.fetch_plan import QUEUED, explain, prepare, rows_removed


def _removed_after(scenario: str) -> int:
    with connection.cursor() as cur:
        cur.execute("SAVEPOINT scenario")
        prepare(cur.cursor, scenario)
        removed = rows_removed(explain(cur.cursor))
        cur.execute("ROLLBACK TO SAVEPOINT scenario")
    return removed


@pytest.mark.django_db
def test_an_empty_queue_analyze_no_longer_makes_each_fetch_read_every_queued_job() -> (
    None
):
    # Given procrastinate alone (live statistics on status, no lock index): analysed
    # with no job queued, then 10k queued -> the lock check reads all of them
    assert _removed_after("stale_alone") >= QUEUED
    # When the broker's migration is in place, the same sequence
    removed = _removed_after("stale_broker")
    # Then the candidate's lock is looked up, not scanned for: a handful of rows at
    # most, as after a fresh ANALYZE
    assert removed <= 10
    assert _removed_after("fresh_broker") <= 10


@pytest.mark.django_db
def test_the_status_statistics_stay_frozen_and_the_lock_index_exists() -> None:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT attstattarget FROM pg_attribute "
            "WHERE attrelid = 'procrastinate_jobs'::regclass AND attname = 'status'"
        )
        assert cur.fetchone() == (0,)
        cur.execute(
            "SELECT most_common_vals::text::text[] FROM pg_stats "
            "WHERE tablename = 'procrastinate_jobs' AND attname = 'status'"
        )
        row = cur.fetchone()
        assert row is not None
        assert {"todo", "doing"} <= set(row[0])
        cur.execute(
            "SELECT indexdef FROM pg_indexes "
            "WHERE indexname = 'effect_broker_jobs_active_lock_idx'"
        )
        (definition,) = cur.fetchone()
        assert "(lock)" in definition
        assert "'todo'" in definition
        assert "'doing'" in definition
