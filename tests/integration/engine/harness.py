"""A test bench for the engine services: real Postgres ledger, simulated targets,
a manual clock and a recording scheduler, so every rule can be driven step by step."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from effect_broker.adapters.base import DispatchRequest, DispatchResult, EffectAdapter
from effect_broker.adapters.simulated_adapter import (
    Fault,
    SimulatedAdapter,
    SimulatedLocalAdapter,
    SimulatedTarget,
)
from effect_broker.domain.clock import ManualClock
from effect_broker.domain.contracts import (
    ContractRegistry,
    EffectContract,
    parse_contracts,
)
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import Tenant
from effect_broker.scheduling import RecordingScheduler
from effect_broker.services import runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.services.runtime import EngineTiming
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant

CONTRACTS = """
[[contract]]
name = "t.idempotent"
version = "1"
tool = "idempotent_charge"
safety = "idempotent"
retry_limit = 3
key_retention = "1h"

[[contract]]
name = "t.reconcilable"
version = "1"
tool = "reconcilable_charge"
safety = "reconcilable"
retry_limit = 3
settlement_bound = "2s"
# Longer than the lease: the lease, not the attempt's own limit, bounds the send.
attempt_timeout = "1m"

[[contract]]
name = "t.unsafe"
version = "1"
tool = "unsafe_charge"
safety = "unsafe"
retry_limit = 3
preview_fields = ["amount_minor"]   # what the operator console shows (issue 20)

[[contract]]
name = "t.transactional"
version = "1"
tool = "local_charge"
safety = "transactional"
retry_limit = 3
adapter = "simulated-local"
"""

TOOLS = {
    SafetyClass.IDEMPOTENT: "idempotent_charge",
    SafetyClass.RECONCILABLE: "reconcilable_charge",
    SafetyClass.UNSAFE: "unsafe_charge",
    SafetyClass.TRANSACTIONAL: "local_charge",
}

TIMING = EngineTiming(
    lease=timedelta(seconds=30),
    heartbeat=timedelta(0),  # no background thread: the bench moves time itself
    retention_margin=timedelta(seconds=60),
    reconcile_window=timedelta(minutes=10),
    redefer_grace=timedelta(0),
)


class WorkerKilled(BaseException):
    """Stands for SIGKILL inside a service call: nothing after it runs."""


@dataclass
class KillSwitch:
    """Makes the next dispatch die before sending or after the target committed."""

    when: str | None = None  # "before_send" | "after_commit"


class KillableAdapter(EffectAdapter):
    """Wraps an adapter; kills the 'worker' at a chosen point of the next dispatch."""

    def __init__(self, inner: EffectAdapter, switch: KillSwitch) -> None:
        super().__init__(inner.contract)
        self.inner = inner
        self.switch = switch
        self.transactional = inner.transactional  # type: ignore[misc]
        self.sends: list[str] = []  # effect ids whose request may have left

    def dispatch(self, request: DispatchRequest) -> DispatchResult:
        when, self.switch.when = self.switch.when, None
        if when == "before_send":
            raise WorkerKilled
        self.sends.append(request.effect.effect_id)
        result = self.inner.dispatch(request)
        if when == "after_commit":
            raise WorkerKilled
        return result

    def _send(self, request: DispatchRequest) -> DispatchResult:  # pragma: no cover
        raise NotImplementedError

    def probe(self, request):  # type: ignore[no-untyped-def]
        return self.inner.probe(request)


@dataclass
class Bench:
    """Everything a test needs to drive the engine by hand."""

    clock: ManualClock
    scheduler: RecordingScheduler
    registry: ContractRegistry
    tenant: Tenant
    targets: dict[SafetyClass, SimulatedTarget]
    adapters: dict[SafetyClass, KillableAdapter]
    switch: KillSwitch = field(default_factory=KillSwitch)

    def submit(self, safety: SafetyClass, key: str | None = None) -> EffectRecord:
        """Reserve an effect with arguments unique to it (so target rows map back)."""
        key = key or f"op:{uuid.uuid4()}"
        request = EffectRequest(
            operation_key=key,
            tool=TOOLS[safety],
            arguments={"amount_minor": 100, "ref": key},
        )
        return submit(self.tenant, request).effect

    def unknown_outcome(
        self, safety: SafetyClass, fault: Fault = Fault.LOSE_RESPONSE
    ) -> EffectRecord:
        """An effect whose dispatch ended in OUTCOME_UNKNOWN (``fault`` says how)."""
        record = self.submit(safety)
        self.targets[safety].inject(fault)
        after = dispatch(record.effect_id, worker="w1")
        assert after.status is EffectStatus.OUTCOME_UNKNOWN
        return after

    def target_rows(self, record: EffectRecord) -> int:
        """Effects the target really applied for this broker effect."""
        if record.safety is SafetyClass.TRANSACTIONAL:
            from effect_broker.adapters.simulated_adapter import local_effect_count

            return local_effect_count(record.downstream_key)
        rows = self.targets[record.safety].rows
        return sum(1 for row in rows if row.payload_hash == record.request_hash)

    def advance(self, seconds: float) -> None:
        """Move the bench clock (and thus every target's clock)."""
        self.clock.advance(timedelta(seconds=seconds))


def contract_for(registry: ContractRegistry, safety: SafetyClass) -> EffectContract:
    return registry.for_tool(TOOLS[safety])


@contextmanager
def engine_bench() -> Iterator[Bench]:
    """Install a bench as the process runtime for the duration of a test."""
    # Starts at the real time: deadlines are written and compared on the database's
    # clock, which this clock shifts by as much as a test advances it.
    clock = ManualClock(datetime.now(UTC))
    registry = parse_contracts(CONTRACTS, source="engine-bench")
    switch = KillSwitch()
    targets = {
        SafetyClass.IDEMPOTENT: SimulatedTarget(
            SafetyClass.IDEMPOTENT, clock=clock, key_retention=timedelta(hours=1)
        ),
        SafetyClass.RECONCILABLE: SimulatedTarget(
            SafetyClass.RECONCILABLE, clock=clock, settlement_delay=timedelta(seconds=1)
        ),
        SafetyClass.UNSAFE: SimulatedTarget(SafetyClass.UNSAFE, clock=clock),
    }
    adapters: dict[SafetyClass, KillableAdapter] = {}
    for safety in SafetyClass:
        contract = contract_for(registry, safety)
        inner: EffectAdapter = (
            SimulatedLocalAdapter(contract)
            if safety is SafetyClass.TRANSACTIONAL
            else SimulatedAdapter(contract, target=targets[safety])
        )
        adapters[safety] = KillableAdapter(inner, switch)
    scheduler = RecordingScheduler()
    runtime.reset()
    with runtime.override(
        registry=registry,
        clock=clock,
        scheduler=scheduler,
        adapter_for=lambda contract: adapters[contract.safety],
        timing=TIMING,
    ):
        tenant = create_tenant(f"bench-{uuid.uuid4().hex[:8]}")[0]
        yield Bench(clock, scheduler, registry, tenant, targets, adapters, switch)
    runtime.reset()
