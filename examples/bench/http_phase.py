"""The HTTP phase of ``effect-broker bench``: real API processes, served as
``effect-broker serve`` serves them, on the run's scratch database.

* **End to end**: closed-loop HTTP callers submit while real worker processes drain
  the effects to the simulated target; effects/s counts receipts written inside the
  window by their database timestamps, and the API's, the workers' and PostgreSQL's
  CPU are read at the window's edges. First 1 API process and 2 workers (the
  target's figure), then more API processes and workers against the one PostgreSQL
  (``--scale-out``; issue 25 item 4), reusing the workers across API processes.
* **Levels**: ``/healthz`` and a new-key submit back to back at each concurrency
  level (and a bare Django view at the top level), no workers running (the
  submits' jobs are dropped afterwards).
* **Serving modes** (``--serving-modes``; issue 25 item 2): the same cases at the top
  level on the API process as served before issue 25, with uvicorn's httptools
  parser (when installed), and ``serve --wsgi``, one server at a time.

The machinery (the API process, the load generator, the CPU and connection readers)
is ``http_load``'s and ``http_servers``'. The run's in-process submit median is the
"service-level submit" of the p50 target (report.evaluate).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
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
from examples.bench.http_figures import SHIPPED, EndToEnd, HttpFigures
from examples.bench.http_load import server_env
from examples.bench.http_servers import (
    VARIANTS,
    ApiServer,
    ConnectionSampler,
    Variant,
    postmaster_pid,
    process_tree_cpu,
)
from examples.bench.options import BenchOptions
from examples.bench.pipeline import Pipeline
from examples.bench.report import BenchResult
from examples.crash_matrix.workers import WorkerProcess

Say = Callable[[str], None]
#: Closed-loop callers per API process end to end: more than the API's default
#: in-flight limit (8), so the API always has a request waiting while workers drain.
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
    modes = [key for key in opts.serving_modes if not _unavailable(key, result)]
    # Every server of the phase starts now, at once: their start-ups (imports,
    # Django, each a second or more of CPU) overlap instead of following each other,
    # and an idle server costs the others' windows nothing (no timer in uvicorn; a
    # gunicorn master wakes once a second).
    servers = _start_servers(env, services, opts, modes)
    sampler = ConnectionSampler(db.admin_url, db.name)
    load = _Load(api_key, pg_pid, sampler, warmup, window)
    server = servers[SHIPPED]
    try:
        server.wait_ready()
        sampler.start()
        figures.scale_out = _scale_out(
            servers, api_key, all_cases["submit"], services, db, pg_pid, opts, say
        )
        figures.e2e = next(
            e for e in figures.scale_out if (e.api_processes, e.workers) == (1, 2)
        )
        dropped = pipeline.drain_stale_jobs()
        say(f"      {dropped} queued jobs dropped; levels without workers")
        for level in opts.http_levels:
            keys = ("healthz", "bare", "submit") if level == figures.top else None
            for key in keys or ("healthz", "submit"):
                r = load.measure(server, all_cases[key], level)
                figures.results.append(r)
                _say_level(say, r)
        server.stop()  # the modes' windows run with only their own server busy
        if modes:
            figures.modes[SHIPPED] = SERVING_LABELS[SHIPPED]
        for key in modes:
            _serving_mode(figures, servers[key], load, all_cases, say)
            figures.modes[key] = SERVING_LABELS[key]
    finally:
        sampler.stop()
        for each in servers.values():
            each.stop()
    # The levels' submits queued jobs no worker will run: drop them, and vacuum, so
    # the phases after this one start on the tables they would have had.
    pipeline.drain_stale_jobs()


def _start_servers(
    env: dict[str, str], services: Services, opts: BenchOptions, modes: list[str]
) -> dict[str, ApiServer]:
    """The shipped server, one per other API process count of ``--scale-out``, one
    per serving mode: started, not yet waited for."""
    servers = {SHIPPED: ApiServer(VARIANTS[SHIPPED], env, services.workdir)}
    for processes in sorted({p for p, _ in opts.scale_out} - {1}):
        key = f"{SHIPPED}{processes}"
        variant = Variant(
            key,
            f"{processes} API processes (serve --workers {processes})",
            env=VARIANTS[SHIPPED].env,
            serve_options={"workers": processes},
        )
        servers[key] = ApiServer(variant, env, services.workdir)
    for key in modes:
        servers[key] = ApiServer(VARIANTS[key], env, services.workdir)
    return servers


#: Short names of the serving modes in the HTTP table.
SERVING_LABELS = {
    SHIPPED: "ASGI as served",
    "hops": "ASGI before issue 25",
    "httptools": "ASGI, httptools parser",
    "wsgi": "WSGI (serve --wsgi)",
}


def _serving_mode(
    figures: HttpFigures,
    server: ApiServer,
    load: _Load,
    all_cases: dict[str, Case],
    say: Say,
) -> None:
    """The top level's cases on another way of serving the API; then stop it."""
    try:
        server.wait_ready()
        for case in ("healthz", "bare", "submit"):
            r = load.measure(server, all_cases[case], figures.top)
            figures.results.append(r)
            _say_level(say, r)
    finally:
        server.stop()


