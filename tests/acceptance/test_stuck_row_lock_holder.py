"""Issue 19, item 7: one worker stuck while it holds an effect's row lock must not stop
dispatch cluster-wide.

The issue's reproduction: a worker frozen (SIGSTOP: a VM stall, a partition) inside an
open transaction that holds an effect row lock. Every sweep then waited on that lock
without a timeout, a new one started every second, and within ~7 s every job slot of
the healthy workers was taken; nothing finished until the frozen worker resumed.

The frozen transaction here is the worker's own: the one that records a refused
attempt (``outcomes.record_retryable``: the fenced transition to RETRYABLE, then the
retry's job, one commit). Worker A claims an idempotent effect (DISPATCHING, lease
committed), the target refuses it (429, not committed), and A's transition takes the
intent row's lock. Its retry job's insert then waits, because an outside session holds
an uncommitted job with the same queueing lock; A is frozen (SIGSTOP) while it waits,
the outside session rolls back, and the insert completes server-side: A's session sits
idle in its transaction, holding the row lock of a DISPATCHING effect whose lease runs
out, as a worker frozen between two statements would. With A frozen:

* two healthy workers still settle 20 other effects within 30 s, although they are
  submitted after the lease and stalled-job times (when every sweep meets the lock);
* the server ends A's session (``idle_in_transaction_session_timeout``, its documented
  default), which rolls its transition back and releases the lock; the expired lease
  is then taken over as usual and the effect charges exactly once (the target's own
  table, by key);
* thawed, A writes nothing: its transaction died with its session.

The second test freezes the other shape: a transactional dispatch's own transaction
(claim done, mutation not run), whose row is locked while its committed state is still
PREPARED; once the server ended the session the claim is rolled back and another
worker applies the effect exactly once (the local table, counted by key).

Every worker runs with the documented timeout defaults (none is set here).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from effect_broker import failpoints, store
from effect_broker.adapters.simulated_adapter import local_effect_count
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectAttempt, Tenant
from effect_broker.scheduling import DISPATCH_TASK
from effect_broker.services.submission import submit
from examples.crash_matrix.contracts import TOOLS
from examples.crash_matrix.target_client import TargetProcess
from examples.crash_matrix.workers import (
    FAST_RECOVERY,
    WorkerProcess,
    broker_env,
    wait_until,
)
from tests.acceptance.target_world import target_world

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: The lease and stalled-job times: by then every sweep meets the frozen worker's
#: lock (the issue saw every slot taken within ~7 s).
STALL_DEVELOPS = float(FAST_RECOVERY["EFFECT_BROKER_LEASE_SECONDS"]) + float(
    FAST_RECOVERY["EFFECT_BROKER_STALLED_JOB_SECONDS"]
)
#: The item's figures: 20 other effects, each settled within 30 s.
OTHERS = 20
OTHERS_WITHIN = 30.0
#: EFFECT_BROKER_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS's documented default (README).
IDLE_TIMEOUT = 30.0
#: The claim is committed when the failpoint stalls the send this long: time for the
#: outside session to queue its job. Well inside the lease (3 s, margin 0.5 s), so
#: the send gate lets the send go and the target's refusal is what A records.
SEND_STALL = 1.0


@dataclass
class World:
    """A target, contracts bound to it, the test database's URL, a tenant and the
    failpoint directory worker A reads."""

    target: TargetProcess
    contracts: Path
    database_url: str
    tenant: Tenant
    fp_dir: Path

    def env(self, *, failpoint_dir: bool = False) -> dict[str, str]:
        """A worker's environment: FAST_RECOVERY timing, no database setting."""
        extra = {"EFFECT_BROKER_FAILPOINT_DIR": str(self.fp_dir)} if failpoint_dir else {}
        env = broker_env(
            self.database_url,
            self.contracts,
            settings.EFFECT_BROKER_MASTER_KEY,
            extra=extra,
        )
        assert not [v for v in env if v.startswith("EFFECT_BROKER_DB_")]
        return env

    def submit(self, key: str, safety: str = "idempotent") -> EffectRecord:
        request = EffectRequest(
            operation_key=key,
            tool=TOOLS[safety],
            arguments={"order": "42", "amount_minor": 1999, "currency": "EUR"},
        )
        return submit(self.tenant, request).effect

    def charges(self, record: EffectRecord) -> int:
        """The effect's charges in the target's own table, by its key."""
        return self.target.count_charges(mode="idempotent", key=record.downstream_key)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with target_world(tmp_path, schema="stuck_target", tenant_prefix="stuck") as parts:
        yield World(*parts, fp_dir=tmp_path / "failpoints")


