"""procrastinate's fetch with 10k queued jobs, after a stale and after a fresh ANALYZE.

The stale case is the one issue 13 found: ``procrastinate_jobs`` analysed while no
job was queued, then a burst. Each scenario runs in one transaction that is rolled
back, so the table is left as it was: it queues jobs shaped like the broker's (one
``effect:<id>`` lock each, on the dispatch queue), analyses before or after, and
times ``procrastinate_fetch_job_v2`` itself (each call rolled back to a savepoint, so
every call sees the same 10k). "procrastinate alone" undoes migration
0013_fetch_plan_statistics inside the transaction (live ``status`` statistics, no
lock index), which is what the broker ran before.

Hold an exclusive lock on the table while it runs: run it with no worker.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import psycopg

from effect_broker.workers.supervision import BROKER_QUEUES

QUEUED = 10_000
#: Finished jobs in the table when it is analysed, as in a broker that has run a while
#: (and so that an empty-queue ANALYZE has rows to sample).
FINISHED = 2_000
#: The frozen-statistics index of migration 0013.
LOCK_INDEX = "effect_broker_jobs_active_lock_idx"
SCENARIOS = ("stale_alone", "fresh_alone", "stale_broker", "fresh_broker")


def candidate_query(cur: psycopg.Cursor[Any]) -> str:
    """The lock-checking SELECT inside procrastinate's own fetch function, read from
    the database (so it cannot drift from what workers run), for the broker's
    queues."""
    cur.execute("SELECT prosrc FROM pg_proc WHERE proname = 'procrastinate_fetch_job_v2'")
    row = cur.fetchone()
    assert row is not None, "procrastinate_fetch_job_v2 is missing: migrate first"
    body = str(row[0])
    start = body.index("SELECT jobs.*")
    end = body.index("SKIP LOCKED", start) + len("SKIP LOCKED")
    queues = "ARRAY[{}]::varchar[]".format(", ".join(f"'{q}'" for q in BROKER_QUEUES))
    return body[start:end].replace("target_queue_names", queues)


def undo_broker_fix(cur: psycopg.Cursor[Any]) -> None:
    """Inside the caller's transaction: procrastinate's table as it is without
    migration 0013 (live statistics on ``status`` at the next ANALYZE)."""
    cur.execute("ALTER TABLE procrastinate_jobs ALTER COLUMN status SET STATISTICS -1")
    cur.execute(f"DROP INDEX IF EXISTS {LOCK_INDEX}")


def queue_jobs(cur: psycopg.Cursor[Any], count: int = QUEUED) -> None:
    """``count`` dispatch jobs locked per effect, as the broker queues them."""
    cur.execute(
        "INSERT INTO procrastinate_jobs "
        "(queue_name, task_name, lock, queueing_lock, args) "
        "SELECT 'dispatch', 'effect_broker.dispatch_effect', 'effect:' || u, "
        "'dispatch:' || u, jsonb_build_object('effect_id', u) "
        "FROM (SELECT gen_random_uuid()::text AS u FROM generate_series(1, %s)) s",
        [count],
    )


def prepare(cur: psycopg.Cursor[Any], scenario: str) -> None:
    """Set up ``scenario`` in the caller's transaction: an empty queue (its queued
    jobs deleted by this transaction, so ANALYZE does not count them), the
    statistics stale (analysed before queueing) or fresh (after), 10k queued."""
    cur.execute("DELETE FROM procrastinate_jobs WHERE status = 'todo'")
    cur.execute(
        "INSERT INTO procrastinate_jobs (queue_name, task_name, lock, args, status) "
        "SELECT 'dispatch', 'effect_broker.dispatch_effect', "
        "'effect:' || gen_random_uuid(), '{}', 'succeeded' "
        "FROM generate_series(1, %s)",
        [FINISHED],
    )
    if scenario.endswith("_alone"):
        undo_broker_fix(cur)
    if scenario.startswith("stale"):
        cur.execute("ANALYZE procrastinate_jobs")
    queue_jobs(cur)
    if scenario.startswith("fresh"):
        cur.execute("ANALYZE procrastinate_jobs")


def explain(cur: psycopg.Cursor[Any]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE) of the fetch's candidate query, as JSON."""
    cur.execute("SAVEPOINT explain")
    cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + candidate_query(cur))
    row = cur.fetchone()
    cur.execute("ROLLBACK TO SAVEPOINT explain")
    assert row is not None
    plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return dict(plan[0]["Plan"])


def rows_removed(node: dict[str, Any]) -> int:
    """Rows every node of the plan read and threw away (filters and join filters,
    over all loops)."""
    loops = int(node.get("Actual Loops", 1))
    here = sum(
        int(node.get(key, 0)) * loops
        for key in ("Rows Removed by Filter", "Rows Removed by Join Filter")
    )
    return here + sum(rows_removed(child) for child in node.get("Plans", []))


def time_fetch(cur: psycopg.Cursor[Any], calls: int) -> float:
    """Median milliseconds of one ``procrastinate_fetch_job_v2`` call (the first,
    which plans, is left out)."""
    samples = []
    for _ in range(calls + 1):
        cur.execute("SAVEPOINT one_fetch")
        started = time.perf_counter()
        cur.execute(
            "SELECT id FROM procrastinate_fetch_job_v2(%s::varchar[], NULL)",
            [list(BROKER_QUEUES)],
        )
        row = cur.fetchone()
        samples.append((time.perf_counter() - started) * 1000)
        cur.execute("ROLLBACK TO SAVEPOINT one_fetch")
        if row is None or row[0] is None:
            raise RuntimeError("the fetch found no job")
    return statistics.median(samples[1:])


def measure(database_url: str, *, calls: int = 20) -> dict[str, dict[str, float]]:
    """Each scenario in its own connection and rolled-back transaction: fetch ms
    (median) and rows the candidate query threw away."""
    found: dict[str, dict[str, float]] = {}
    for scenario in SCENARIOS:
        with psycopg.connect(database_url) as conn, conn.cursor() as cur:
            prepare(cur, scenario)
            found[scenario] = {
                "fetch_ms": time_fetch(cur, calls),
                "rows_removed": float(rows_removed(explain(cur))),
            }
            conn.rollback()
    return found


#: The target: a fetch after an empty-queue ANALYZE costs at most this many times a
#: fetch after a fresh one (procrastinate alone: ~15-40x here).
STALE_MAX_RATIO = 2.0


def target_row(found: dict[str, dict[str, float]]) -> tuple[str, str, str, bool, str]:
    """(name, measured, limit, met, detail) of the bench's Targets row."""
    ms = {scenario: found[scenario]["fetch_ms"] for scenario in SCENARIOS}
    value = ms["stale_broker"] / ms["fresh_broker"]
    detail = (
        f"broker: stale {ms['stale_broker']:.2f} ms, fresh {ms['fresh_broker']:.2f} ms; "
        f"procrastinate alone: stale {ms['stale_alone']:.2f} ms, "
        f"fresh {ms['fresh_alone']:.2f} ms"
    )
    return (
        f"procrastinate fetch, {QUEUED:,} queued, empty-queue ANALYZE vs fresh",
        f"{value:.2f}x",
        f"≤ {STALE_MAX_RATIO:g}x",
        value <= STALE_MAX_RATIO,
        detail,
    )
