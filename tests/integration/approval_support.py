"""Contracts and helpers the approval tests share (issue 24): the engine bench's
contracts plus tools whose contracts ask for an operator's approval."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from effect_broker.domain.contracts import ContractRegistry, parse_contracts
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import SafetyClass
from effect_broker.models import EffectAttempt, EffectEvent, Tenant
from effect_broker.services import runtime
from effect_broker.services.submission import submit
from tests.integration.engine.harness import CONTRACTS, Bench

#: Every effect waits for an operator; an idempotent target (the bench's).
APPROVED_CHARGE = """
[[contract]]
name = "t.approved"
version = "1"
tool = "approved_charge"
safety = "idempotent"
key_retention = "1h"
approval = "required"
preview_fields = ["amount_minor", "currency"]
{extra}
"""

#: Only large amounts wait (an unsafe target: every request is a charge).
LARGE_CHARGE = """
[[contract]]
name = "t.large"
version = "1"
tool = "large_charge"
safety = "unsafe"
approval_when = { pointer = "/amount_minor", above = 50000 }
approval_ttl = "10m"
preview_fields = ["amount_minor"]
"""

APPROVED = "approved_charge"
LARGE = "large_charge"


def registry(extra: str = "") -> ContractRegistry:
    """The bench's contracts plus the approval contracts (``extra``: more lines of
    ``t.approved`` v1, e.g. to edit it in place as a careless redeploy does)."""
    return parse_contracts(
        CONTRACTS + APPROVED_CHARGE.format(extra=extra) + LARGE_CHARGE,
        source="approval-bench",
    )


@contextmanager
def approval_contracts(extra: str = "") -> Iterator[None]:
    """Run with ``registry(extra)`` deployed (inside an engine bench)."""
    with runtime.override(registry=registry(extra)):
        yield


def charge(
    bench: Bench,
    tool: str = APPROVED,
    *,
    key: str | None = None,
    tenant: Tenant | None = None,
    **arguments: Any,
) -> EffectRecord:
    """Submit one effect of ``tool`` for ``tenant`` (default: the bench's)."""
    arguments = arguments or {"amount_minor": 120000, "currency": "EUR", "card": "tok_1"}
    request = EffectRequest(
        operation_key=key or f"order:{uuid.uuid4()}:charge",
        tool=tool,
        arguments=arguments,
    )
    return submit(tenant or bench.tenant, request).effect


def target_of(tool: str) -> SafetyClass:
    """The bench target a tool's contract sends to."""
    return SafetyClass.IDEMPOTENT if tool == APPROVED else SafetyClass.UNSAFE


def dispatch_jobs(bench: Bench, record: EffectRecord) -> int:
    """Dispatch jobs asked for this effect so far."""
    return sum(
        1
        for kind, effect_id, _ in bench.scheduler.requests
        if kind == "dispatch" and effect_id == record.effect_id
    )


def attempts(record: EffectRecord) -> int:
    """Attempt rows of the effect: each one may have sent a request."""
    return EffectAttempt.objects.filter(effect_id=record.effect_id).count()


def events(record: EffectRecord) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(event type, new status, actor, metadata) of every event, in order."""
    rows = EffectEvent.objects.filter(effect_id=record.effect_id).order_by("sequence")
    return [(e.event_type, e.new_status, e.actor, dict(e.metadata)) for e in rows]
