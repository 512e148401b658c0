"""Committed transactions per dispatched effect, counted by PostgreSQL (issue 13).

A real ``effect-broker worker`` process drains effects of the in-process simulated
target, and ``pg_stat_database.xact_commit`` (which counts every autocommit statement,
an empty query included) is read around it. A second window runs the same worker for
as long with nothing to do; the difference, per effect, is what a dispatch costs:

    procrastinate fetch                                           1
    dispatch read, claim (store)                                  2
    outcome, finishing the job in the same statement (issue 25)   1
    the worker's LISTEN backend reading the outcome's NOTIFY      1 (or less: one
        read serves every NOTIFY that arrived meanwhile)

PostgreSQL wakes every listening backend of the database for every NOTIFY, whatever
its channel. Before ``store.pool_checks`` both pools sent an empty query on every
checkout (3 more per effect), and before migration 0014 the claim notified too (1
more): ~10 in all, and this test failed. Before issue 25 procrastinate finished the
job in a transaction of its own after the outcome's (1 more).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from config.database import url_from_settings
from effect_broker.domain.contracts import load_contracts
from effect_broker.services import runtime
from examples.bench.broker_cases import BrokerCases, bench_tenant
from examples.bench.environment import (
    PRODUCTION_TIMING,
    SIMULATED_CONTRACT,
    BenchDatabase,
)
from examples.bench.wal_meter import TABLES, Meter
from examples.crash_matrix.workers import WorkerProcess, broker_env, wait_until
from tests.job_tables import forget_old_jobs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

EFFECTS = 60
#: Each window runs its worker this long (the drain takes well under it).
WINDOW_SECONDS = 8.0
#: Per effect: 4 statements + at most 1 NOTIFY read, + noise: measured 4.82 alone and
#: 5.80 inside the whole suite on 2 vCPUs (not broken down; more empty fetches and
#: NOTIFY reads under load, each a commit of its own, are the likely part).
#: ~10 before issue 13; 6-7 before issue 25, when this bound was 6.5.
MAX_COMMITS_PER_EFFECT = 6.0


@pytest.fixture
def meter(tmp_path: Path) -> Iterator[tuple[Meter, dict[str, str]]]:
    connection.ensure_connection()
    forget_old_jobs()
    url = url_from_settings(connection.settings_dict)
    db = BenchDatabase(
        url,
        str(connection.settings_dict["NAME"]),
        "test database",
        url_from_settings(connection.settings_dict, dbname="postgres"),
    )
    contracts = tmp_path / "contracts.toml"
    contracts.write_text(SIMULATED_CONTRACT, encoding="utf-8")
    env = broker_env(
        url,
        contracts,
        settings.EFFECT_BROKER_MASTER_KEY,
        extra={**PRODUCTION_TIMING, "DEBUG": "0"},
    )
    meter = Meter(db)
    # An autovacuum worker's transactions count too: none inside the windows.
    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    runtime.reset()
    try:
        with runtime.override(registry=load_contracts(contracts)):
            yield meter, env
    finally:
        runtime.reset()
        meter.close()
        with psycopg.connect(url, autocommit=True) as conn:
            for table in TABLES:
                conn.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


def _window(
    meter: Meter, env: dict[str, str], until: Callable[[], None], name: str
) -> int:
    """Commits in the test database while one worker starts, runs ``until`` and
    stops; this process's own polls and flushes are subtracted."""
    with connection.cursor() as cursor:  # our submits report before the window
        cursor.execute("SELECT pg_stat_force_next_flush()")
    connection.close()
    time.sleep(0.2)
    baseline = meter.backends()
    before = meter.read()
    worker = WorkerProcess(name, env, concurrency=1)
    try:
        started = time.monotonic()
        wait_until(
            lambda: meter.backends() > baseline + 2,
            timeout=60,
            what="the worker to connect",
        )
        until()
        time.sleep(max(0.0, WINDOW_SECONDS - (time.monotonic() - started)))
    finally:
        worker.stop(timeout=15)
    meter.settle(baseline)  # a backend reports what is left when it exits
    own = meter.flush_polls()
    return (meter.read() - before).commits - own


def test_a_dispatched_effect_costs_its_statements_and_no_pool_checks(
    meter: tuple[Meter, dict[str, str]],
) -> None:
    m, env = meter
    idle = _window(m, env, lambda: None, "commits-idle")
    cases = BrokerCases(bench_tenant("commits"))
    effects = [cases.submit_new_series("commits", i).effect_id for i in range(EFFECTS)]

    def drained() -> None:
        m.wait_for(
            "SELECT count(*) FROM effect_receipts WHERE effect_id = ANY(%s::uuid[])",
            [effects],
            EFFECTS,
            timeout=WINDOW_SECONDS - 2,
        )

    busy = _window(m, env, drained, "commits-busy")
    per_effect = (busy - idle) / EFFECTS
    assert per_effect <= MAX_COMMITS_PER_EFFECT, (
        f"{per_effect:.2f} commits per dispatched effect (busy window {busy}, idle "
        f"{idle}); fetch, read, claim and outcome (with the job's finish) are 4, "
        "the LISTEN backend's read of the outcome's NOTIFY at most 1 more"
    )
    # And the count is real: the four statements are there.
    assert per_effect >= 4