def _unavailable(key: str, result: BenchResult) -> bool:
    """True (with a note in the report) when serving mode ``key`` cannot run here."""
    missing = ""
    if key == "wsgi" and importlib.util.find_spec("gunicorn") is None:
        missing = "gunicorn is not installed (pip install 'effect-broker[wsgi]')"
    if key == "httptools" and importlib.util.find_spec("httptools") is None:
        missing = "httptools is not installed (serve runs uvicorn with h11)"
    if missing:
        result.notes.append(f"serving mode {key} not measured: {missing}")
    return bool(missing)


def _say_level(say: Say, r: LevelResult) -> None:
    p50 = f"{r.p(50) * 1e3:.1f} ms" if r.latencies else "-"
    cpu = r.per_request(r.api_cpu)
    say(
        f"      {r.variant:6} {r.case:8} c={r.concurrency:<4} {r.rate:8.1f} req/s  "
        f"p50 {p50:>9}  API {cpu or 0:.2f} ms/req  errors {r.error_count}  "
        f"conns {r.max_connections}"
    )


class _Load:
    """One closed-loop measurement window against a server, with its CPU and
    connection counters read at the window's edges."""

    def __init__(
        self,
        api_key: str,
        pg_pid: int | None,
        sampler: ConnectionSampler,
        warmup: float,
        window: float,
    ) -> None:
        self.api_key = api_key
        self.pg_pid = pg_pid
        self.sampler = sampler
        self.warmup = warmup
        self.window = window

    def measure(self, server: ApiServer, case: Case, level: int) -> LevelResult:
        """``case`` at ``level`` callers on ``server``."""
        result = LevelResult(server.variant.key, case.key, level, self.window)
        marks: dict[str, float | None] = {}
        pg_pid, sampler = self.pg_pid, self.sampler

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
                api_key=self.api_key,
                case=case,
                concurrency=level,
                warmup=self.warmup,
                window=self.window,
                on_window_start=start,
                on_window_end=end,
                result=result,
            )
        )
        return result


def _scale_out(
    servers: dict[str, ApiServer],
    api_key: str,
    case: Case,
    services: Services,
    db: BenchDatabase,
    pg_pid: int | None,
    opts: BenchOptions,
    say: Say,
) -> list[EndToEnd]:
    """End to end for each (API processes, workers) of ``opts.scale_out``: workers
    started once per count; a server of more than one process is stopped once its
    runs are done."""
    runs: list[EndToEnd] = []
    last_use = {p: max(w for q, w in opts.scale_out if q == p) for p, _ in opts.scale_out}
    for workers in sorted({w for _, w in opts.scale_out}):
        with running_workers(services, workers) as running:
            for processes, _ in (c for c in opts.scale_out if c[1] == workers):
                api = servers[SHIPPED if processes == 1 else f"{SHIPPED}{processes}"]
                api.wait_ready()
                e2e = _end_to_end(
                    api, api_key, processes, case, running, db, pg_pid, opts
                )
                runs.append(e2e)
                say(
                    f"      end to end, {processes} API process(es) + {workers} "
                    f"workers, {e2e.http.concurrency} callers: "
                    f"{e2e.http.rate:,.0f} submits/s, {e2e.rate:,.0f} effects/s, "
                    f"errors {e2e.http.error_count}"
                )
                if processes != 1 and last_use[processes] == workers:
                    api.stop()
    return runs


def _end_to_end(
    server: ApiServer,
    api_key: str,
    processes: int,
    case: Case,
    workers: list[WorkerProcess],
    db: BenchDatabase,
    pg_pid: int | None,
    opts: BenchOptions,
) -> EndToEnd:
    """Closed-loop submits through the API while ``workers`` drain them."""
    # Twice a level's window: receipts/s counts a stage behind a queue.
    window = 2 * opts.http_seconds
    callers = E2E_CALLERS * processes
    http = LevelResult(server.variant.key, "e2e", callers, window)
    e2e = EndToEnd(len(workers), http, api_processes=processes)
    with psycopg.connect(db.url, autocommit=True) as conn:
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
                concurrency=callers,
                # Long enough for the workers to be busy and the queue to fill.
                warmup=max(1.0, opts.http_seconds / 2),
                window=window,
                on_window_start=start,
                on_window_end=end,
                result=http,
            )
        )
    return e2e
