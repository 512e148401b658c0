"""Issue 9, defect 1, reproduced as the issue did it: with no project failpoints.

"A paused worker charges twice (reconcilable)": a worker commits its claim
(DISPATCHING, attempt 1 open) and stalls before it writes the request; its lease
expires, a second worker hands the effect on and charges; the stalled worker wakes and
sends attempt 1 as well. The crash matrix's edge cell stalls the worker with a
failpoint; here nothing in the broker is armed. The stall comes from outside, the way
the issue reproduced it:

1. submit, then an outside connection takes ``SELECT ... FOR UPDATE`` on the intent
   row BEFORE any worker runs, so the one worker's claim UPDATE waits on that lock;
2. once the worker's backend is seen waiting (``pg_blocking_pids``), SIGSTOP the worker;
3. release the lock: the claim (an autocommit statement) commits server-side while the
   process is frozen; its reply waits in the socket;
4. start a second worker: lease expiry, stalled-job recovery, sweeper, reconcile or
   resend; wait until it settled the effect, and at least lease + stalled-job time;
5. SIGCONT the first worker and wait until it has acted (its fenced write appears).

The truth is read where it lives: charges from the target's own table by downstream
key (unsafe: by this test's unique body), requests from the target's own counter, and
the thawed worker's fate from the ledger (its refused write) and its log.

The session's test database is used as ``tests/acceptance/test_worker_processes.py``
uses it (``transaction=True``, workers get its URL); the crash-matrix rig is not
opened, since ``open_rig`` repoints Django's connection to a scratch database.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from config.database import url_from_settings
from effect_broker import store
from effect_broker.domain.contracts import load_contracts
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectAttempt, EffectReceipt, StaleWrite, Tenant
from effect_broker.services import runtime
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.contracts import TOOLS, write_contracts
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import (
    FAST_RECOVERY,
    WorkerProcess,
    broker_env,
    wait_until,
)
from tests.job_tables import forget_old_jobs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: The issue's reproduction thaws the worker after lease + stalled-job time: by then
#: its lease is gone AND its procrastinate job was taken back (worker heartbeat lost).
FROZEN_AT_LEAST = float(FAST_RECOVERY["EFFECT_BROKER_LEASE_SECONDS"]) + float(
    FAST_RECOVERY["EFFECT_BROKER_STALLED_JOB_SECONDS"]
)

#: Only the claim sets first_dispatch_at (services.deadlines.claim_changes); a sweeper
#: or heartbeat write never does. The claim is a prepared statement
#: (store.prepared), so pg_stat_activity shows its text with $n placeholders, not the
#: status it writes; its SET list is in the first 1 kB shown, the event type is not.
CLAIM_MARKER = "%UPDATE effect_intents%, first_dispatch_at = COALESCE(first_dispatch_at%"


@dataclass
class Bench:
    """The target, contracts bound to it, the test database's URL and a tenant."""

    target: TargetProcess
    contracts: Path
    database_url: str
    tenant: Tenant

    def env(self) -> dict[str, str]:
        """A worker's environment: FAST_RECOVERY timing, and no failpoint armed."""
        env = broker_env(
            self.database_url, self.contracts, settings.EFFECT_BROKER_MASTER_KEY
        )
        assert env["EFFECT_BROKER_FAILPOINTS"] == ""
        assert "EFFECT_BROKER_FAILPOINT_DIR" not in env
        return env

    def charges(self, safety: str, record: EffectRecord, body: dict[str, Any]) -> int:
        """The effect's charges in the target's own table."""
        if safety == "unsafe":  # the unsafe endpoint stores no key: by unique body
            return self.target.count_by_body(body)
        return self.target.count_by_key(safety, record.downstream_key)

    def requests(self) -> int:
        """Create requests that reached the target (its own counter)."""
        return int(self.target.stats()["requests"])


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    connection.ensure_connection()
    forget_old_jobs()
    url = url_from_settings(connection.settings_dict)
    target = start_target(url, settlement_delay="500ms", schema="paused_target")
    target.reset()
    # The bound covers the target's real settlement delay (a contract is a promise).
    contracts = write_contracts(
        tmp_path / "contracts.toml", target.url, settlement_bound="1s", timeout="10s"
    )
    runtime.reset()
    try:
        with runtime.override(registry=load_contracts(contracts)):
            tenant = create_tenant(f"paused-{uuid.uuid4().hex[:6]}")[0]
            yield Bench(target, contracts, url, tenant)
    finally:
        runtime.reset()
        target.stop()


