"""procrastinate's fetch keeps its fast plan whenever its table was last analysed.

The failure (issue 13, docs/benchmarks.md; upstream procrastinate#1242): when
``procrastinate_jobs`` is ANALYZEd while no job is queued, ``status`` gets the
statistics "every row is succeeded". The planner then expects one ``todo`` row and
one ``todo``/``doing`` row, and with one row on each side a parameterized index
lookup costs exactly what a plain scan costs, so it keeps the plain one: the lock
check of ``procrastinate_fetch_job_v2`` becomes a nested-loop anti-join that reads
every queued job for every candidate (10k queued: 10k rows removed by the join
filter per candidate). That plan stays until autovacuum happens to analyse the table
again with jobs queued, so a burst after an idle spell drains quadratically. An extra
index alone does not help (measured: the tie still goes to the plain scan), and a
planner setting on the function cannot break the tie: with nested loops off, every
fetch would hash every queued job instead.

What this migration does, from the broker's side, without touching procrastinate's
SQL:

1. It freezes the statistics of ``status`` at a distribution where queued and
   running jobs are a sizeable share of the table: it inserts placeholder rows (12%
   of them queued or running; as many as the rows already there, up to 200k, so the
   share stays at 6% or more on a table of up to 200k rows), analyses ``status``
   only, deletes the placeholders in the same transaction (no other session ever
   sees them; their triggers are off, so they write no event and send no NOTIFY),
   and sets the column's statistics target to 0 so no later ANALYZE replaces them.
   The planner then always expects queued jobs, and a per-candidate lookup by lock
   is the cheaper plan. The price: its status estimates no longer follow the
   table's real mix (most of procrastinate's other status filters use partial
   indexes anyway). The other columns keep live statistics, and the row count is
   live as ever.
2. It adds the index that lookup needs: ``lock`` over queued and running jobs (the
   anti-join's own condition). procrastinate's ``(id, lock)`` index cannot seek by
   lock; its ``(lock) WHERE doing`` index misses queued jobs.

Proved by tests/integration/test_fetch_plan.py (the plan shape) and measured by
examples/bench/fetch_plan.py (fetch time, stale vs fresh statistics, with and
without this migration). Reversing it gives ``status`` its live statistics back at
the next ANALYZE.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, transaction

#: The frozen share of each status, per 1000 rows. todo + doing is 12%: big enough
#: that "no queued job" is never the planner's belief, small enough that finished
#: jobs stay the bulk, as they are in a running broker.
PLACEHOLDER_SHARES = {
    "todo": 100,
    "doing": 20,
    "succeeded": 850,
    "failed": 20,
    "aborted": 5,
    "cancelled": 5,
}
INDEX = "effect_broker_jobs_active_lock_idx"


#: Placeholders are capped so the migration stays short on a big table: with more
#: finished rows than this, the frozen queued share is smaller but, multiplied by the
#: table's live row count, still far above the one row that picks the bad plan.
MAX_PLACEHOLDERS = 200_000


def freeze_status_statistics(apps: Any, schema_editor: Any) -> None:
    # One transaction of its own (the migration is not atomic, for the concurrent
    # index): the placeholders are deleted before anyone else can see them, and
    # the table's exclusive lock (DISABLE TRIGGER) lasts only this long.
    with (
        transaction.atomic(using=schema_editor.connection.alias),
        schema_editor.connection.cursor() as cur,
    ):
        cur.execute("SELECT count(*) FROM procrastinate_jobs")
        existing = int(cur.fetchone()[0])
        # As many placeholders as real rows (at least 1000): todo+doing then keep
        # at least 6% of the sample even if every real row is finished.
        placeholders = min(max(1000, existing), MAX_PLACEHOLDERS)
        cur.execute("ALTER TABLE procrastinate_jobs DISABLE TRIGGER USER")
        cur.execute(
            "ALTER TABLE procrastinate_jobs ALTER COLUMN status SET STATISTICS 100"
        )
        for status, share in PLACEHOLDER_SHARES.items():
            cur.execute(
                "INSERT INTO procrastinate_jobs (queue_name, task_name, status) "
                "SELECT 'effect_broker.placeholder', 'effect_broker.placeholder', "
                "%s::procrastinate_job_status FROM generate_series(1, %s)",
                [status, share * placeholders // 1000],
            )
        cur.execute("ANALYZE procrastinate_jobs (status)")
        cur.execute(
            "DELETE FROM procrastinate_jobs "
            "WHERE queue_name = 'effect_broker.placeholder'"
        )
        cur.execute("ALTER TABLE procrastinate_jobs ALTER COLUMN status SET STATISTICS 0")
        cur.execute("ALTER TABLE procrastinate_jobs ENABLE TRIGGER USER")


def thaw_status_statistics(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cur:
        cur.execute(
            "ALTER TABLE procrastinate_jobs ALTER COLUMN status SET STATISTICS -1"
        )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("effect_broker", "0012_awaiting_index"),
        ("procrastinate", "0041_post_retry_failed_job"),
    ]

    operations = [
        migrations.RunPython(freeze_status_statistics, thaw_status_statistics),
        migrations.RunSQL(
            # CONCURRENTLY: defers keep going while it builds on a big table.
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} "
            "ON procrastinate_jobs (lock) WHERE status IN ('todo', 'doing')",
            f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}",
        ),
    ]
