"""The soak as a phase of ``effect-broker bench``: on its own scratch database, either
alone (``--soak``) or after every other phase (``--with-soak``, one Targets table with
every row)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from django.conf import settings

from effect_broker.domain.contracts import load_contracts
from effect_broker.services import runtime
from examples.bench.broker_cases import BrokerCases, bench_tenant
from examples.bench.environment import (
    Services,
    machine,
    scratch_database,
    server_settings,
)
from examples.bench.options import BenchOptions
from examples.bench.report import BenchResult
from examples.bench.runner import Output, Progress, report
from examples.bench.soak import TOOL, run_soak
from examples.bench.soak_options import SoakOptions


def run_soak_bench(out: Output, opts: BenchOptions) -> int:
    """``--soak``: prepare, soak, print and write; return the exit code."""
    assert opts.soak is not None
    progress = Progress(out, 1)
    settings.DEBUG = False  # as runner.run: measure what production runs
    result = BenchResult(
        started_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=machine(),
        server={},
        where="",
        options=opts.to_json(),
    )
    soak_phase(result, opts.soak, progress)
    # No latency chart: a soak's figures are per window, in the table and the JSON.
    report(out, dataclasses.replace(opts, png_path=None), result, progress)
    return 0


def soak_phase(result: BenchResult, opts: SoakOptions, progress: Progress) -> None:
    """One numbered step: a soak on a fresh scratch database (the other phases leave
    rows and finished jobs behind that are not the soak's), its figures in
    ``result.soak``."""
    progress.next(
        "soak: own scratch database, 2 worker processes, one SIGKILLed on schedule"
    )
    with scratch_database() as db:
        if not result.server:
            result.server = server_settings(db.url)
            result.where = db.where
        services = Services(db.url)
        try:
            runtime.reset()
            with runtime.override(registry=load_contracts(services.contracts)):
                cases = BrokerCases(bench_tenant("soak"), tool=TOOL)
                result.soak = run_soak(opts, services, cases, progress.say)
        finally:
            services.close()
            runtime.reset()
        progress.say("      dropping the soak's scratch database")
