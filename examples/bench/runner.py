"""One bench run, start to finish: prepare, measure each phase, print and write.

Benchmarks print figures; they are not timed tests. The exit code is 0 whether or not
a target is met (the table says which were missed and why); it is non-zero only when
the run itself could not be carried out.
"""

from __future__ import annotations

import json
import math
import os
import time
from datetime import UTC, datetime
from typing import Any, Protocol

from django.conf import settings

from effect_broker.domain.contracts import load_contracts
from effect_broker.services import runtime
from examples.bench import batch_submit, fetch_plan, parallel_submit, phases, wal_meter
from examples.bench.broker_cases import ARGUMENTS, BrokerCases, bench_tenant
from examples.bench.call_profiles import profiles
from examples.bench.chart import matplotlib_missing, write_chart
from examples.bench.environment import (
    Services,
    machine,
    scratch_database,
    server_settings,
)
from examples.bench.http_phase import http_path
from examples.bench.options import BenchOptions
from examples.bench.parallel_submit import CLIENTS
from examples.bench.pipeline import Pipeline
from examples.bench.report import BenchResult, evaluate, markdown, to_json


class Output(Protocol):
    """Where the report goes: a text stream or Django's ``OutputWrapper``."""

    def write(self, text: str) -> Any:
        """Write ``text``."""

    def flush(self) -> Any:
        """Flush."""


class Progress:
    """Numbered progress lines with elapsed time, flushed so a pipe shows them live."""

    def __init__(self, out: Output, steps: int) -> None:
        self.out = out
        self.steps = steps
        self.step = 0
        self.started = time.monotonic()

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.started

    def next(self, text: str) -> None:
        """Start the next numbered step."""
        self.step += 1
        self.say(f"[{self.step}/{self.steps}] {self.elapsed():6.1f}s {text}")

    def say(self, text: str) -> None:
        """Print one line now."""
        self.out.write(text + "\n")
        self.out.flush()


