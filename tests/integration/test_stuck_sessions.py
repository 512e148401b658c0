"""Issue 19 item 7 on the real database: no session that holds a lock and stops (a
frozen worker, a stuck operator shell) stalls the sweeper or a job.

Each test holds a lock from an outside session, the way a frozen process would, and
releases it from a timer after ``HELD_FOR`` seconds, so on code that waits without
bound the test fails on its time assertion instead of hanging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from procrastinate.contrib.django.utils import connector_params

from effect_broker import tasks
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectAttempt
from effect_broker.services.dispatch import dispatch
from effect_broker.services.sweeper import sweep
from effect_broker.store import load_effect_for_worker
from effect_broker.store.lock_waits import (
    SWEEP_LOCK_KEY,
    rebound_after_migrations,
    unbound_for_migrations,
)
from tests.integration.engine.harness import Bench, WorkerKilled, engine_bench

#: How long the outside session holds its lock: far longer than any bounded wait here.
HELD_FOR = 4.0


@pytest.fixture
def committed_bench(transactional_db: None) -> Iterator[Bench]:
    """The engine bench without a wrapping transaction: an outside session sees and
    locks what the engine commits."""
    with engine_bench() as b:
        yield b


@contextmanager
def held(statement: str, params: list[object]) -> Iterator[None]:
    """An outside session runs ``statement`` in an open transaction; its locks are
    released when the block ends or ``HELD_FOR`` has passed, whichever comes first."""
    conn = psycopg.connect(**connector_params())
    conn.execute(statement, params)
    timer = threading.Timer(HELD_FOR, conn.rollback)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        conn.rollback()
        conn.close()


def show(name: str) -> str:
    with connection.cursor() as cur:
        cur.execute(f"SHOW {name}")
        return str(cur.fetchone()[0])


def status(record) -> EffectStatus:  # type: ignore[no-untyped-def]
    return load_effect_for_worker(record.effect_id).status


def test_every_session_starts_with_bounded_lock_idle_and_statement_times(
    db: None,
) -> None:
    # Django's connection, and one from the parameters procrastinate's worker pool uses
    assert (
        show("lock_timeout"),
        show("idle_in_transaction_session_timeout"),
        show("statement_timeout"),
    ) == ("5s", "30s", "10min")
    with psycopg.connect(**connector_params()) as worker_pool_conn:
        row = worker_pool_conn.execute(
            "SELECT current_setting('lock_timeout'), "
            "current_setting('idle_in_transaction_session_timeout'), "
            "current_setting('statement_timeout')"
        ).fetchone()
    assert row == ("5s", "30s", "10min")


def test_migrate_runs_without_statement_and_lock_timeouts_then_restores_them(
    transactional_db: None,
) -> None:
    unbound_for_migrations()
    assert (show("statement_timeout"), show("lock_timeout")) == ("0", "0")
    rebound_after_migrations()
    assert (show("statement_timeout"), show("lock_timeout")) == ("10min", "5s")
    call_command("migrate", verbosity=0)
    assert (show("statement_timeout"), show("lock_timeout")) == ("10min", "5s")


def test_the_sweep_skips_a_row_another_session_holds_and_handles_the_rest(
    committed_bench: Bench,
) -> None:
    # Given two effects whose worker died after its claim, both leases expired
    bench = committed_bench
    records = []
    for _ in range(2):
        record = bench.submit(SafetyClass.IDEMPOTENT)
        bench.switch.when = "after_commit"  # the next dispatch dies
        with pytest.raises(WorkerKilled):
            dispatch(record.effect_id, worker="w1")
        records.append(record)
    bench.advance(31)
    held_record, free_record = records
    # When an outside session holds the first one's row, and a sweep runs
    with held(
        "SELECT id FROM effect_intents WHERE id = %s FOR UPDATE", [held_record.effect_id]
    ):
        started = time.monotonic()
        with transaction.atomic():
            report = sweep(actor="sweeper")
        took = time.monotonic() - started
        # Then the sweep did not wait for it, and expired the other lease
        assert took < 1.0, f"the sweep waited {took:.1f}s on a held row"
        assert report.leases_expired == 1
        assert status(free_record) is EffectStatus.OUTCOME_UNKNOWN
        assert status(held_record) is EffectStatus.DISPATCHING
    # ... and the next sweep, the row released, expires that one too
    assert sweep(actor="sweeper").leases_expired == 1
    assert status(held_record) is EffectStatus.OUTCOME_UNKNOWN


def test_only_one_sweep_runs_at_a_time(committed_bench: Bench) -> None:
    # Given a sweep in progress elsewhere (it holds the sweep's advisory lock)
    with held("SELECT pg_advisory_xact_lock(%s)", [SWEEP_LOCK_KEY]):
        # When another sweep starts, it returns at once without sweeping
        started = time.monotonic()
        assert tasks.run_sweep(actor="second") is False
        assert time.monotonic() - started < 1.0
    # ... and once the first one is over, the next sweep runs
    assert tasks.run_sweep(actor="next") is True


def test_a_job_that_gave_up_waiting_for_a_row_is_deferred_again_not_failed(
    committed_bench: Bench,
) -> None:
    # Given an effect whose row an outside session holds, and a short lock wait
    bench = committed_bench
    record = bench.submit(SafetyClass.IDEMPOTENT)
    bench.scheduler.requests.clear()
    with connection.cursor() as cur:
        cur.execute("SET lock_timeout = '100ms'")
    try:
        with held(
            "SELECT id FROM effect_intents WHERE id = %s FOR UPDATE", [record.effect_id]
        ):
            # When its dispatch job runs
            started = time.monotonic()
            tasks.retry_later_if_busy(
                "dispatch",
                record.effect_id,
                lambda: dispatch(record.effect_id, worker="w1"),
            )
            took = time.monotonic() - started
    finally:
        with connection.cursor() as cur:
            cur.execute("RESET lock_timeout")
    # Then it gave up waiting, and asked for the dispatch again a second later
    assert took < 1.0
    [(kind, effect_id, at)] = bench.scheduler.requests
    assert (kind, effect_id) == ("dispatch", record.effect_id)
    assert at == bench.clock.now() + timedelta(seconds=1)
    # ... and the effect is untouched: not claimed, not failed, nothing sent
    assert status(record) is EffectStatus.PREPARED
    assert EffectAttempt.objects.filter(effect_id=record.effect_id).count() == 0
    assert bench.target_rows(record) == 0
