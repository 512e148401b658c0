"""The HTTP phase of ``effect-broker bench``: one real uvicorn API process
(``config.asgi`` as shipped, pooled) on the run's scratch database.

* **End to end**: closed-loop HTTP callers submit while 2 real worker processes drain
  the effects to the simulated target; effects/s counts receipts written inside the
  window by their database timestamps, and the API's, the workers' and PostgreSQL's
  CPU are read at the window's edges.
* **Levels**: ``/healthz`` and a new-key submit back to back at each concurrency
  level, no workers running (the submits' jobs are dropped afterwards).

The machinery (the API process, the load generator, the CPU and connection readers)
is ``http_load``'s; its before/after comparison stays there. The run's in-process
submit median is the "service-level submit" of the p50 target (report.evaluate).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg

from config.capacity import API, pool_size
from effect_broker.services.runtime import get_runtime
from effect_broker.services.tenants import create_tenant
from examples.bench.environment import (
    SIMULATED_TOOL,
    BenchDatabase,
    Services,
    running_workers,
)
from examples.bench.http_client import Case, LevelResult, cases, run_level
from examples.bench.http_figures import EndToEnd, HttpFigures
from examples.bench.http_load import server_env
from examples.bench.http_servers import (
    VARIANTS,
    ApiServer,
    ConnectionSampler,
    postmaster_pid,
    process_tree_cpu,
)
from examples.bench.options import BenchOptions
from examples.bench.pipeline import Pipeline
from examples.bench.report import BenchResult

Say = Callable[[str], None]
#: Closed-loop callers of the end-to-end run: more than the API's default in-flight
#: limit (8), so the API always has a request waiting while workers drain.
E2E_CALLERS = 16
E2E_WORKERS = 2


def http_path(
    result: BenchResult,
    opts: BenchOptions,
    services: Services,
    db: BenchDatabase,
    pipeline: Pipeline,
    say: Say,
) -> None:
    """Run the HTTP phase; fill ``result.http``."""
    window = opts.http_seconds
    warmup = min(1.0, max(0.2, window / 2))
    tuned = {k: v for k, v in os.environ.items() if k.startswith("EFFECT_BROKER_API_")}
    size = pool_size(API)  # the API process gets the same EFFECT_BROKER_API_* values
    figures = HttpFigures(opts.http_levels, size.max_size if size else None)
    result.http = figures
    _, api_key = create_tenant(f"bench-http-{uuid.uuid4().hex[:8]}")
    env = {
        **server_env(db.url, services.contracts, get_runtime().master_key),
        **tuned,
    }
    all_cases = cases(SIMULATED_TOOL, [])
    pg_pid = postmaster_pid(db.url)
    if pg_pid is None:
        result.notes.append(
            "PostgreSQL's processes are not visible here (another machine, container "
            "or user): its CPU per HTTP submit and per effect is not measured"
        )
    server = ApiServer(VARIANTS["pooled"], env, services.workdir)
    sampler = ConnectionSampler(db.admin_url, db.name)
    try:
        server.wait_ready()
        sampler.start()
        figures.e2e = _end_to_end(
            server, api_key, all_cases["submit"], services, db, pg_pid, opts, say
        )
        dropped = pipeline.drain_stale_jobs()
        say(f"      {dropped} queued jobs dropped; levels without workers")
        for level in opts.http_levels:
            for key in ("healthz", "submit"):
                r = LevelResult("pooled", key, level, window)
                _measure(server, api_key, all_cases[key], r, pg_pid, sampler, warmup)
                figures.results.append(r)
                p50 = f"{r.p(50) * 1e3:.1f} ms" if r.latencies else "-"
                say(
                    f"      {key:8} c={level:<4} {r.rate:8.1f} req/s  p50 {p50:>9}  "
                    f"errors {r.error_count}  conns {r.max_connections}"
                )
                time.sleep(0.3)  # let the last connections close
    finally:
        sampler.stop()
        server.stop()
    # The levels' submits queued jobs no worker will run: drop them, and vacuum, so
    # the phases after this one start on the tables they would have had.
    pipeline.drain_stale_jobs()


def _measure(
    server: ApiServer,
    api_key: str,
    case: Case,
    result: LevelResult,
    pg_pid: int | None,
    sampler: ConnectionSampler,
    warmup: float,
) -> None:
    marks: dict[str, float | None] = {}

    def start() -> None:
        marks["api"] = server.cpu_seconds()
        marks["pg"] = process_tree_cpu(pg_pid) if pg_pid else None
        sampler.reset()

    def end() -> None:
        result.api_cpu = server.cpu_seconds() - (marks["api"] or 0.0)
        if pg_pid and marks["pg"] is not None:
            result.pg_cpu = process_tree_cpu(pg_pid) - marks["pg"]
        maxima, others = sampler.maxima()
        result.max_connections = maxima.get(server.application_name, 0)
        result.other_active_backends = others

    asyncio.run(
        run_level(
            base_url=server.url,
            api_key=api_key,
            case=case,
            concurrency=result.concurrency,
            warmup=warmup,
            window=result.window,
            on_window_start=start,
            on_window_end=end,
            result=result,
        )
    )


def _end_to_end(
    server: ApiServer,
    api_key: str,
    case: Case,
    services: Services,
    db: BenchDatabase,
    pg_pid: int | None,
    opts: BenchOptions,
    say: Say,
) -> EndToEnd:
    """Closed-loop submits through the API while worker processes drain them."""
    # Twice a level's window: receipts/s counts a stage behind a queue.
    window = 2 * opts.http_seconds
    http = LevelResult("pooled", "e2e", E2E_CALLERS, window)
    e2e = EndToEnd(E2E_WORKERS, http)
    with (
        running_workers(services, E2E_WORKERS) as workers,
        psycopg.connect(db.url, autocommit=True) as conn,
    ):
        marks: dict[str, Any] = {}

        def clock() -> datetime:
            row = conn.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            return row[0]

        def worker_cpu() -> float:
            return sum(process_tree_cpu(w.pid) for w in workers)

        def start() -> None:
            marks["at"] = clock()
            marks["api"] = server.cpu_seconds()
            marks["workers"] = worker_cpu()
            marks["pg"] = process_tree_cpu(pg_pid) if pg_pid else None

        def end() -> None:
            until = clock()
            http.api_cpu = server.cpu_seconds() - marks["api"]
            e2e.worker_cpu = worker_cpu() - marks["workers"]
            if pg_pid and marks["pg"] is not None:
                http.pg_cpu = process_tree_cpu(pg_pid) - marks["pg"]
            row = conn.execute(
                "SELECT count(*) FROM effect_receipts "
                "WHERE created_at >= %s AND created_at < %s",
                (marks["at"], until),
            ).fetchone()
            e2e.receipts = int(row[0]) if row else 0
            e2e.db_window = (until - marks["at"]).total_seconds()

        asyncio.run(
            run_level(
                base_url=server.url,
                api_key=api_key,
                case=case,
                concurrency=E2E_CALLERS,
                # Long enough for the workers to be busy and the queue to fill.
                warmup=max(1.0, opts.http_seconds / 2),
                window=window,
                on_window_start=start,
                on_window_end=end,
                result=http,
            )
        )
    say(
        f"      end to end, API + {E2E_WORKERS} workers, {E2E_CALLERS} callers: "
        f"{http.rate:,.0f} submits/s, {e2e.rate:,.0f} effects/s, "
        f"errors {http.error_count}"
    )
    return e2e
