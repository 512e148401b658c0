"""Workers that outlive the database (issue 11): real ``effect-broker worker``
processes, a real API, a real target, and a PostgreSQL server SIGKILLed under load.

A fault test crashed the broker's database 8 times: every worker exited after every
crash (exit code 0) and nothing restarted them. Here the database is killed while
charges stream in and comes back through crash recovery; the workers that were
running before must be the ones that finish the work, and none may exit.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest
from django.conf import settings

from examples.crash_matrix.contracts import TOOLS, write_contracts
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import ROOT, WorkerProcess, broker_env, wait_until
from tests.acceptance.outage_stack import (
    ApiServer,
    PrivatePostgres,
    migrated_with_tenant,
    submit,
)

pytestmark = pytest.mark.slow

SCENARIO = "idempotent"
#: Seconds of load before the kill, of outage, and of load once the API accepts again.
BEFORE, DOWN, AFTER = 1.5, 2.0, 3.0


@dataclass
class Stack:
    postgres: PrivatePostgres
    url: str
    env: dict[str, str]
    target: TargetProcess
    api: ApiServer
    api_key: str

    def ledger(self) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True, connect_timeout=5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = Path(tmp_path_factory.mktemp("worker-outage"))
    postgres = PrivatePostgres(root)
    target: TargetProcess | None = None
    api: ApiServer | None = None
    try:
        url = postgres.url("eb_worker_outage")
        # The target keeps its table on the same server, as in the crash matrix: it
        # lives through the crash too.
        target = start_target(url, settlement_delay="500ms", schema="outage_target")
        contracts = write_contracts(
            root / "contracts.toml", target.url, settlement_bound="1s", timeout="10s"
        )
        env = broker_env(url, contracts, settings.EFFECT_BROKER_MASTER_KEY)
        api_key = migrated_with_tenant(env)
        api = ApiServer({**env, "EFFECT_BROKER_API_DB_POOL_TIMEOUT": "1"})
        yield Stack(postgres, url, env, target, api, api_key)
    finally:
        postgres.start()  # a failed test may have left it down
        if api is not None:
            api.stop()
        if target is not None:
            target.stop()
        postgres.remove()


@dataclass
class Load:
    """An agent submitting a new charge every 50 ms through the API."""

    stack: Stack
    #: (operation key, when the API accepted it) for every 2xx answer.
    accepted: list[tuple[str, float]] = field(default_factory=list)
    #: (status, problem code) of every other answer.
    refused: list[tuple[int, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        run = uuid.uuid4().hex[:8]
        with httpx.Client(base_url=self.stack.api.url, trust_env=False) as client:
            serial = 0
            while not self.stop.is_set():
                serial += 1
                key = f"load:{run}:{serial}"
                body = {"order": str(serial), "amount_minor": 1999, "currency": "EUR"}
                answer = submit(client, self.stack.api_key, TOOLS[SCENARIO], key, body)
                if answer.is_success:
                    self.accepted.append((key, time.monotonic()))
                else:
                    code = answer.json().get("code", "?") if answer.content else "?"
                    self.refused.append((answer.status_code, code))
                self.stop.wait(0.05)


def submit_until_accepted(stack: Stack, key: str, body: dict[str, object]) -> None:
    """Submit, resending a 503 as the SDK would (an earlier test may have restarted
    the database; the API's pool may still be reconnecting)."""
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=stack.api.url, trust_env=False) as client:
        while True:
            answer = submit(client, stack.api_key, TOOLS[SCENARIO], key, body)
            if answer.is_success:
                return
            assert answer.status_code == 503, answer.text
            assert time.monotonic() < deadline, "the API did not accept the charge"
            time.sleep(0.5)


def settled(stack: Stack, keys: list[str]) -> dict[str, tuple[str, str]] | None:
    """status and downstream key per operation key, once none is still moving."""
    with stack.ledger() as conn:
        rows = conn.execute(
            "SELECT operation_key, status, downstream_key FROM effect_intents "
            "WHERE operation_key = ANY(%s)",
            [keys],
        ).fetchall()
    found = {key: (status, downstream) for key, status, downstream in rows}
    moving = [s for s, _ in found.values() if s not in ("succeeded", "failed_final")]
    return found if len(found) == len(keys) and not moving else None


