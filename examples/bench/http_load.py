"""The HTTP path under load: real uvicorn API processes, before and after pooling.

``python -m examples.bench.http_load`` starts two API processes on one scratch
database, side by side, and drives each with a closed-loop Python load generator at
concurrency 1, 8, 32, 64 and 256, for a new-key submit, a replay and ``/healthz``:

* **before**: the API as main had it before issue 13 (a new database connection per
  request, session/auth/messages middleware on every route, no in-flight limit);
* **pooled**: ``config.asgi`` as shipped (the API's connection pool, the in-flight
  limit, API routes without the admin's middleware), with the default settings
  unless ``EFFECT_BROKER_API_*`` variables are set for this command.

At every level the two variants run back to back, so both see the same machine: on
a shared machine compare the columns of one run, not figures of different runs. It
reports req/s, p50/p99, errors, CPU per request of the API process, of PostgreSQL and
of the load generator, and the most database connections each API process held.

Without ``DATABASE_URL`` the bench runs its own embedded PostgreSQL instance
(``.effect-broker/bench``), so the server's CPU is the bench's alone; with it, a
scratch database on that server (its CPU then includes everyone else's, and the
"before" variant may open as many connections as there are clients).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_LEVELS = (1, 8, 32, 64, 256)
QUICK_LEVELS = (1, 8, 64)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.bench.http_load",
        description=(
            "Closed-loop HTTP load on real uvicorn API processes: the API before "
            "issue 13 (no pool) and pooled, side by side, for submit, replay and "
            "/healthz; req/s, p50/p99, errors, CPU per request (API, PostgreSQL, load "
            "generator) and open database connections."
        ),
    )
    parser.add_argument(
        "--quick", action="store_true", help="levels 1,8,64 and short windows (~1 min)"
    )
    parser.add_argument(
        "--levels", help="comma-separated concurrency levels (default 1,8,32,64,256)"
    )
    parser.add_argument(
        "--cases", default="submit,replay,healthz", help="submit,replay,healthz"
    )
    parser.add_argument("--variants", default="before,pooled", help="before,pooled")
    parser.add_argument(
        "--seconds",
        type=float,
        help="measurement window per level (default 5; quick 1.5)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        help="warm-up per level, not measured (default 2; quick 0.5)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    levels = args.levels or ",".join(
        str(n) for n in (QUICK_LEVELS if args.quick else DEFAULT_LEVELS)
    )
    try:
        args.levels = [int(n) for n in levels.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--levels must be comma-separated integers, got {levels!r}")
    if not args.levels or min(args.levels) < 1:
        parser.error("--levels must be positive integers")
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for name, chosen, allowed in (
        ("--cases", args.cases, {"submit", "replay", "healthz"}),
        ("--variants", args.variants, {"before", "pooled"}),
    ):
        unknown = sorted(set(chosen) - allowed)
        if unknown or not chosen:
            parser.error(f"{name}: unknown or empty {unknown}; choose from {allowed}")
    args.seconds = args.seconds or (1.5 if args.quick else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 2.0)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; print the markdown report."""
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from examples.bench.environment import scratch_database

    started = time.monotonic()
    with scratch_database() as db:
        report = _run(args, db)
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    from examples.bench.http_report import render

    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
        print(f"\nJSON written to {args.json}")
    return 0


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, db: Any) -> dict[str, Any]:
    from effect_broker.domain.contracts import load_contracts
    from effect_broker.services import runtime
    from effect_broker.services.runtime import get_runtime
    from effect_broker.services.tenants import create_tenant
    from examples.bench.environment import (
        SIMULATED_CONTRACT,
        SIMULATED_TOOL,
        machine,
        server_settings,
    )
    from examples.bench.http_client import LevelResult, cases, run_level
    from examples.bench.http_servers import (
        VARIANTS,
        ApiServer,
        ConnectionSampler,
        postmaster_pid,
        process_tree_cpu,
    )

    workdir = Path(tempfile.mkdtemp(prefix="eb-http-bench-"))
    contracts = workdir / "contracts.toml"
    contracts.write_text(SIMULATED_CONTRACT, encoding="utf-8")
    tenant, api_key = create_tenant(f"http-bench-{uuid.uuid4().hex[:8]}")
    with runtime.override(registry=load_contracts(contracts)):
        replay_keys = _seed_replay_keys(tenant, SIMULATED_TOOL, 64)
        service_submit = _service_submit_latency(
            tenant, SIMULATED_TOOL, 50 if args.quick else 200
        )

    env = server_env(db.url, contracts, get_runtime().master_key)
    tuned = {k: v for k, v in os.environ.items() if k.startswith("EFFECT_BROKER_API_")}
    servers: dict[str, ApiServer] = {}
    sampler = ConnectionSampler(db.admin_url, db.name)
    pg_pid = postmaster_pid(db.url)
    results: list[LevelResult] = []
    report: dict[str, Any] = {
        "started_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "server": {**server_settings(db.url), "where": db.where},
        "postgres_cpu": "server process tree (/proc)" if pg_pid else "unavailable",
        "options": {
            "levels": args.levels,
            "cases": args.cases,
            "variants": args.variants,
            "warmup_s": args.warmup,
            "window_s": args.seconds,
            "pooled_env": tuned,
        },
        "service_submit_ms": service_submit,
    }
    try:
        for key in args.variants:
            servers[key] = ApiServer(VARIANTS[key], {**env, **tuned}, workdir)
        for server in servers.values():
            server.wait_ready()
        sampler.start()
        all_cases = cases(SIMULATED_TOOL, replay_keys)
        for case_key in args.cases:
            for level in args.levels:
                for key, server in servers.items():
                    result = LevelResult(key, case_key, level, args.seconds)
                    marks: dict[str, float | None] = {}

                    def window_start(
                        server: ApiServer = server, marks: dict = marks
                    ) -> None:
                        marks["api"] = server.cpu_seconds()
                        marks["pg"] = process_tree_cpu(pg_pid) if pg_pid else None
                        sampler.reset()

                    def window_end(
                        server: ApiServer = server,
                        marks: dict = marks,
                        result: LevelResult = result,
                    ) -> None:
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
                            case=all_cases[case_key],
                            concurrency=level,
                            warmup=args.warmup,
                            window=args.seconds,
                            on_window_start=window_start,
                            on_window_end=window_end,
                            result=result,
                        )
                    )
                    results.append(result)
                    _say(_progress(result))
                    # The next window starts after a warm-up (>= 0.2 s): the last
                    # connections of this one have closed by then.
                    time.sleep(0.1)
        report["idle_connections"] = {
            key: sampler.current(server.application_name)
            for key, server in servers.items()
        }
    finally:
        sampler.stop()
        for server in servers.values():
            server.stop()
        for path in workdir.iterdir():
            path.unlink()
        workdir.rmdir()
    report["load_average_at_end"] = list(os.getloadavg())
    report["variants"] = {key: VARIANTS[key].label for key in args.variants}
    report["results"] = [r.to_json() for r in results]
    return report


