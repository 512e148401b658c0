"""Commits, CPU and drain time per dispatched effect: pools that test every checkout
(before) vs. ``effect_broker.store.pool_checks`` (after), interleaved.

One scratch database, one worker process (concurrency 1) per window, the in-process
simulated target. Each round runs both arms in shuffled order; an arm's round is an
idle window (the worker started, left alone, stopped) and a busy one (N queued
effects drained, padded to the same length), so their difference per effect is the
dispatch alone: ``pg_stat_database.xact_commit`` (this process's own polls
subtracted), the worker process's CPU and PostgreSQL's (its whole process tree: on a
shared server, noisy). Drain time runs from the worker's registration to the last
receipt. Usage::

    python -m examples.bench.commits_ab [--rounds 3] [--effects 200]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from examples.bench.ab_worker import one_worker

#: (label, the worker module ``python -m`` starts)
ARMS = [
    ("every checkout (before)", "examples.bench.every_checkout_worker"),
    ("when in doubt (after)", "effect_broker.cli"),
]


@dataclass
class Window:
    """What one window measured."""

    commits: int
    worker_cpu: float
    pg_cpu: float
    drain: float = math.nan


@dataclass
class Arm:
    """Per-effect figures of one arm, one entry per round."""

    label: str
    module: str
    commits: list[float] = field(default_factory=list)
    worker_cpu_ms: list[float] = field(default_factory=list)
    pg_cpu_ms: list[float] = field(default_factory=list)
    drain_ms: list[float] = field(default_factory=list)


def _span(values: list[float], digits: int = 2) -> str:
    if not values:
        return "-"
    lo, hi, mid = min(values), max(values), statistics.median(values)
    return f"{mid:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rounds; print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.bench.commits_ab",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--effects", type=int, default=200, help="per window (200)")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="length of every window (10)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    import psycopg
    from django.conf import settings
    from django.db import connection

    from effect_broker.domain.contracts import load_contracts
    from effect_broker.services import runtime
    from examples.bench.broker_cases import BrokerCases, bench_tenant
    from examples.bench.environment import Services, scratch_database
    from examples.bench.http_servers import process_cpu
    from examples.bench.wal_meter import TABLES, Meter

    settings.DEBUG = False
    arms = [Arm(label, module) for label, module in ARMS]
    with scratch_database() as db:
        services = Services(db.url)
        meter = Meter(db)
        with psycopg.connect(db.url, autocommit=True) as conn:
            for table in TABLES:
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
        try:
            runtime.reset()
            with runtime.override(registry=load_contracts(services.contracts)):
                cases = BrokerCases(bench_tenant())
                env = services.worker_env()

                def window(module: str, until: Callable[[], float]) -> Window:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT pg_stat_force_next_flush()")
                    connection.close()
                    time.sleep(0.3)
                    baseline = meter.backends()
                    before = meter.read()
                    pg_before = meter.server_cpu()
                    started = time.monotonic()
                    with one_worker(module, env, db.url, name="commits-ab") as pid:
                        drain = until()
                        time.sleep(max(0.0, args.seconds - (time.monotonic() - started)))
                        cpu = process_cpu(pid)
                    meter.settle(baseline)
                    own = meter.flush_polls()
                    after = meter.read()
                    return Window(
                        (after - before).commits - own,
                        cpu,
                        meter.server_cpu() - pg_before,
                        drain,
                    )

                for n_round in range(args.rounds):
                    order = list(arms)
                    random.shuffle(order)
                    for arm in order:
                        idle = window(arm.module, lambda: math.nan)
                        effects = [
                            cases.submit_new_series(
                                f"ab{n_round}-{arm.module}", i
                            ).effect_id
                            for i in range(args.effects)
                        ]
                        n = len(effects)

                        def drained(effects: list[str] = effects) -> float:
                            t0 = time.monotonic()
                            meter.wait_for(
                                "SELECT count(*) FROM effect_receipts "
                                "WHERE effect_id = ANY(%s::uuid[])",
                                [effects],
                                len(effects),
                                timeout=args.seconds * 3,
                            )
                            return time.monotonic() - t0

                        busy = window(arm.module, drained)
                        arm.commits.append((busy.commits - idle.commits) / n)
                        arm.worker_cpu_ms.append(
                            (busy.worker_cpu - idle.worker_cpu) / n * 1e3
                        )
                        arm.pg_cpu_ms.append((busy.pg_cpu - idle.pg_cpu) / n * 1e3)
                        arm.drain_ms.append(busy.drain / n * 1e3)
                        print(
                            f"round {n_round + 1} {arm.label}: "
                            f"{arm.commits[-1]:.2f} commits, "
                            f"worker {arm.worker_cpu_ms[-1]:.2f} ms, "
                            f"PostgreSQL {arm.pg_cpu_ms[-1]:.2f} ms, "
                            f"drain {arm.drain_ms[-1]:.2f} ms per effect",
                            flush=True,
                        )
        finally:
            meter.close()
            with psycopg.connect(db.url, autocommit=True) as conn:
                for table in TABLES:
                    conn.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
            services.close()
    print(
        f"\n{args.rounds} rounds x {args.effects} effects, 1 worker (concurrency 1); "
        "per dispatched effect, median (min-max) over rounds:\n"
    )
    print(
        "| pool check | commits | worker CPU ms | PostgreSQL CPU ms | drain ms |\n"
        "|---|---:|---:|---:|---:|"
    )
    for arm in arms:
        print(
            f"| {arm.label} | {_span(arm.commits)} | {_span(arm.worker_cpu_ms)} "
            f"| {_span(arm.pg_cpu_ms)} | {_span(arm.drain_ms)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