def status_of(record: EffectRecord) -> EffectStatus:
    return store.load_effect_for_worker(record.effect_id).status


@contextmanager
def queued_twin(database_url: str, effect_id: str) -> Iterator[int]:
    """An outside session holding an UNCOMMITTED dispatch job for ``effect_id`` (same
    queueing lock as the broker's); yield its pid. Leaving the block rolls back."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, lock, "
            "queueing_lock, args, scheduled_at) VALUES ('dispatch', %s, %s, %s, "
            "%s::jsonb, now() + interval '1 hour')",
            [
                DISPATCH_TASK,
                f"effect:{effect_id}",
                f"dispatch:{effect_id}",
                json.dumps({"effect_id": effect_id}),
            ],
        )
        try:
            yield conn.info.backend_pid
        finally:
            conn.rollback()


def backend_blocked_by(database_url: str, blocker: int) -> int | None:
    """The backend waiting on a lock ``blocker`` holds, if any."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND %s = ANY(pg_blocking_pids(pid))",
            [blocker],
        ).fetchone()
    return int(row[0]) if row else None


def backend_state(database_url: str, pid: int) -> str | None:
    """pg_stat_activity's state of backend ``pid``; None once it is gone."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT state FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
    return str(row[0]) if row else None


def dispatch_job_end(worker: WorkerProcess) -> str | None:
    """The worker log's line saying how its dispatch job ended, once there is one."""
    return next(
        (
            line
            for line in worker.log_tail(4000).splitlines()
            if "dispatch_effect[" in line and "ended with status" in line
        ),
        None,
    )


def session_ended_by_server(log: str) -> bool:
    """Whether a worker's log shows its session ended under it: psycopg reports the
    server's FATAL when it read it, else the closed socket."""
    return (
        "terminating connection due to idle-in-transaction timeout" in log
        or "server closed the connection unexpectedly" in log
    )


