"""The phases of one run: worker pipelines, in-process cases and scale. Each fills
the shared ``BenchResult``; ``runner`` strings them together (with call_profiles)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from django.db import connection

from config.database import url_from_settings
from examples.bench.baselines import AgentLedger, HandRolled, agent_ledger_version
from examples.bench.broker_cases import ARGUMENTS, BrokerCases, bench_tenant
from examples.bench.environment import (
    BenchDatabase,
    Services,
    running_workers,
    sibling_database,
    use_database,
)
from examples.bench.floors import InsertFloor, ProcrastinateDefer
from examples.bench.options import BenchOptions
from examples.bench.pipeline import Pipeline
from examples.bench.report import BenchResult, ScaleResult
from examples.bench.scale import capture_plans, intent_count, label, seed_to
from examples.bench.stats import LatencyCase, ThroughputCase, time_calls

Say = Callable[[str], None]
WARMUP_BASE = 50_000_000  # warm-up calls use their own keys

#: Every per-call case, in table order: (key, group, label).
LATENCY_CASES = [
    ("floor_insert", "floor", "INSERT … ON CONFLICT, 1 row, commit (psycopg)"),
    ("floor_defer", "floor", "procrastinate defer, 1 no-op job (1 commit)"),
    ("floor_job", "floor", "bare procrastinate job, 1 worker: defer → done"),
    ("handrolled_new", "hand-rolled", "Django get_or_create → call → update"),
    ("handrolled_replay", "hand-rolled", "same key again (replay)"),
    ("agent_ledger", "agent-ledger", "begin + commit, new tool call"),
    ("broker_submit", "broker", "submit, new key (intent + event + job, 1 commit)"),
    ("broker_replay", "broker", "submit, existing key (replay)"),
    ("broker_inline", "broker", "submit + dispatch in-process (simulated target)"),
    ("broker_claim", "broker", "claim: load + fenced CAS + attempt row"),
    ("broker_e2e", "broker", "end to end, 1 worker: submit → receipt"),
    ("reconcile_idempotent", "reconcile", "lost response → receipt (idempotent)"),
    ("reconcile_reconcilable", "reconcile", "lost response → receipt (reconcilable)"),
]


def new_latency_cases() -> dict[str, LatencyCase]:
    """Empty cases in table order."""
    return {key: LatencyCase(key, text, group) for key, group, text in LATENCY_CASES}


def in_process(
    result: BenchResult,
    opts: BenchOptions,
    cases: BrokerCases,
    database_url: str,
    say: Say,
) -> None:
    """Floors, baselines and the broker's own calls, interleaved per repetition so
    that drift on the machine touches every case alike."""
    lat = result.latency
    floor = InsertFloor(database_url)
    defer = ProcrastinateDefer()
    handrolled = HandRolled(ARGUMENTS)
    agent: AgentLedger | None = None
    version = agent_ledger_version()
    if version is None:
        result.notes.append(
            "agent-ledger is not installed, so the broker-vs-agent-ledger target is not "
            "measured (pip install -e '.[bench]' adds it)"
        )
    else:
        try:
            agent = AgentLedger(database_url, ARGUMENTS)
            lat["agent_ledger"].label = f"agent-ledger {version}: " + (
                lat["agent_ledger"].label
            )
        except Exception as exc:  # a peer's failure must not stop our own figures
            result.notes.append(f"agent-ledger {version} could not run: {exc}")
    claimable: list[Any] = []
    runs: list[tuple[str, Callable[[int], object]]] = [
        ("floor_insert", floor.call),
        ("floor_defer", defer.call),
        ("handrolled_new", handrolled.call),
        ("handrolled_replay", handrolled.call),  # same indices: existing keys
        ("broker_submit", cases.submit_new),
        ("broker_replay", cases.submit_replay),
        ("broker_inline", cases.inline_cycle),
        ("broker_claim", lambda i: cases.claim(claimable[i])),
    ]
    if agent is not None:
        runs.insert(4, ("agent_ledger", agent.call))
    try:
        claimable[:] = [cases.prepare("claim-warm", i) for i in range(opts.warmup)]
        for key, call in runs:
            start = 0 if key == "broker_claim" else WARMUP_BASE
            time_calls(call, opts.warmup, start=start)
        for rep in range(opts.repetitions):
            say(f"      repetition {rep + 1}/{opts.repetitions}")
            first = rep * opts.samples
            claimable[:] = [
                cases.prepare("claim", first + i) for i in range(opts.samples)
            ]
            for key, call in runs:
                start = 0 if key == "broker_claim" else first
                lat[key].add_repetition(time_calls(call, opts.samples, start=start))
    finally:
        floor.close()
        if agent is not None:
            agent.close()


def pipelines(
    result: BenchResult,
    opts: BenchOptions,
    services: Services,
    pipeline: Pipeline,
    say: Say,
) -> None:
    """Bare procrastinate vs the broker through 1, 2, 4… worker processes; sequential
    latency and reconciliation with the fewest workers, and CPU per item of a drain
    on the one worker of the 1-worker pipeline (when it runs; else on its own)."""
    from examples.bench.dispatch_cpu import dispatch_cpu

    drain = min(300 if opts.quick else 1000, max(50, opts.items * 10))
    lat = result.latency
    first = min(opts.workers)
    seq = max(3, min(100, opts.samples))  # 300 by default: a p99, not the max
    for workers in opts.workers:
        dropped = pipeline.drain_stale_jobs()
        say(
            f"      {workers} worker(s): starting"
            + (f" ({dropped} stale jobs dropped)" if dropped else "")
        )
        jobs = ThroughputCase(
            f"jobs_{workers}w", "no-op jobs", "bare procrastinate", workers
        )
        broker = ThroughputCase(
            f"broker_{workers}w", "effects, simulated target", "broker", workers
        )
        with running_workers(services, workers) as running:
            warm = max(5, min(20, opts.items))
            pipeline.jobs_burst(warm)
            pipeline.broker_burst(warm)
            for rep in range(opts.bursts):
                for case, burst in (
                    (jobs, pipeline.jobs_burst(opts.items)),
                    (broker, pipeline.broker_burst(opts.items)),
                ):
                    case.rates.append(burst.steady_rate)
                    case.overall_rates.append(burst.overall_rate)
                    case.latencies.extend(burst.latencies)
                say(
                    f"      {workers} worker(s), burst {rep + 1}/{opts.bursts}: "
                    f"bare {jobs.rates[-1]:,.0f} jobs/s, broker "
                    f"{broker.rates[-1]:,.0f} effects/s"
                )
            if workers == first:
                _sequential(result, opts, pipeline, seq, say)
                _reconciliation(result, opts, services, pipeline, say)
            if workers == 1:
                say(f"      CPU per item: 1 worker drains {drain} queued items")
                dispatch_cpu(result, drain, services, pipeline, say, running[0])
        jobs.items = broker.items = opts.items
        result.throughput[jobs.key] = jobs
        result.throughput[broker.key] = broker
    if 1 not in opts.workers:
        say(f"      CPU per item: 1 worker drains {drain} queued items")
        dispatch_cpu(result, drain, services, pipeline, say)
    if 2 in opts.workers:
        _fresh_connections(result, opts, services, pipeline, say)
    if first != 1:
        for key in ("floor_job", "broker_e2e"):
            lat[key].label = lat[key].label.replace("1 worker", f"{first} workers")


def _fresh_connections(
    result: BenchResult,
    opts: BenchOptions,
    services: Services,
    pipeline: Pipeline,
    say: Say,
) -> None:
    """The broker with 2 workers that open a new connection per job (no pool,
    Django's default CONN_MAX_AGE=0): what the workers' connection pool is worth."""
    pipeline.drain_stale_jobs()
    case = ThroughputCase(
        "broker_2w_conn0",
        "effects, new DB connection per job (CONN_MAX_AGE=0)",
        "broker",
        2,
    )
    with running_workers(services, 2, pooled=False):
        pipeline.broker_burst(max(5, min(20, opts.items)))
        for _ in range(opts.bursts):
            burst = pipeline.broker_burst(opts.items)
            case.rates.append(burst.steady_rate)
            case.overall_rates.append(burst.overall_rate)
            case.latencies.extend(burst.latencies)
    case.items = opts.items
    result.throughput[case.key] = case
    say(
        f"      2 workers, a new connection per job: {case.median:,.0f} effects/s "
        "(median)"
    )


def _sequential(
    result: BenchResult, opts: BenchOptions, pipeline: Pipeline, n: int, say: Say
) -> None:
    lat = result.latency
    say(f"      one at a time: {opts.bursts} x {n} jobs and effects")
    for rep in range(opts.bursts):
        lat["floor_job"].add_repetition([pipeline.job_one() for _ in range(n)])
        lat["broker_e2e"].add_repetition(
            [pipeline.broker_one(rep * n + i) for i in range(n)]
        )


def _reconciliation(
    result: BenchResult,
    opts: BenchOptions,
    services: Services,
    pipeline: Pipeline,
    say: Say,
) -> None:
    lat = result.latency
    target = services.target
    say(
        f"      lost responses: {opts.reconcile_samples} idempotent, "
        f"{opts.reconcilable_samples} reconcilable"
    )
    lat["reconcile_idempotent"].add_repetition(
        [
            pipeline.reconcile_one(target, "idempotent", i)
            for i in range(opts.reconcile_samples)
        ]
    )
    lat["reconcile_reconcilable"].add_repetition(
        [
            pipeline.reconcile_one(target, "reconcilable", i)
            for i in range(opts.reconcilable_samples)
        ]
    )


@dataclass
class _Ledger:
    size: int
    database: str
    url: str
    cases: BrokerCases
    existing: Any
    seeded: int
    seed_seconds: float
    submit: LatencyCase
    claim: LatencyCase


def scales(
    result: BenchResult,
    opts: BenchOptions,
    cases: BrokerCases,
    db: BenchDatabase,
    say: Say,
) -> None:
    """One ledger per size (the run's own database for the smallest, a sibling for
    each larger one), seeded with generate_series; then submit and claim measured on
    them turn about, repetition by repetition, so drift on the machine touches every
    size alike; plans on the largest."""
    with ExitStack() as siblings:
        ledgers: list[_Ledger] = []
        for index, size in enumerate(opts.scales):
            name = label(size)
            database = db.name
            if index > 0:
                database = siblings.enter_context(sibling_database(db, name.lower()))
            use_database(database)
            own = cases if index == 0 else BrokerCases(bench_tenant())
            url = url_from_settings(connection.settings_dict)
            say(f"      ledger of {name} effects: seeding with generate_series")
            began = time.monotonic()
            seeded, notes = seed_to(url, size, own.tenant_id, progress=say)
            result.notes.extend(notes)
            ledgers.append(
                _Ledger(
                    size,
                    database,
                    url,
                    own,
                    own.submit_new_series("scale-replay", 0),
                    seeded,
                    time.monotonic() - began,
                    LatencyCase(
                        f"scale_{name}_submit", f"submit, {name} ledger", "scale"
                    ),
                    LatencyCase(f"scale_{name}_claim", f"claim, {name} ledger", "scale"),
                )
            )
        for rep in range(opts.repetitions):
            say(f"      repetition {rep + 1}/{opts.repetitions} on every ledger")
            for ledger in ledgers:
                use_database(ledger.database)  # a new backend: warm it up first
                _measure_scale(ledger, opts, rep)
        for ledger in ledgers:
            use_database(ledger.database)
            result.scales.append(
                ScaleResult(
                    ledger.size,
                    label(ledger.size),
                    intent_count(ledger.url),
                    ledger.seeded,
                    ledger.seed_seconds,
                    ledger.submit,
                    ledger.claim,
                )
            )
        largest = ledgers[-1]
        use_database(largest.database)
        # A few calls first, so plan times are not those of a cold backend.
        for i in range(5):
            largest.cases.claim(largest.cases.prepare("plan-warm", i))
        result.plans = capture_plans(largest.cases, largest.existing)
        result.plans_at = f"{label(largest.size)} ({intent_count(largest.url):,}-row)"
        use_database(db.name)


def _measure_scale(ledger: _Ledger, opts: BenchOptions, rep: int) -> None:
    """One repetition of submit and claim on ``ledger``, after a warm-up."""
    cases = ledger.cases
    prefix = f"scale{ledger.size}"

    def submit_one(i: int) -> object:
        return cases.submit_new_series(prefix, i)

    def claimer(records: list[Any]) -> Callable[[int], object]:
        return lambda i: cases.claim(records[i])

    warm_start = WARMUP_BASE + rep * opts.warmup
    warm = [cases.prepare(f"{prefix}-warm", warm_start + i) for i in range(opts.warmup)]
    time_calls(claimer(warm), opts.warmup)
    time_calls(submit_one, opts.warmup, start=warm_start)
    first = rep * opts.samples
    ledger.submit.add_repetition(time_calls(submit_one, opts.samples, start=first))
    ready = [cases.prepare(f"{prefix}-claim", first + i) for i in range(opts.samples)]
    ledger.claim.add_repetition(time_calls(claimer(ready), opts.samples))