def _clean(value: Any) -> Any:
    """NaN has no JSON spelling: write null instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def run(out: Output, opts: BenchOptions) -> int:
    """Run every phase; print progress, then the report; return the exit code."""
    if opts.soak_only:
        from examples.bench.soak_run import run_soak_bench

        return run_soak_bench(out, opts)
    steps = 9 + bool(opts.scales) + bool(opts.http_levels) + opts.with_soak
    progress = Progress(out, steps)
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1) * 0.5:
        progress.say(
            f"note: load average {load:.2f} on {os.cpu_count()} CPUs - another process "
            "is busy; figures will be noisy (rerun on a quiet machine to publish)"
        )
    # Measure what production runs: with DEBUG on, Django logs and keeps every query
    # (the bench's worker processes get DEBUG=0 the same way).
    settings.DEBUG = False
    progress.next("preparing: own embedded server, scratch database, migrations, target")
    with scratch_database() as db:
        result = BenchResult(
            started_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            machine=machine(),
            server=server_settings(db.url),
            where=db.where,
            options=opts.to_json(),
            latency=phases.new_latency_cases(),
        )
        services = Services(db.url)
        try:
            runtime.reset()
            with runtime.override(registry=load_contracts(services.contracts)):
                cases = BrokerCases(bench_tenant())
                # Workers first, on a ledger where everything settles: effects the
                # in-process cases leave prepared or dispatching would otherwise be
                # re-deferred by the workers' sweeper in the middle of a burst.
                progress.next(
                    "end to end through worker processes "
                    f"({', '.join(map(str, opts.workers))})"
                )
                pipeline = Pipeline(db.url, cases)
                try:
                    # With them, CPU per item of a drain: 1,000 items (300 with
                    # --quick; a smoke run's few items drain 50, an indicative
                    # figure as all of that run's are).
                    phases.pipelines(result, opts, services, pipeline, progress.say)
                    # Before the HTTP phase: its levels run without workers and leave
                    # prepared effects whose jobs it drops, which a later worker's
                    # sweeper re-defers; the WAL phase's idle windows counted their
                    # dispatches as a worker's background (runs of 2026-12-04).
                    progress.next(
                        "commits and WAL per effect (pg_stat_database, pg_stat_wal)"
                    )
                    result.wal_commits = wal_meter.measure(
                        db, services, cases, items=opts.items, quick=opts.quick
                    )
                    if opts.http_levels:
                        progress.next(
                            "HTTP: one API process, end to end with 2 workers, then "
                            f"levels {','.join(map(str, opts.http_levels))}"
                        )
                        http_path(result, opts, services, db, pipeline, progress.say)
                finally:
                    pipeline.close()
                progress.next(
                    "floors, hand-rolled table, agent-ledger and broker calls "
                    "(in this process, interleaved)"
                )
                phases.in_process(result, opts, cases, db.url, progress.say)
                progress.next("batch submit: effects/s at batch sizes 1, 10, 100")
                result.batches = batch_submit.measure(
                    cases,
                    repetitions=opts.repetitions,
                    samples=opts.samples,
                    say=progress.say,
                )
                progress.next(f"submits/s from 1 and {CLIENTS} client processes")
                result.parallel = parallel_submit.measure(
                    services.worker_env(),
                    cases.tenant_id,
                    cases.tool,
                    ARGUMENTS,
                    rounds=opts.bursts,
                    # A smoke run's few items: 1 s rounds.
                    window=5.0 if not opts.quick else (2.0 if opts.items >= 20 else 1.0),
                    say=progress.say,
                )
                progress.next("profiling a submit and a dispatch")
                profiles(result, opts, cases)
                progress.next(f"procrastinate's fetch, {fetch_plan.QUEUED:,} queued")
                result.fetch_plan = fetch_plan.measure(db.url)
                progress.say(fetch_plan.target_row(result.fetch_plan)[4])
                if opts.scales:
                    progress.next(
                        "scale: seed the ledger, measure submit and claim, plans"
                    )
                    phases.scales(result, opts, cases, db, progress.say)
        finally:
            services.close()
            runtime.reset()
        progress.next("dropping the scratch database")
    if opts.with_soak:
        from examples.bench.soak_run import soak_phase

        assert opts.soak is not None
        soak_phase(result, opts.soak, progress)
    report(out, opts, result, progress)
    return 0


def report(
    out: Output, opts: BenchOptions, result: BenchResult, progress: Progress
) -> None:
    """Close the run's figures, print the report and write its files."""
    result.elapsed_seconds = progress.elapsed()
    result.machine["load_average_at_end"] = list(os.getloadavg())
    targets = evaluate(result)
    out.write("\n" + markdown(result, targets))
    out.flush()
    _write_files(out, opts, result, targets)


def _write_files(
    out: Output, opts: BenchOptions, result: BenchResult, targets: list[Any]
) -> None:
    if opts.json_path is not None:
        opts.json_path.write_text(
            json.dumps(_clean(to_json(result, targets)), indent=2) + "\n",
            encoding="utf-8",
        )
        out.write(f"\nJSON written to {opts.json_path}\n")
    if opts.png_path is None:
        out.write("No chart written (pass --json PATH or --png PATH).\n")
        return
    missing = matplotlib_missing()
    if missing:
        out.write(f"No chart written: {missing}.\n")
        return
    title = (
        f"effect-broker bench {result.started_at} - {result.machine['nproc']} vCPU "
        f"{result.machine['cpu']}, PostgreSQL {result.server['server_version']}, "
        f"fsync={result.server['fsync']}, "
        f"synchronous_commit={result.server['synchronous_commit']}"
    )
    write_chart(
        opts.png_path,
        list(result.latency.values())
        + [c for s in result.scales for c in (s.submit, s.claim)],
        list(result.throughput.values()),
        title=title,
    )
    out.write(f"Chart written to {opts.png_path}\n")