@contextmanager
def row_lock(database_url: str, effect_id: str) -> Iterator[int]:
    """Hold ``FOR UPDATE`` on the intent row (an outside session); yield its pid.

    Leaving the block rolls back, which releases the lock.
    """
    with psycopg.connect(database_url) as conn:
        locked = conn.execute(
            "SELECT id FROM effect_intents WHERE id = %s FOR UPDATE", [effect_id]
        ).fetchone()
        assert locked is not None, "the intent row to lock does not exist"
        try:
            yield conn.info.backend_pid
        finally:
            conn.rollback()


def claim_blocked_by(database_url: str, locker_pid: int) -> int | None:
    """The backend whose claim UPDATE waits on ``locker_pid``'s row lock, if any."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND %s = ANY(pg_blocking_pids(pid)) "
            "AND query ILIKE %s",
            [locker_pid, CLAIM_MARKER],
        ).fetchone()
    return int(row[0]) if row else None


def still_waiting(database_url: str, pid: int) -> bool:
    """Whether backend ``pid`` is still waiting on a lock."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
    return row is not None and row[0] == "Lock"


def current(record: EffectRecord) -> EffectRecord:
    """The effect as the ledger has it now."""
    return store.load_effect_for_worker(record.effect_id)


def submit_charge(bench: Bench, safety: str, body: dict[str, Any]) -> EffectRecord:
    """The agent's call, under an operation key of its own."""
    request = EffectRequest(
        operation_key=f"order:42:charge:{safety}:{uuid.uuid4().hex[:8]}",
        tool=TOOLS[safety],
        arguments=body,
    )
    return submit(bench.tenant, request).effect


