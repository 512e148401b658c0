"""End to end through real worker processes: the broker (submit → dispatch → receipt)
next to a bare procrastinate job (defer → no-op → done), and reconciliation after a
lost response.

Times come from the database, stamped where the work happens (an effect's
``created_at`` and its receipt's ``created_at``; a job's ``deferred`` and
``succeeded`` events), so polling for completion adds nothing to a figure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from examples.bench.broker_cases import BrokerCases
from examples.bench.noop_task import noop
from examples.crash_matrix.contracts import TOOLS
from examples.crash_matrix.target_client import TargetProcess

POLL_SECONDS = 0.005


@dataclass(frozen=True)
class Burst:
    """What one burst of N items measured."""

    #: Items per second between the 10th and the 90th percentile completion: the
    #: steady state, without the ramp-up and without the tail, where an idle worker
    #: may wait for its next poll (a job scheduled for later; procrastinate's own
    #: worker also misses a NOTIFY that arrives while it fetches, which the broker's
    #: worker does not: effect_broker.workers.wakeups).
    steady_rate: float
    #: Items per second from the first submit to the last completion.
    overall_rate: float
    latencies: list[float]

    @classmethod
    def of(cls, started: datetime, rows: list[tuple[datetime, datetime]]) -> Burst:
        """From (created, done) database timestamps of every item."""
        n = len(rows)
        done = sorted(finished for _, finished in rows)
        overall = n / max((done[-1] - started).total_seconds(), 1e-9)
        low, high = n // 10, n - 1 - n // 10
        span = (done[high] - done[low]).total_seconds()
        steady = (high - low) / span if n >= 20 and span > 0 else overall
        return cls(steady, overall, [(f - m).total_seconds() for m, f in rows])


class Pipeline:
    """Throughput and per-item latency of work that worker processes carry out."""

    def __init__(self, database_url: str, cases: BrokerCases) -> None:
        self._db = psycopg.connect(database_url, autocommit=True)
        self.cases = cases
        self._serial = 0

    def close(self) -> None:
        """Close the polling connection."""
        self._db.close()

    def drain_stale_jobs(self) -> int:
        """Delete queued jobs left by in-process cases (their effects were handled
        inline or never need a worker), so workers start on an empty queue; then
        vacuum what earlier cases wrote, so autovacuum does not wake up mid-burst on
        a 2-core machine."""
        cur = self._db.execute("DELETE FROM procrastinate_jobs WHERE status = 'todo'")
        dropped = cur.rowcount
        self._db.execute(
            "VACUUM (ANALYZE) procrastinate_jobs, procrastinate_events, "
            "effect_intents, effect_events, effect_attempts, effect_receipts"
        )
        return dropped

    def _wait(self, query: str, params: Any, want: int, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            row = self._db.execute(query, params).fetchone()
            if row is not None and int(row[0]) >= want:
                return
            if time.monotonic() > deadline:
                got = row[0] if row else 0
                raise TimeoutError(
                    f"only {got} of {want} items finished after {timeout:.0f}s "
                    "(are the workers running? see their logs)"
                )
            time.sleep(POLL_SECONDS)

    # --- the broker -------------------------------------------------------------------

    def _receipts(self, ids: list[str]) -> list[tuple[datetime, datetime]]:
        return self._db.execute(
            "SELECT i.created_at, r.created_at FROM effect_intents i "
            "JOIN effect_receipts r ON r.effect_id = i.id WHERE i.id = ANY(%s::uuid[])",
            [ids],
        ).fetchall()

    def broker_burst(self, n: int, *, timeout: float = 300) -> Burst:
        """Submit ``n`` new effects back to back while workers drain them; return
        (effects per second from first submit to last receipt, per-effect latencies)."""
        self._serial += 1
        started = datetime.now(UTC)
        ids = [
            self.cases.submit_new_series(f"e2e{self._serial}", i).effect_id
            for i in range(n)
        ]
        self._wait(
            "SELECT count(*) FROM effect_receipts WHERE effect_id = ANY(%s::uuid[])",
            [ids],
            n,
            timeout=timeout,
        )
        rows = self._receipts(ids)
        return Burst.of(started, rows)

    def broker_one(self, i: int, *, timeout: float = 60) -> float:
        """Submit one effect and wait for its receipt; its latency in seconds."""
        record = self.cases.submit_new_series("e2e-seq", i)
        ids = [record.effect_id]
        self._wait(
            "SELECT count(*) FROM effect_receipts WHERE effect_id = ANY(%s::uuid[])",
            [ids],
            1,
            timeout=timeout,
        )
        made, done = self._receipts(ids)[0]
        return (done - made).total_seconds()

    # --- bare procrastinate -----------------------------------------------------------

    def _job_times(self, ids: list[int]) -> list[tuple[datetime, datetime]]:
        return self._db.execute(
            "SELECT min(at) FILTER (WHERE type = 'deferred'), "
            "max(at) FILTER (WHERE type = 'succeeded') "
            "FROM procrastinate_events WHERE job_id = ANY(%s) GROUP BY job_id",
            [ids],
        ).fetchall()

    def _defer(self, count: int) -> list[int]:
        self._serial += 1
        base = self._serial * 1_000_000
        return [int(noop.defer(n=base + i)) for i in range(count)]

    def jobs_burst(self, n: int, *, timeout: float = 300) -> Burst:
        """Defer ``n`` no-op jobs back to back while workers drain them; return
        (jobs per second from first defer to last finish, per-job latencies)."""
        started = datetime.now(UTC)
        ids = self._defer(n)
        self._wait(
            "SELECT count(*) FROM procrastinate_jobs "
            "WHERE id = ANY(%s) AND status = 'succeeded'",
            [ids],
            n,
            timeout=timeout,
        )
        rows = self._job_times(ids)
        return Burst.of(started, rows)

    def job_one(self, *, timeout: float = 60) -> float:
        """Defer one no-op job and wait for it; its latency in seconds."""
        ids = self._defer(1)
        self._wait(
            "SELECT count(*) FROM procrastinate_jobs "
            "WHERE id = ANY(%s) AND status = 'succeeded'",
            [ids],
            1,
            timeout=timeout,
        )
        made, done = self._job_times(ids)[0]
        return (done - made).total_seconds()

    # --- reconciliation ---------------------------------------------------------------

    def reconcile_one(
        self, target: TargetProcess, safety: str, i: int, *, timeout: float = 60
    ) -> float:
        """Lose the response of one charge (the target commits, then drops the
        connection) and wait for the broker to settle it; seconds from the
        ``outcome_unknown`` event to the receipt."""
        target.inject("drop_connection_after_commit")
        record = self.cases.submit_tool(TOOLS[safety], f"lost-{safety}", i)
        ids = [record.effect_id]
        self._wait(
            "SELECT count(*) FROM effect_receipts WHERE effect_id = ANY(%s::uuid[])",
            [ids],
            1,
            timeout=timeout,
        )
        row = self._db.execute(
            "SELECT e.occurred_at, r.created_at FROM effect_events e "
            "JOIN effect_receipts r ON r.effect_id = e.effect_id "
            "WHERE e.effect_id = %s AND e.event_type = 'outcome_unknown' "
            "ORDER BY e.sequence LIMIT 1",
            [record.effect_id],
        ).fetchone()
        if row is None:
            raise RuntimeError(
                f"the {safety} charge succeeded without a lost response "
                "(the target's fault did not fire)"
            )
        lost, settled = row
        return float((settled - lost).total_seconds())
