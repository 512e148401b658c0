"""``effect-broker bench --soak``: the soak on its own scratch database, then its
report (the other phases do not run: a soak is long and measures something else)."""

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


def run_soak_bench(out: Output, opts: BenchOptions) -> int:
    """Prepare, soak, print and write; return the exit code."""
    assert opts.soak is not None
    progress = Progress(out, 3)
    settings.DEBUG = False  # as runner.run: measure what production runs
    progress.next("preparing: own embedded server, scratch database, migrations, target")
    with scratch_database() as db:
        result = BenchResult(
            started_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            machine=machine(),
            server=server_settings(db.url),
            where=db.where,
            options=opts.to_json(),
        )
        services = Services(db.url)
        try:
            runtime.reset()
            with runtime.override(registry=load_contracts(services.contracts)):
                cases = BrokerCases(bench_tenant("soak"), tool=TOOL)
                progress.next("soak: 2 worker processes, one SIGKILLed on schedule")
                result.soak = run_soak(opts.soak, services, cases, progress.say)
        finally:
            services.close()
            runtime.reset()
        progress.next("dropping the scratch database")
    # No latency chart: a soak's figures are per window, in the table and the JSON.
    report(out, dataclasses.replace(opts, png_path=None), result, progress)
    return 0
