"""Issue 19, item 1: an upstream MCP tool that charged and then raised is never reported
``failed_final``.

The upstream is a real stdio server on the official SDK's high-level server
(``tests/contract/mcp_raising_server.py``), which answers every exception a tool raises
with ``isError`` and no code. Its charge tool appends the charge to a file (the
target's truth) and then raises. The engine runs on the real ledger; each safety class
does with the unknown outcome what it can prove: unsafe waits for an operator,
idempotent resends under the same key (deduplicated), reconcilable looks the charge up.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from effect_broker.adapters.mcp_adapter import McpAdapter
from effect_broker.domain.clock import ManualClock
from effect_broker.domain.contracts import parse_contracts
from effect_broker.domain.errors import IllegalTransitionError
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectEvent, EffectReceipt, Tenant
from effect_broker.scheduling import RecordingScheduler
from effect_broker.services import runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.services.reconcile import reconcile
from effect_broker.services.resolution import request_reconciliation
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from effect_broker.store import load_effect_for_worker
from tests.integration.engine.harness import TIMING

SERVER = Path(__file__).parents[1] / "contract" / "mcp_raising_server.py"


def contracts_toml(charges: Path, raise_next: Path) -> str:
    upstream = (
        f"command = {json.dumps(sys.executable)}\n"
        f"args = [{json.dumps(str(SERVER))}]\n"
        f"env = {{ CHARGES_FILE = {json.dumps(str(charges))}, "
        f"RAISE_NEXT_FILE = {json.dumps(str(raise_next))} }}\n"
    )
    common = 'retry_limit = 3\nattempt_timeout = "30s"\nadapter = "mcp"\n'
    return f"""
[[contract]]
name = "raises.unsafe"
version = "1"
tool = "charge_unsafe"
safety = "unsafe"
{common}[contract.upstream]
{upstream}tool = "charge"
terminal_errors = ["invalid_amount"]

[[contract]]
name = "raises.idempotent"
version = "1"
tool = "charge_idempotent"
safety = "idempotent"
key_retention = "1h"
{common}[contract.upstream]
{upstream}tool = "charge"
key_argument = "idempotency_key"

[[contract]]
name = "raises.reconcilable"
version = "1"
tool = "charge_reconcilable"
safety = "reconcilable"
settlement_bound = "1s"
{common}[contract.upstream]
{upstream}tool = "charge"
key_argument = "idempotency_key"
lookup_tool = "lookup_charge"
lookup_argument = "reference"
"""


@dataclass
class Upstream:
    charges: Path
    raise_next: Path
    clock: ManualClock
    tenant: Tenant

    def lines(self) -> list[dict[str, object]]:
        if not self.charges.exists():
            return []
        return [json.loads(line) for line in self.charges.read_text().splitlines()]

    def submit(self, tool: str, amount_minor: int = 1999) -> EffectRecord:
        key = f"order:{uuid.uuid4().hex}:charge"
        request = EffectRequest(
            operation_key=key,
            tool=tool,
            arguments={"order": key, "amount_minor": amount_minor},
        )
        return submit(self.tenant, request).effect


@pytest.fixture
def upstream(db: None, tmp_path: Path) -> Iterator[Upstream]:
    charges, raise_next = tmp_path / "charges.jsonl", tmp_path / "raise-next"
    clock = ManualClock(datetime.now(UTC))
    runtime.reset()
    with runtime.override(
        registry=parse_contracts(contracts_toml(charges, raise_next), source="<test>"),
        clock=clock,
        scheduler=RecordingScheduler(),
        adapter_for=McpAdapter,
        timing=TIMING,
    ):
        tenant = create_tenant(f"raises-{uuid.uuid4().hex[:8]}")[0]
        yield Upstream(charges, raise_next, clock, tenant)
    runtime.reset()


def events(record: EffectRecord) -> list[str]:
    return list(
        EffectEvent.objects.filter(effect_id=record.effect_id)
        .order_by("sequence")
        .values_list("event_type", flat=True)
    )


def test_an_unsafe_tool_that_raises_after_charging_is_unknown_not_failed(
    upstream: Upstream,
) -> None:
    # Given an unsafe upstream tool that charges and then raises
    record = upstream.submit("charge_unsafe")
    upstream.raise_next.touch()
    # When the worker dispatches it
    after = dispatch(record.effect_id, worker="w1")
    # Then the charge happened once and the broker says it does not know, plainly
    assert len(upstream.lines()) == 1
    assert after.status is EffectStatus.OUTCOME_UNKNOWN
    assert after.outcome_in_doubt is True
    assert "dispatch_refused" not in events(after)
    # and nothing automatic sends it again: only an operator settles an unsafe one
    with pytest.raises(IllegalTransitionError):
        request_reconciliation(upstream.tenant, record.effect_id)
    assert dispatch(record.effect_id, worker="w2").status is (
        EffectStatus.OUTCOME_UNKNOWN
    )
    assert len(upstream.lines()) == 1


def test_an_idempotent_tool_that_raised_is_resent_under_the_same_key_once(
    upstream: Upstream,
) -> None:
    # Given an idempotent upstream tool that charged and then raised
    record = upstream.submit("charge_idempotent")
    upstream.raise_next.touch()
    assert dispatch(record.effect_id, worker="w1").status is (
        EffectStatus.OUTCOME_UNKNOWN
    )
    # When reconciliation resends it under the same key
    done = reconcile(record.effect_id, worker="w2")
    # Then the upstream returned the charge it already made: one charge, a receipt
    assert done.status is EffectStatus.SUCCEEDED
    (charge,) = upstream.lines()
    assert charge["key"] == record.downstream_key
    receipt = EffectReceipt.objects.get(effect_id=record.effect_id)
    assert receipt.external_id == charge["id"]


def test_a_reconcilable_tool_that_raised_is_found_by_its_lookup_not_resent(
    upstream: Upstream,
) -> None:
    # Given a reconcilable upstream tool that charged and then raised
    record = upstream.submit("charge_reconcilable")
    upstream.raise_next.touch()
    assert dispatch(record.effect_id, worker="w1").status is (
        EffectStatus.OUTCOME_UNKNOWN
    )
    # When the settlement bound has passed and the reconciler looks it up
    upstream.clock.advance(TIMING.send_margin + timedelta(seconds=2))
    done = reconcile(record.effect_id, worker="w2")
    # Then the lookup found the charge: succeeded, and nothing was sent again
    assert done.status is EffectStatus.SUCCEEDED
    (charge,) = upstream.lines()
    receipt = EffectReceipt.objects.get(effect_id=record.effect_id)
    assert receipt.external_id == charge["id"]


def test_a_documented_refusal_still_ends_failed_final_with_nothing_charged(
    upstream: Upstream,
) -> None:
    # Given an upstream refusal the contract lists in terminal_errors
    record = upstream.submit("charge_unsafe", amount_minor=0)
    # When it is dispatched
    after = dispatch(record.effect_id, worker="w1")
    # Then it is final, and the target holds no charge
    assert after.status is EffectStatus.FAILED_FINAL
    assert after.outcome_in_doubt is False
    assert upstream.lines() == []
    assert load_effect_for_worker(record.effect_id).attempt_count == 1