def worker_pids_in_attempts(stack: Stack, keys: list[str]) -> set[int]:
    """The pids named by the attempts of these effects (``name:pid:jobN``)."""
    with stack.ledger() as conn:
        rows = conn.execute(
            "SELECT DISTINCT a.worker FROM effect_attempts a JOIN effect_intents e "
            "ON e.id = a.effect_id WHERE e.operation_key = ANY(%s)",
            [keys],
        ).fetchall()
    return {int(worker.split(":")[1]) for (worker,) in rows}


def test_the_same_workers_finish_the_work_after_the_database_crashes_under_load(
    stack: Stack,
) -> None:
    # Given two workers, warmed up on one charge
    workers = [WorkerProcess(f"survivor{i}", stack.env, concurrency=2) for i in (1, 2)]
    pids = {w.pid for w in workers}
    load = Load(stack)
    try:
        warm = f"warm:{uuid.uuid4()}"
        submit_until_accepted(
            stack, warm, {"order": "0", "amount_minor": 1, "currency": "EUR"}
        )
        wait_until(lambda: settled(stack, [warm]), timeout=60, what="the warm-up")
        # When the database is SIGKILLed while charges stream in, and comes back
        agent = threading.Thread(target=load.run)
        agent.start()
        try:
            time.sleep(BEFORE)
            stack.postgres.kill()
            time.sleep(DOWN)
            back = stack.postgres.start()
            back_wall = time.time()
            wait_until(
                lambda: [at for _, at in load.accepted if at > back],
                timeout=60,
                what="the API to accept charges again",
            )
            time.sleep(AFTER)
        finally:
            load.stop.set()
            agent.join()
        keys = [key for key, _ in load.accepted]
        outcome = wait_until(
            lambda: settled(stack, keys), timeout=120, what="every accepted charge"
        )
        # Then every accepted charge succeeded with exactly one target charge
        assert {status for status, _ in outcome.values()} == {"succeeded"}
        charges = {
            key: stack.target.count_by_key(SCENARIO, downstream)
            for key, (_, downstream) in outcome.items()
        }
        assert set(charges.values()) == {1}, charges
        # ... the load spanned the crash, and the API refused only with a retryable 503
        assert [k for k, at in load.accepted if at < back], "no charge before the crash"
        assert [k for k, at in load.accepted if at > back], "no charge after the crash"
        assert load.refused, "the outage was not felt by the API"
        assert {status for status, _ in load.refused} == {503}, load.refused
        retryable = {"database_unavailable", "overloaded"}
        assert {code for _, code in load.refused} <= retryable, load.refused
        # ... and the same worker processes did the work: none exited, none replaced
        for worker in workers:
            assert worker.alive(), worker.log_tail()
        logs = [w.log_path.read_text(errors="replace") for w in workers]
        # procrastinate stopped at least one of them (the fault issue 11 saw), and
        # its supervisor ran it again; when a worker's heartbeat and listener only
        # waited for the pool while the database was away, it never stopped at all.
        restarted = [log for log in logs if "database answers again" in log]
        assert restarted, logs
        assert all("worker stopped without a stop request" in log for log in restarted)
        assert worker_pids_in_attempts(stack, keys) <= pids
        _report_recovery(stack, back_wall)
        # And SIGTERM still stops each one gracefully, exit code 0
        for worker in workers:
            worker.process.send_signal(signal.SIGTERM)
        assert [w.wait(timeout=60) for w in workers] == [0, 0]
    finally:
        for worker in workers:
            worker.stop()


def _report_recovery(stack: Stack, back_wall: float) -> None:
    """Print (never assert) how long after the database answered a job finished."""
    with stack.ledger() as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM min(at)) FROM procrastinate_events "
            "WHERE type = 'succeeded' AND at > to_timestamp(%s)",
            [back_wall],
        ).fetchone()
    first = float(row[0]) if row and row[0] is not None else None
    took = "no job" if first is None else f"{first - back_wall:.2f}s"
    print(f"\nrecovery: database answering -> first job succeeded: {took}")


def test_a_worker_started_while_the_database_is_down_waits_then_works(
    stack: Stack,
) -> None:
    # Given a database that is down when the worker starts
    stack.postgres.stop()
    worker = WorkerProcess("early", stack.env, concurrency=1)
    try:
        # When it waits (saying so each time), then the database comes up
        wait_until(
            lambda: worker.log_tail(50).count("database unavailable for") >= 2,
            timeout=60,
            what="the worker's waiting lines",
        )
        assert worker.alive(), worker.log_tail()
        stack.postgres.start()
        # Then it runs the work
        key = f"early:{uuid.uuid4()}"
        submit_until_accepted(
            stack, key, {"order": "1", "amount_minor": 5, "currency": "EUR"}
        )
        outcome = wait_until(lambda: settled(stack, [key]), timeout=60, what="the charge")
        assert outcome[key][0] == "succeeded"
        assert worker_pids_in_attempts(stack, [key]) == {worker.pid}
    finally:
        stack.postgres.start()
        worker.stop()


