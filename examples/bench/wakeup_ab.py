"""Lost wake-ups, before and after: submit → receipt one at a time, 1 idle worker.

One run, two arms back to back on one scratch database: procrastinate's own fetch loop
(``examples.bench.stock_wakeup_worker``), then the broker's worker, which sets the
wake-up again when a NOTIFY may have landed during a pass's last empty fetch
(``effect_broker.workers.wakeups``, issue 13). In each arm one worker process
(concurrency 1) runs a bare no-op job and a broker effect alternately, one at a time,
each timed by database stamps as the main bench does (``pipeline.Pipeline``). A sample
of half a poll interval or more waited for a poll, not for work. Usage::

    python -m examples.bench.wakeup_ab [--samples 500]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from examples.bench.ab_worker import one_worker

#: (label, the worker module `python -m` starts)
ARMS = [
    ("procrastinate's fetch loop", "examples.bench.stock_wakeup_worker"),
    ("broker worker (wake-up kept)", "effect_broker.cli"),
]


@dataclass
class Arm:
    """What one arm measured (seconds)."""

    label: str
    jobs: list[float] = field(default_factory=list)
    effects: list[float] = field(default_factory=list)
    #: Calls of procrastinate's fetch function during the samples (None: not counted).
    fetches: int | None = None


def fetch_calls(database_url: str) -> int | None:
    """Calls of ``procrastinate_fetch_job_v2`` so far (``track_functions``)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        time.sleep(1.2)  # backends flush their function counts about once a second
        row = conn.execute(
            "SELECT sum(calls) FROM pg_stat_user_functions "
            "WHERE funcname = 'procrastinate_fetch_job_v2'"
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def count_fetches(database_url: str, name: str) -> None:
    """Have new backends of ``name`` count PL/pgSQL function calls (the worker's
    fetches); a bench on a server where that is refused counts none."""
    import psycopg

    with (
        contextlib.suppress(psycopg.Error),
        psycopg.connect(database_url, autocommit=True) as conn,
    ):
        conn.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'pl'")


def main(argv: Sequence[str] | None = None) -> int:
    """Run both arms; print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.bench.wakeup_ab",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument(
        "--samples", type=int, default=500, help="jobs and effects per arm (500)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.conf import settings

    from effect_broker.domain.contracts import load_contracts
    from effect_broker.services import runtime
    from examples.bench.broker_cases import BrokerCases, bench_tenant
    from examples.bench.environment import Services, scratch_database
    from examples.bench.pipeline import Pipeline

    settings.DEBUG = False
    poll = float(settings.PROCRASTINATE_WORKER_DEFAULTS["fetch_job_polling_interval"])
    arms: list[Arm] = []
    with scratch_database() as db:
        services = Services(db.url)
        try:
            runtime.reset()
            with runtime.override(registry=load_contracts(services.contracts)):
                pipeline = Pipeline(db.url, BrokerCases(bench_tenant()))
                try:
                    count_fetches(db.url, db.name)
                    for n_arm, (label, module) in enumerate(ARMS):
                        pipeline.drain_stale_jobs()
                        arm = Arm(label)
                        with one_worker(
                            module, services.worker_env(), db.url, name="wakeup-ab"
                        ):
                            time.sleep(0.3)  # its first (empty) fetch
                            for i in range(20):  # warm-up
                                pipeline.job_one()
                                pipeline.broker_one(n_arm * 1_000_000 + i)
                            before = fetch_calls(db.url)
                            for i in range(args.samples):
                                arm.jobs.append(pipeline.job_one())
                                arm.effects.append(
                                    pipeline.broker_one(n_arm * 1_000_000 + 100 + i)
                                )
                            after = fetch_calls(db.url)
                            if before is not None and after is not None:
                                arm.fetches = after - before
                        arms.append(arm)
                        print(f"  {label}: done", file=sys.stderr, flush=True)
                finally:
                    pipeline.close()
        finally:
            services.close()
            runtime.reset()
    print(table(arms, poll))
    return 0


def table(arms: list[Arm], poll: float) -> str:
    """The markdown table of both arms."""
    from examples.bench.stats import percentile

    def ms(value: float) -> str:
        return f"{value * 1e3:,.2f}"

    lines = [
        f"One idle worker, one at a time; poll interval {poll:g} s. "
        f"'waited' = samples ≥ {poll / 2:g} s (a lost wake-up waits for the poll).",
        "",
        "| worker | case | n | p50 ms | p90 ms | p99 ms | max ms | waited "
        "| p99 / p50 | p50 vs bare job | fetches per item |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in arms:
        bare = statistics.median(arm.jobs)
        items = len(arm.jobs) + len(arm.effects)
        fetches = "-" if arm.fetches is None else f"{arm.fetches / items:.2f} (both)"
        for case, values in (("bare job", arm.jobs), ("broker effect", arm.effects)):
            p50 = statistics.median(values)
            p99 = percentile(values, 99)
            lines.append(
                f"| {arm.label} | {case} | {len(values)} | {ms(p50)} "
                f"| {ms(percentile(values, 90))} | {ms(p99)} | {ms(max(values))} "
                f"| {sum(v >= poll / 2 for v in values)} | {p99 / p50:.2f}x "
                f"| {p50 / bare:.2f}x | {fetches} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