def lock_waiters(database_url: str) -> list[str]:
    """What every backend waiting on a lock runs (for a failure message)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 100) "
            "FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ).fetchall()
    return [str(r[0]) for r in rows]


def test_a_frozen_row_lock_holder_stalls_nobody_and_is_taken_over(world: World) -> None:
    stuck_key = f"order:42:charge:stuck:{uuid.uuid4().hex[:8]}"
    subject = f"{world.tenant.id}/{stuck_key}"
    failpoints.arm(world.fp_dir, subject, "before_request_write", pause=SEND_STALL)
    world.target.inject("reject_next")
    worker_a = WorkerProcess("worker-a", world.env(failpoint_dir=True), concurrency=1)
    healthy: list[WorkerProcess] = []
    try:
        # Given worker A, which claimed the effect and is about to send it
        stuck = world.submit(stuck_key)
        pid = wait_until(
            lambda: failpoints.fired_by(world.fp_dir, subject, "before_request_write"),
            timeout=60,
            what="worker A's claim to commit",
        )
        assert pid == worker_a.pid
        with queued_twin(world.database_url, stuck.effect_id) as twin:
            # ... whose refusal transition holds the row lock while its retry job
            # waits for the outside session
            a_backend = wait_until(
                lambda: backend_blocked_by(world.database_url, twin),
                timeout=30,
                what="worker A's retry job to wait on the outside session",
            )
            # When A is frozen there (SIGSTOP: process, heartbeat and all)
            worker_a.pause()
            frozen_at = time.monotonic()
            # ... and its insert completes server-side (the outside session leaves)
        wait_until(
            lambda: backend_state(world.database_url, a_backend) == "idle in transaction",
            timeout=10,
            what="worker A's session to sit idle in its transaction",
        )
        claimed = store.load_effect_for_worker(stuck.effect_id)
        assert claimed.status is EffectStatus.DISPATCHING
        assert (claimed.lease_owner or "").startswith("worker-a:")
        # ... while two healthy workers run, long enough for the lease to run out
        healthy = [
            WorkerProcess(f"worker-healthy-{n}", world.env(), concurrency=2)
            for n in (1, 2)
        ]
        time.sleep(max(0.0, frozen_at + STALL_DEVELOPS + 3 - time.monotonic()))
        assert backend_state(world.database_url, a_backend) == "idle in transaction"
        # ... and 20 other effects are submitted
        submitted_at = time.monotonic()
        others = [
            world.submit(f"order:42:charge:other-{n}:{uuid.uuid4().hex[:6]}")
            for n in range(OTHERS)
        ]
        # Then every one of them succeeds within 30 s, charged once
        try:
            wait_until(
                lambda: all(status_of(r) is EffectStatus.SUCCEEDED for r in others),
                timeout=OTHERS_WITHIN,
                what=f"{OTHERS} other effects to succeed while worker A is frozen",
            )
        except TimeoutError:
            done = sum(status_of(r) is EffectStatus.SUCCEEDED for r in others)
            raise AssertionError(
                f"only {done}/{OTHERS} other effects succeeded within "
                f"{OTHERS_WITHIN:.0f}s while worker A was frozen; backends waiting "
                f"on a lock: {lock_waiters(world.database_url)}"
            ) from None
        others_took = time.monotonic() - submitted_at
        assert [world.charges(r) for r in others] == [1] * OTHERS
        # ... the server ends A's session, which releases the row
        wait_until(
            lambda: backend_state(world.database_url, a_backend) is None,
            timeout=IDLE_TIMEOUT + 10,
            what="the server to end worker A's idle transaction",
        )
        session_gone_after = time.monotonic() - frozen_at
        # ... and the effect is taken over and charged exactly once
        wait_until(
            lambda: status_of(stuck) is EffectStatus.SUCCEEDED,
            timeout=60,
            what="the stuck effect to be taken over",
        )
        taken_over_after = time.monotonic() - frozen_at
        assert world.charges(stuck) == 1
        # When A is thawed
        worker_a.resume()
        # Then its dispatch job fails on the connection the server closed (its
        # transaction, and the lock, went with the session) ...
        thawed_job = wait_until(
            lambda: dispatch_job_end(worker_a),
            timeout=30,
            what="worker A's dispatch job to end after the thaw",
        )
        assert "ended with status: Error" in thawed_job
        assert session_ended_by_server(worker_a.log_tail(4000))
        # ... and A's process lives on
        time.sleep(2)
        assert worker_a.alive()
    except BaseException:
        for worker in (worker_a, *healthy):
            print(f"---- {worker.name} log ----\n{worker.log_tail(60)}")
        raise
    finally:
        if worker_a.alive():
            worker_a.resume()
        for worker in (worker_a, *healthy):
            worker.stop()
    # ... and it wrote nothing: the target was charged once, by the takeover
    assert world.charges(stuck) == 1
    final = store.load_effect_for_worker(stuck.effect_id)
    assert final.status is EffectStatus.SUCCEEDED
    attempts = list(
        EffectAttempt.objects.filter(effect_id=stuck.effect_id)
        .order_by("ordinal")
        .values_list("worker", "outcome")
    )
    # A's attempt was closed as unknown by the sweeper (its "not committed" rolled
    # back with its session); a healthy worker made the one charge
    assert len(attempts) == 2
    assert attempts[0] == (claimed.lease_owner, "unknown")
    assert attempts[1][0].startswith("worker-healthy-")
    assert attempts[1][1] == "succeeded"
    assert store.verify_event_chain(stuck.effect_id) >= 4
    print(
        f"\n{OTHERS} others succeeded {others_took:.1f}s after submission; A's session "
        f"ended {session_gone_after:.1f}s and its effect was taken over "
        f"{taken_over_after:.1f}s after the freeze; attempts {attempts}"
    )


def test_a_frozen_transactional_claim_is_rolled_back_with_its_session_and_taken_over(
    world: World,
) -> None:
    """The other shape of the stall: the frozen transaction is a transactional
    dispatch's own (claim UPDATE done, mutation not yet run), so the row is locked
    while the committed state is still PREPARED. The takeover's claim meets the lock;
    it waits no longer than lock_timeout each time, and once the server ended the
    frozen session (rolling the claim back) it applies the effect exactly once."""
    stuck_key = f"order:42:charge:stuck-tx:{uuid.uuid4().hex[:8]}"
    subject = f"{world.tenant.id}/{stuck_key}"
    # The thread stays inside its transaction past the takeover, and goes on soon
    # after the thaw.
    pause = IDLE_TIMEOUT + 15
    failpoints.arm(world.fp_dir, subject, "before_request_write", pause=pause)
    worker_a = WorkerProcess("worker-a", world.env(failpoint_dir=True), concurrency=1)
    healthy: list[WorkerProcess] = []
    try:
        # Given worker A inside a transactional dispatch: its claim holds the row lock
        stuck = world.submit(stuck_key, safety="transactional")
        pid = wait_until(
            lambda: failpoints.fired_by(world.fp_dir, subject, "before_request_write"),
            timeout=60,
            what="worker A's transactional claim to reach the failpoint",
        )
        assert pid == worker_a.pid
        # When A is frozen there, and two healthy workers run
        worker_a.pause()
        frozen_at = time.monotonic()
        assert status_of(stuck) is EffectStatus.PREPARED  # the claim is uncommitted
        healthy = [
            WorkerProcess(f"worker-healthy-{n}", world.env(), concurrency=2)
            for n in (1, 2)
        ]
        time.sleep(max(0.0, frozen_at + STALL_DEVELOPS + 3 - time.monotonic()))
        others = [
            world.submit(f"order:42:charge:other-tx-{n}:{uuid.uuid4().hex[:6]}")
            for n in range(OTHERS)
        ]
        # Then the others succeed within 30 s
        wait_until(
            lambda: all(status_of(r) is EffectStatus.SUCCEEDED for r in others),
            timeout=OTHERS_WITHIN,
            what=f"{OTHERS} other effects to succeed while worker A is frozen",
        )
        # ... and once the server ended A's session, the effect is applied once
        wait_until(
            lambda: status_of(stuck) is EffectStatus.SUCCEEDED,
            timeout=IDLE_TIMEOUT + 30,
            what="the frozen transactional effect to be taken over",
        )
        taken_over_after = time.monotonic() - frozen_at
        assert local_effect_count(stuck.downstream_key) == 1
        # When A is thawed, it applies nothing more (its transaction is gone)
        worker_a.resume()
        thawed_job = wait_until(
            lambda: dispatch_job_end(worker_a),
            timeout=pause,
            what="worker A's dispatch job to end after the thaw",
        )
        errors = [
            line
            for line in worker_a.log_tail(4000).splitlines()
            if line.startswith(("psycopg.", "django.db."))
        ]
        assert "ended with status: Error" in thawed_job
        assert session_ended_by_server(worker_a.log_tail(4000))
    except BaseException:
        for worker in (worker_a, *healthy):
            print(f"---- {worker.name} log ----\n{worker.log_tail(60)}")
        raise
    finally:
        if worker_a.alive():
            worker_a.resume()
        for worker in (worker_a, *healthy):
            worker.stop()
    assert local_effect_count(stuck.downstream_key) == 1
    assert status_of(stuck) is EffectStatus.SUCCEEDED
    workers = list(
        EffectAttempt.objects.filter(effect_id=stuck.effect_id).values_list(
            "worker", "outcome"
        )
    )
    # A's attempt rolled back with its claim: the only attempt is the takeover's
    assert len(workers) == 1
    assert workers[0][0].startswith("worker-healthy-")
    assert workers[0][1] == "succeeded"
    print(
        f"\ntransactional: taken over {taken_over_after:.1f}s after the freeze; "
        f"thawed A: {thawed_job[24:200]}; {errors[:4]}"
    )