def _progress(r: Any) -> str:
    p50 = f"{r.p(50) * 1000:.1f} ms" if r.latencies else "-"
    return (
        f"  {r.case:8} c={r.concurrency:<4} {r.variant:7} {r.rate:8.1f} req/s  "
        f"p50 {p50:>9}  errors {r.error_count}  conns {r.max_connections}"
    )


def server_env(database_url: str, contracts: Path, master_key: bytes) -> dict[str, str]:
    """The API processes' environment: this machine's, minus any broker settings,
    plus the scratch database, the bench contracts and the bench's master key."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EFFECT_BROKER_", "PROCRASTINATE_", "DJANGO_SETTINGS"))
    }
    env.update(
        {
            "DATABASE_URL": database_url,
            "EFFECT_BROKER_CONTRACTS": str(contracts),
            "EFFECT_BROKER_MASTER_KEY": base64.b64encode(master_key).decode(),
            # What production runs: DEBUG on would keep every query in memory.
            "DEBUG": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _seed_replay_keys(tenant: Any, tool: str, count: int) -> list[str]:
    """Submit ``count`` keys once, in process, for the replay case to send again."""
    from effect_broker.domain.records import EffectRequest
    from effect_broker.services.submission import submit
    from examples.bench.http_client import ARGUMENTS

    run = uuid.uuid4().hex[:8]
    keys = [f"http-replay:{run}:{i}" for i in range(count)]
    for key in keys:
        submit(tenant, EffectRequest(operation_key=key, tool=tool, arguments=ARGUMENTS))
    return keys


def _service_submit_latency(tenant: Any, tool: str, samples: int) -> dict[str, float]:
    """A new-key submit called in this process (no HTTP), for the issue's ratio
    "HTTP submit p50 at concurrency 1 vs service-level submit + /healthz"."""
    from effect_broker.domain.records import EffectRequest
    from effect_broker.services.submission import submit
    from examples.bench.http_client import ARGUMENTS
    from examples.bench.stats import percentile

    run = uuid.uuid4().hex[:8]
    timings = []
    for i in range(samples + 20):
        request = EffectRequest(
            operation_key=f"svc:{run}:{i}", tool=tool, arguments=ARGUMENTS
        )
        started = time.perf_counter()
        submit(tenant, request)
        if i >= 20:  # the first calls warm the connection and the caches
            timings.append(time.perf_counter() - started)
    return {
        "n": len(timings),
        "p50": statistics.median(timings) * 1000,
        "p99": percentile(timings, 99) * 1000,
    }


if __name__ == "__main__":
    sys.exit(main())