@pytest.mark.parametrize(
    ("safety", "settled", "handed_on_charges"),
    [
        # A lookup after the settlement bound finds nothing; the resend charges once.
        ("reconcilable", EffectStatus.SUCCEEDED, 1),
        # A same-key resend charges once.
        ("idempotent", EffectStatus.SUCCEEDED, 1),
        # Nobody resends an unsafe effect: it waits for an operator, uncharged. The
        # issue accepts 0 or 1 here (never 2); but the only sender that could make it 1
        # is the thawed worker, the very defect, so the count is exact.
        ("unsafe", EffectStatus.OUTCOME_UNKNOWN, 0),
    ],
)
def test_a_worker_paused_after_its_claim_commits_never_sends(
    bench: Bench, safety: str, settled: EffectStatus, handed_on_charges: int
) -> None:
    started = time.monotonic()
    body = {
        "order": "42",
        "amount_minor": 1999,
        "currency": "EUR",
        "case": f"paused-{safety}-{uuid.uuid4().hex[:8]}",
    }
    # Given an effect whose intent row an outside session locks before any worker runs
    record = submit_charge(bench, safety, body)
    worker_a: WorkerProcess | None = None
    worker_b: WorkerProcess | None = None
    try:
        with row_lock(bench.database_url, record.effect_id) as locker:
            # ... so the one worker's claim UPDATE waits on that lock
            worker_a = WorkerProcess("worker-a", bench.env(), concurrency=1)
            blocked = wait_until(
                lambda: claim_blocked_by(bench.database_url, locker),
                timeout=60,
                what="worker A's claim to wait on the row lock",
            )
            # When worker A is frozen while it waits
            worker_a.pause()
            paused_at = time.monotonic()
            assert still_waiting(bench.database_url, blocked)
            # ... and the lock is released (leaving the block): the claim commits
            # server-side while the process that sent it is frozen
        claimed = wait_until(
            lambda: (
                r if (r := current(record)).status is EffectStatus.DISPATCHING else None
            ),
            timeout=10,
            what="worker A's claim to commit",
        )
        # The claim, and with it the lease, committed no later than now.
        lease_started_by = time.monotonic()
        assert (claimed.lease_owner or "").startswith("worker-a:")
        assert claimed.attempt_count == 1
        assert bench.requests() == 0, "nothing may have been sent before the freeze"
        # ... and a second worker takes the effect over and settles it
        worker_b = WorkerProcess("worker-b", bench.env(), concurrency=1)
        wait_until(
            lambda: current(record).status is settled,
            timeout=60,
            what=f"worker B to settle the {safety} effect as {settled.value}",
        )
        handed_on_after = time.monotonic() - paused_at
        time.sleep(max(0.0, lease_started_by + FROZEN_AT_LEAST - time.monotonic()))
        frozen_for = time.monotonic() - paused_at
        requests_before_thaw = bench.requests()
        charges_before_thaw = bench.charges(safety, record, body)
        # ... and worker A is thawed and finishes what it was doing
        worker_a.resume()
        refused = wait_until(
            lambda: StaleWrite.objects.filter(
                effect_id=record.effect_id, actor=claimed.lease_owner
            ).first(),
            timeout=30,
            what="worker A's write after the thaw to be fenced",
        )
        log_a = worker_a.log_tail(400)
    except BaseException:
        for worker in (worker_a, worker_b):
            if worker is not None:
                print(f"---- {worker.name} log ----\n{worker.log_tail(80)}")
        raise
    finally:
        if worker_a is not None:
            if worker_a.alive():
                worker_a.resume()
            worker_a.stop()
        if worker_b is not None:
            worker_b.stop()
    final = current(record)
    charges = bench.charges(safety, record, body)
    attempts = list(
        EffectAttempt.objects.filter(effect_id=record.effect_id)
        .order_by("ordinal")
        .values_list("ordinal", "worker", "outcome")
    )
    receipts = EffectReceipt.objects.filter(effect_id=record.effect_id).count()
    print(
        f"\n{safety}: settled by B {handed_on_after:.1f}s after the freeze, thawed "
        f"after {frozen_for:.1f}s, charges {charges}, "
        f"requests {bench.requests()}, status {final.status.value}, "
        f"attempts {attempts}, refused write {refused.attempted!r}, "
        f"wall {time.monotonic() - started:.1f}s"
    )
    # Then the target holds the handed-on worker's charge and nothing more
    assert charges == handed_on_charges, f"{charges} charges at the target"
    assert charges_before_thaw == handed_on_charges
    assert final.status is settled
    assert receipts == (1 if settled is EffectStatus.SUCCEEDED else 0)
    # ... the thawed worker sent nothing: the target's own counter did not move
    assert bench.requests() == requests_before_thaw == handed_on_charges
    # ... its send gate refused, and its "not sent" write was fenced out
    # (a refused send is a retryable "not sent"; with the gate open the thawed worker
    # would try to record its own success, dispatching->succeeded, instead)
    assert refused.attempted == "dispatch_rejected:dispatching->retryable"
    assert "effect_broker.services.lease send refused" in log_a
    # ... its attempt was ended as unknown by the sweeper (bytes may have left, as far
    # as anyone could tell) and it opened no other; worker B made the only other one
    assert attempts[0] == (1, claimed.lease_owner, "unknown")
    expected = [(1, "worker-a", "unknown")]
    if handed_on_charges:
        expected.append((2, "worker-b", "succeeded"))
    assert [(n, who.split(":")[0], how) for n, who, how in attempts] == expected
    assert store.verify_event_chain(record.effect_id) >= 3