def test_max_outage_gives_up_with_exit_code_3_and_one_line(stack: Stack) -> None:
    # Given a database that stays down
    stack.postgres.stop()
    try:
        # When a worker may wait at most 1 second for it
        done = subprocess.run(
            [sys.executable, "-m", "effect_broker.cli", "worker", "--max-outage", "1"],
            cwd=ROOT,
            env=stack.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        stack.postgres.start()
    # Then it exits 3 (never 0) and says why in one line
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == (
        "effect-broker worker: gave up: the database did not answer for --max-outage 1s"
    )
    assert "Traceback" not in done.stderr


def test_a_worker_waits_for_migrations_and_a_reconciler_runs_only_its_queues(
    stack: Stack,
) -> None:
    # Given a database where nobody ran the migrations yet
    bare = {**stack.env, "DATABASE_URL": stack.postgres.url("eb_not_migrated")}
    worker = WorkerProcess("patient", bare, concurrency=1)
    try:
        # Then the worker says what it waits for, and keeps waiting
        wait_until(
            lambda: (
                "procrastinate's tables are missing: run `effect-broker migrate`"
                in worker.log_tail()
            ),
            timeout=60,
            what="the worker to name the missing migrations",
        )
        assert worker.alive()
    finally:
        worker.stop()
    # And a reconciler announces the reconcile and maintenance queues, never dispatch,
    # and stops with 0 on SIGTERM
    reconciler = subprocess.Popen(
        [sys.executable, "-m", "effect_broker.cli", "reconciler"],
        cwd=ROOT,
        env=stack.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert reconciler.stdout is not None
    seen = []
    for line in reconciler.stdout:  # log lines (procrastinate's) may come first
        seen.append(line)
        if line.startswith("effect-broker reconciler: pid "):
            break
    assert "queues reconcile, maintenance, concurrency 2" in seen[-1], seen
    time.sleep(1)
    reconciler.send_signal(signal.SIGTERM)
    rest, _ = reconciler.communicate(timeout=60)  # also closes the pipe
    assert reconciler.returncode == 0, rest


def test_sigterm_lets_the_running_job_finish_then_exits_0(stack: Stack) -> None:
    # Given a worker in the middle of a slow charge (the target answers after 2 s; a
    # 10 s lease, so a loaded machine cannot push the attempt past its time limit)
    lease = {"EFFECT_BROKER_LEASE_SECONDS": "10", "EFFECT_BROKER_HEARTBEAT_SECONDS": "3"}
    worker = WorkerProcess("graceful", {**stack.env, **lease}, concurrency=1)
    try:
        stack.target.inject("slow_after_commit", times=1, seconds=2.0)
        key = f"graceful:{uuid.uuid4()}"
        submit_until_accepted(
            stack, key, {"order": "7", "amount_minor": 700, "currency": "EUR"}
        )

        def dispatching() -> bool:
            with stack.ledger() as conn:
                row = conn.execute(
                    "SELECT status FROM effect_intents WHERE operation_key = %s", [key]
                ).fetchone()
            return bool(row) and row[0] == "dispatching"

        wait_until(dispatching, timeout=60, what="the charge to be in flight")
        # When it is asked to stop
        worker.process.send_signal(signal.SIGTERM)
        # Then it finishes that charge first, and exits 0
        assert worker.wait(timeout=60) == 0, worker.log_tail()
        log = worker.log_path.read_text(errors="replace")
        assert "stop requested: finishing running jobs" in log
        assert "Waiting for job to finish" in log  # procrastinate: it was in flight
        outcome = settled(stack, [key])
        if outcome is None:
            with stack.ledger() as conn:
                events = conn.execute(
                    "SELECT v.event_type, v.new_status, v.actor FROM effect_events v "
                    "JOIN effect_intents e ON e.id = v.effect_id "
                    "WHERE e.operation_key = %s ORDER BY v.sequence",
                    [key],
                ).fetchall()
            pytest.fail(
                f"the running charge was not finished: {events}\n{worker.log_tail()}"
            )
        status, downstream = outcome[key]
        assert status == "succeeded"
        assert stack.target.count_by_key(SCENARIO, downstream) == 1
    finally:
        worker.stop()
