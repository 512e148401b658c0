"""The broker's own cases, called in the bench process exactly as the API and the
workers call them: ``submit`` (reserve + event + dispatch job, one commit), a replay
of an existing key, a claim (``load_effect_for_worker`` + ``start_attempt``) and an
inline cycle (submit, then the dispatch service against the simulated target).
"""

from __future__ import annotations

import uuid
from typing import Any

from effect_broker import store
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.models import Tenant
from effect_broker.services import deadlines
from effect_broker.services import dispatch as dispatch_service
from effect_broker.services.runtime import get_runtime
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from examples.bench.environment import SIMULATED_TOOL

ARGUMENTS: dict[str, Any] = {
    "order": "42",
    "amount_minor": 1999,
    "currency": "EUR",
    "customer": "cus_8f3a",
}


def bench_tenant(label: str = "bench") -> Tenant:
    """A fresh tenant for one run."""
    return create_tenant(f"{label}-{uuid.uuid4().hex[:8]}")[0]


class BrokerCases:
    """Calls into the services with one tenant and the simulated tool."""

    def __init__(self, tenant: Tenant, *, tool: str = SIMULATED_TOOL) -> None:
        self.tenant = tenant
        self.tool = tool
        self._run = uuid.uuid4().hex[:8]

    def key(self, prefix: str, i: int) -> str:
        """Operation key ``i`` of series ``prefix`` in this run."""
        return f"bench:{self._run}:{prefix}:{i}"

    def request(self, operation_key: str) -> EffectRequest:
        """The request the bench submits (same arguments every time)."""
        return EffectRequest(
            operation_key=operation_key, tool=self.tool, arguments=ARGUMENTS
        )

    def submit_new(self, i: int) -> EffectRecord:
        """Submit a key never seen before: reserve, event, dispatch job, one commit."""
        reservation = submit(self.tenant, self.request(self.key("new", i)))
        assert reservation.created
        return reservation.effect

    def submit_new_as(self, operation_key: str) -> EffectRecord:
        """Submit ``operation_key``, never seen before."""
        reservation = submit(self.tenant, self.request(operation_key))
        assert reservation.created
        return reservation.effect

    def submit_replay(self, i: int) -> EffectRecord:
        """Submit key ``new:i`` again with the same payload: the existing effect."""
        reservation = submit(self.tenant, self.request(self.key("new", i)))
        assert reservation.replayed
        return reservation.effect

    def submit_replay_of(self, record: EffectRecord) -> EffectRecord:
        """Submit ``record``'s key again with the same payload."""
        reservation = submit(self.tenant, self.request(record.operation_key))
        assert reservation.replayed
        return reservation.effect

    @property
    def tenant_id(self) -> str:
        """The bench tenant's id."""
        return str(self.tenant.id)

    def prepare(self, prefix: str, i: int) -> EffectRecord:
        """A prepared effect to claim (not timed)."""
        return submit(self.tenant, self.request(self.key(prefix, i))).effect

    def claim(self, record: EffectRecord) -> EffectRecord:
        """What a worker does first: read the effect, then commit DISPATCHING and the
        attempt row (fenced CAS) - the "claim" of the scale figures."""
        rt = get_runtime()
        loaded = store.load_effect_for_worker(record.effect_id)
        contract = rt.registry.get(loaded.contract_name, loaded.contract_version)
        claimed, _ = store.start_attempt(
            loaded,
            worker="bench-claimer",
            now=rt.clock.now(),
            changes=deadlines.claim_changes(rt, loaded, contract, worker="bench-claimer"),
        )
        return claimed

    def inline_cycle(self, i: int) -> EffectRecord:
        """Submit, then dispatch in this process: claim, call the simulated target,
        write the receipt (three commits; the job stays queued, nobody runs it)."""
        record = self.submit_new_series("inline", i)
        return dispatch_service.dispatch(record.effect_id, worker="bench-inline")

    def submit_new_series(self, prefix: str, i: int) -> EffectRecord:
        """Submit a new key of series ``prefix``."""
        return submit(self.tenant, self.request(self.key(prefix, i))).effect

    def submit_tool(self, tool: str, prefix: str, i: int) -> EffectRecord:
        """Submit a new key of series ``prefix`` for another tool."""
        request = EffectRequest(
            operation_key=self.key(prefix, i), tool=tool, arguments=ARGUMENTS
        )
        return submit(self.tenant, request).effect
