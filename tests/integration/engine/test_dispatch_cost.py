"""Issue 13, the dispatch path down to what it must do: one read, two fenced commits
around the call (the claim before any I/O, the outcome after), and no thread started
per dispatch (the lease heartbeat is one thread per process)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from effect_broker import store
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.services import deadlines, lease
from effect_broker.services.dispatch import dispatch
from effect_broker.services.lease import LeaseKeeper
from effect_broker.services.lease_heartbeat import HEARTBEATS
from effect_broker.services.runtime import get_runtime, override
from tests.integration.engine.harness import TIMING, Bench, engine_bench

IDEMPOTENT = SafetyClass.IDEMPOTENT


@pytest.fixture
def committed_bench(transactional_db: None) -> Iterator[Bench]:
    """Committed rows: the heartbeat thread writes on its own connection."""
    with engine_bench() as b:
        yield b


def _writes(sql: str) -> bool:
    return not sql.lstrip().upper().startswith("SELECT")


def test_a_dispatch_job_body_is_one_read_and_two_fenced_commits(committed_bench) -> None:
    """Counted on the connection, in autocommit as a worker runs it: every statement
    commits on its own, so the statements that write are the commits."""
    record = committed_bench.submit(IDEMPOTENT)
    statements: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    assert connection.get_autocommit()
    with connection.execute_wrapper(count):
        done = dispatch(record.effect_id, worker="w1")
    assert done.status is EffectStatus.SUCCEEDED
    writes = [sql for sql in statements if _writes(sql)]
    assert len(writes) == 2, writes  # the claim, then the outcome
    assert all(" ".join(sql.split()).startswith("WITH cas") for sql in writes), writes
    assert len(statements) == 3, statements  # and one read of row + sealed arguments
    attempt_rows = store.load_effect_for_worker(record.effect_id)
    assert attempt_rows.attempt_count == 1


def _claimed(bench: Bench, heartbeat_ms: int = 50) -> tuple[Any, Any]:
    rt = replace(
        get_runtime(),
        timing=replace(TIMING, heartbeat=timedelta(milliseconds=heartbeat_ms)),
    )
    record = bench.submit(IDEMPOTENT)
    contract = bench.registry.for_tool("idempotent_charge")
    claimed, _ = store.start_attempt(
        record,
        worker="w1",
        now=bench.clock.now(),
        changes=deadlines.claim_changes(rt, record, contract, worker="w1"),
    )
    return claimed, rt


def _keeper(claimed: Any, rt: Any) -> LeaseKeeper:
    return LeaseKeeper(
        rt,
        claimed,
        worker="w1",
        claimed_at=rt.clock.monotonic(),
        attempt_limit=timedelta(seconds=60),
    )


def _wait_for(condition: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def test_dispatches_start_no_thread_of_their_own(committed_bench) -> None:
    # The harness turns heartbeats off; a worker's runtime has them on.
    beating = replace(TIMING, heartbeat=timedelta(seconds=10))
    with override(timing=beating):
        _dispatch_with_a_spy_on_threads(committed_bench)


def _dispatch_with_a_spy_on_threads(committed_bench: Bench) -> None:
    assert get_runtime().timing.heartbeat > timedelta(0)
    for _ in range(3):  # warm: the process's one heartbeat thread may start here
        dispatch(committed_bench.submit(IDEMPOTENT).effect_id, worker="w1")
    before = HEARTBEATS.threads_started
    started: list[str] = []
    real_start = threading.Thread.start

    def spy(thread: threading.Thread) -> None:
        started.append(thread.name)
        real_start(thread)

    threading.Thread.start = spy  # type: ignore[method-assign]
    try:
        for _ in range(5):
            dispatch(committed_bench.submit(IDEMPOTENT).effect_id, worker="w1")
    finally:
        threading.Thread.start = real_start  # type: ignore[method-assign]
    assert started == []
    assert HEARTBEATS.threads_started == before
    assert HEARTBEATS.active() == 0  # every keeper left the registry


def test_one_thread_beats_for_every_lease_in_flight(committed_bench) -> None:
    first, rt = _claimed(committed_bench)
    second, _ = _claimed(committed_bench)
    with _keeper(first, rt) as a, _keeper(second, rt) as b:
        _wait_for(lambda: a.current().version > first.version + 1)
        _wait_for(lambda: b.current().version > second.version + 1)
        a.check()
        b.check()
        beating = [t for t in threading.enumerate() if t.name == "lease-heartbeat"]
        assert len(beating) == 1
    assert HEARTBEATS.active() == 0
    # Each keeper holds the newest version: the outcome writer is not fenced out.
    assert store.load_effect_for_worker(first.effect_id).version == a.current().version
    assert store.load_effect_for_worker(second.effect_id).version == b.current().version


def test_leaving_waits_for_a_beat_in_flight(committed_bench, monkeypatch) -> None:
    """The outcome is written with ``current()`` after the keeper exits: a beat that
    lands later would fence that write out, so exit waits for it."""
    claimed, rt = _claimed(committed_bench)
    entered, release = threading.Event(), threading.Event()
    real_touch = store.touch

    def slow_touch(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(5)
        return real_touch(*args, **kwargs)

    monkeypatch.setattr(lease.store, "touch", slow_touch)
    keeper = _keeper(claimed, rt)
    keeper.__enter__()
    assert entered.wait(5)
    left = threading.Event()

    def leave() -> None:
        keeper.__exit__(None, None, None)
        left.set()

    leaver = threading.Thread(target=leave)
    leaver.start()
    assert not left.wait(0.2)  # the beat is still in flight
    release.set()
    leaver.join(5)
    assert left.is_set()
    assert keeper.current().version == claimed.version + 1
    assert store.load_effect_for_worker(claimed.effect_id).version == (
        keeper.current().version
    )
