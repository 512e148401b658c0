"""CPU per item of a drain: one worker works off N queued effects, then N queued bare
no-op jobs; the worker's and the PostgreSQL server's CPU is read from ``/proc`` around
each drain (issue 13: "the dispatch path profiled down to what it must do").

On a machine where workers, PostgreSQL and the submitter share two vCPUs, throughput
is CPU per item, so this is the figure the throughput ratio follows, without the noise
of scheduling. How the items are queued and not counted: the worker is frozen
(SIGSTOP) while they are submitted or deferred, the counters are read, then it is
thawed and drains them. PostgreSQL's figure is the whole server's process tree
(``http_servers.process_tree_cpu``), background writers included; whatever else the
server does meanwhile (autovacuum) lands in it too, which is why the run vacuums first.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from examples.bench.environment import Services, running_workers
from examples.bench.http_servers import postmaster_pid, process_tree_cpu
from examples.bench.noop_task import noop
from examples.bench.pipeline import Pipeline
from examples.bench.report import BenchResult
from examples.crash_matrix.workers import WorkerProcess

Say = Callable[[str], None]

#: Keys of ``BenchResult.cpu_per_item`` (milliseconds of CPU per item).
EFFECT_WORKER, EFFECT_PG = "effect_worker_ms", "effect_postgres_ms"
JOB_WORKER, JOB_PG = "job_worker_ms", "job_postgres_ms"
#: Items of each kind drained to warm the worker up, unmeasured.
WARM_ITEMS = 50
#: Series of this process's drains: each drain submits new keys and new job args.
_SERIES = itertools.count(1)


@dataclass(frozen=True)
class Drain:
    """CPU of one drain of ``items`` queued items, in seconds."""

    items: int
    worker: float
    postgres: float

    def per_item_ms(self) -> tuple[float, float]:
        """(worker, PostgreSQL) milliseconds of CPU per item."""
        return self.worker / self.items * 1e3, self.postgres / self.items * 1e3


def _wait(db: psycopg.Connection, query: str, ids: list, want: int) -> None:
    deadline = time.monotonic() + 300
    while True:
        row = db.execute(query, [ids]).fetchone()
        if row is not None and int(row[0]) >= want:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {row[0] if row else 0} of {want} items finished")
        time.sleep(0.02)


def _drain(
    worker_pid: int,
    pg_pid: int,
    db: psycopg.Connection,
    queue: Callable[[], list],
    done_query: str,
) -> Drain:
    """Queue items while the worker is frozen, then time its CPU while it drains."""
    os.kill(worker_pid, signal.SIGSTOP)
    try:
        ids = queue()
        # Statistics with the items queued: analysed on an empty queue, procrastinate's
        # fetch plans an anti-join over every queued job and the drain turns quadratic
        # (docs/benchmarks.md, "Found and not changed"), which would swamp both figures.
        db.execute("ANALYZE procrastinate_jobs")
        worker_before = process_tree_cpu(worker_pid)
        pg_before = process_tree_cpu(pg_pid)
    finally:
        os.kill(worker_pid, signal.SIGCONT)
    _wait(db, done_query, ids, len(ids))
    return Drain(
        len(ids),
        process_tree_cpu(worker_pid) - worker_before,
        process_tree_cpu(pg_pid) - pg_before,
    )


def dispatch_cpu(
    result: BenchResult,
    items: int,
    services: Services,
    pipeline: Pipeline,
    say: Say,
    worker: WorkerProcess | None = None,
) -> None:
    """Fill ``result.cpu_per_item`` from one worker's drains of ``items`` effects and
    ``items`` bare jobs; print the figures. ``worker``: one already running (the
    1-worker pipeline's; a start saved), else one is started."""
    pg_pid = postmaster_pid(services.database_url)
    if pg_pid is None:
        result.notes.append("CPU per item: PostgreSQL runs elsewhere; not measured")
        return

    def effects(count: int = items) -> list:
        series = f"cpu{next(_SERIES)}"
        return [
            pipeline.cases.submit_new_series(series, i).effect_id for i in range(count)
        ]

    def jobs(count: int = items) -> list:
        base = (900 + next(_SERIES)) * 1_000_000
        return [int(noop.defer(n=base + i)) for i in range(count)]

    receipts = "SELECT count(*) FROM effect_receipts WHERE effect_id = ANY(%s::uuid[])"
    finished = (
        "SELECT count(*) FROM procrastinate_jobs "
        "WHERE id = ANY(%s) AND status = 'succeeded'"
    )
    pipeline.drain_stale_jobs()
    with (
        psycopg.connect(services.database_url, autocommit=True) as db,
        contextlib.ExitStack() as stack,
    ):
        if worker is None:
            (worker,) = stack.enter_context(running_workers(services, 1))
        pid = worker.pid
        # Warm the worker (imports, first connection, contracts, each statement's
        # plan) outside the figures: a few items of each do it.
        warm = min(items, WARM_ITEMS)
        _drain(pid, pg_pid, db, lambda: effects(warm), receipts)
        _drain(pid, pg_pid, db, lambda: jobs(warm), finished)
        effect = _drain(pid, pg_pid, db, effects, receipts)
        job = _drain(pid, pg_pid, db, jobs, finished)
    cpu = result.cpu_per_item
    cpu[EFFECT_WORKER], cpu[EFFECT_PG] = effect.per_item_ms()
    cpu[JOB_WORKER], cpu[JOB_PG] = job.per_item_ms()
    result.profiles[f"CPU per item, 1 worker draining {items} queued items (ms)"] = [
        ("broker effect: worker process", cpu[EFFECT_WORKER]),
        ("broker effect: PostgreSQL server", cpu[EFFECT_PG]),
        ("bare no-op job: worker process", cpu[JOB_WORKER]),
        ("bare no-op job: PostgreSQL server", cpu[JOB_PG]),
    ]
    say(
        f"      CPU per item: effect {cpu[EFFECT_WORKER]:.2f} ms worker + "
        f"{cpu[EFFECT_PG]:.2f} ms PostgreSQL; bare job {cpu[JOB_WORKER]:.2f} + "
        f"{cpu[JOB_PG]:.2f} ms"
    )
