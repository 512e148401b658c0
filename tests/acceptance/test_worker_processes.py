"""Real ``procrastinate worker`` processes, real HTTP to a real target, real SIGKILL.

Worker death is expected, not exceptional: a worker that SIGKILLs itself after the
target committed leaves an effect in DISPATCHING with a stuck job; a second worker's
sweeper must recover it, and the target's own table must show one charge.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

from effect_broker import store
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectReceipt, StaleWrite
from effect_broker.services.submission import submit
from examples.crash_matrix.contracts import TOOLS
from examples.crash_matrix.target_client import TargetProcess
from examples.crash_matrix.workers import WorkerProcess, broker_env, wait_until
from tests.acceptance.target_world import target_world

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@dataclass
class World:
    """A target, a contract file bound to it, and the broker's database URL."""

    target: TargetProcess
    contracts: Path
    database_url: str
    tenant: object

    def env(self, failpoints: str = "") -> dict[str, str]:
        return broker_env(
            self.database_url,
            self.contracts,
            settings.EFFECT_BROKER_MASTER_KEY,
            failpoints=failpoints,
        )

    def submit(self, safety: str) -> EffectRecord:
        key = f"order:42:charge:{safety}:{uuid.uuid4().hex[:8]}"
        request = EffectRequest(
            operation_key=key,
            tool=TOOLS[safety],
            arguments={"order": "42", "amount_minor": 1999, "currency": "EUR"},
        )
        return submit(self.tenant, request).effect  # type: ignore[arg-type]

    def target_effects(self, record: EffectRecord) -> int:
        """Charges in the target's own table for this effect."""
        if record.safety.value == "transactional":
            from effect_broker.adapters.simulated_adapter import local_effect_count

            return local_effect_count(record.downstream_key)
        if record.safety.value == "unsafe":  # an unsafe target records no key
            return self.target.count_charges(mode="unsafe")
        return self.target.count_charges(
            mode=record.safety.value, key=record.downstream_key
        )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with target_world(tmp_path, schema="worker_target", tenant_prefix="workers") as parts:
        yield World(*parts)


def status_of(record: EffectRecord) -> EffectStatus:
    return store.load_effect_for_worker(record.effect_id).status


@pytest.mark.parametrize(
    ("safety", "converged"),
    [
        ("idempotent", EffectStatus.SUCCEEDED),
        ("reconcilable", EffectStatus.SUCCEEDED),
        ("transactional", EffectStatus.SUCCEEDED),
        ("unsafe", EffectStatus.OUTCOME_UNKNOWN),
    ],
)
def test_sigkill_after_target_commit_converges_per_safety_class(
    world: World, safety: str, converged: EffectStatus
) -> None:
    # Given a worker armed to SIGKILL itself right after the target committed
    doomed = WorkerProcess("worker-doomed", world.env("after_target_commit"))
    try:
        record = world.submit(safety)
        code = doomed.wait(timeout=60)
    finally:
        doomed.close()
    assert code == -9, "the failpoint should have SIGKILLed the worker"
    expected_before = 0 if safety == "transactional" else 1  # rolled back with the kill
    assert world.target_effects(record) == expected_before
    # When a fresh worker runs (its sweeper finds the dead worker's lease and job)
    started = time.monotonic()
    rescuer = WorkerProcess("worker-rescuer", world.env())
    try:
        wait_until(
            lambda: status_of(record) is converged,
            timeout=60,
            what=f"{safety} effect to reach {converged}",
        )
        elapsed = time.monotonic() - started
        if safety == "unsafe":
            time.sleep(3)  # several sweeps: nothing may resend it
    except TimeoutError:
        print("---- rescuer log ----\n" + rescuer.log_tail(80))
        raise
    finally:
        rescuer.stop()
    # Then the target's own table holds exactly one charge, and the ledger agrees
    assert world.target_effects(record) == 1
    assert status_of(record) is converged
    receipts = EffectReceipt.objects.filter(effect_id=record.effect_id).count()
    assert receipts == (1 if converged is EffectStatus.SUCCEEDED else 0)
    assert store.verify_event_chain(record.effect_id) >= 3
    print(f"\n{safety}: converged to {converged.value} in {elapsed:.1f}s after restart")


def test_a_paused_zombie_worker_is_fenced_out(world: World) -> None:
    # Given worker A (the only worker) sent the charge and waits for a slow response
    world.target.inject("hang_after_commit", seconds=6)
    worker_a = WorkerProcess("worker-a", world.env())
    worker_b: WorkerProcess | None = None
    try:
        record = world.submit("idempotent")
        wait_until(
            lambda: (
                (
                    store.load_effect_for_worker(record.effect_id).lease_owner or ""
                ).startswith("worker-a")
                and world.target_effects(record) == 1
            ),
            timeout=30,
            what="worker A to hold the lease after the target committed",
        )
        # When A freezes past its lease, and B recovers the effect with the same key
        worker_a.pause()
        worker_b = WorkerProcess("worker-b", world.env())
        wait_until(
            lambda: status_of(record) is EffectStatus.SUCCEEDED,
            timeout=60,
            what="worker B to finish the effect",
        )
        # ... and A wakes up and tries to record its own (older) view of the result
        worker_a.resume()
        stale = wait_until(
            lambda: StaleWrite.objects.filter(effect_id=record.effect_id).first(),
            timeout=30,
            what="the zombie's write to be refused",
        )
    finally:
        if worker_a.alive():
            worker_a.resume()
        worker_a.stop()
        if worker_b is not None:
            worker_b.stop()
    # Then the target holds one charge, the ledger one receipt, and the write is counted
    assert world.target_effects(record) == 1
    assert EffectReceipt.objects.filter(effect_id=record.effect_id).count() == 1
    assert status_of(record) is EffectStatus.SUCCEEDED
    assert "worker-a" in stale.actor
