"""An operator's approval or denial of an effect that waits for one, and its expiry.

Issue 24. A contract may ask for a person before anything is sent
(``domain/approval.py``); such an effect is reserved ``awaiting_approval`` with a
deadline on the database's clock and no dispatch job. From there:

* ``approve``: one fenced write moves it to PREPARED with the event ``approved`` -
  the operator, the reason, and the binding over effect id, request hash and pinned
  contract (``approval_binding``) - and defers its one dispatch job in the same
  transaction. The worker checks that binding before the first send
  (``services.approval_gate``). Two operators at once: the row lock and the fence
  let one through; the other gets ``already_approved`` and nothing more happens;
* ``deny``: FAILED_FINAL with the event ``approval_denied`` (operator and reason); no
  attempt was ever made, so nothing was sent;
* ``expire_due`` (the sweeper): past the deadline, FAILED_FINAL with the event
  ``approval_expired`` and reason ``approval_expired``. An operator's decision
  after the deadline is refused the same way (``approval_expired``), in the same
  transaction that checks the deadline: the two cannot both win.

Who may decide: the operators who may resolve (``services.operators``: an active staff
user holding ``effect_broker.resolve_effect``), re-checked here on every call. A
tenant's API key and an agent over MCP have no way in.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import transaction

from effect_broker import store
from effect_broker.domain.approval import approval_binding, contract_fingerprint
from effect_broker.domain.errors import (
    AlreadyApprovedError,
    ApprovalExpiredError,
    ApprovalNotPendingError,
    StaleWriteError,
)
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.models import Tenant
from effect_broker.observability import metrics
from effect_broker.services import inspection
from effect_broker.services.operator_steps import reason_text
from effect_broker.services.operators import operator_name
from effect_broker.services.runtime import Runtime, get_runtime
from effect_broker.store import db_time
from effect_broker.store.reads import StoredEvent

logger = logging.getLogger(__name__)

APPROVED = "approved"
DENIED = "approval_denied"
EXPIRED = "approval_expired"
#: The worker found the approval no longer matches the contract (approval_gate).
INVALIDATED = "approval_invalidated"
#: Every event that decides (or undoes) an approval, newest last in a history.
DECISIONS = frozenset({APPROVED, DENIED, EXPIRED, INVALIDATED})

#: How often a decision re-reads the effect when another write got in first (an
#: operator reading its arguments bumps the version, and is no decision).
_RACE_TRIES = 3


def approve(
    tenant: Tenant,
    effect_id: str,
    *,
    operator: Any,
    reason: str,
    runtime: Runtime | None = None,
) -> EffectRecord:
    """Approve ``effect_id``: PREPARED, bound to its payload and pinned contract, with
    its one dispatch job. Refused (nothing written) when it was already approved,
    denied, expired, or never waited."""
    return _decide(
        tenant, effect_id, APPROVED, operator=operator, reason=reason, rt=runtime
    )


def deny(
    tenant: Tenant,
    effect_id: str,
    *,
    operator: Any,
    reason: str,
    runtime: Runtime | None = None,
) -> EffectRecord:
    """Deny ``effect_id``: FAILED_FINAL, never sent, the operator and reason in its
    events. Refused like ``approve``."""
    return _decide(
        tenant, effect_id, DENIED, operator=operator, reason=reason, rt=runtime
    )


def _decide(
    tenant: Tenant,
    effect_id: str,
    decision: str,
    *,
    operator: Any,
    reason: str,
    rt: Runtime | None,
) -> EffectRecord:
    rt = rt or get_runtime()
    actor, why = operator_name(operator), reason_text(reason)
    for _ in range(_RACE_TRIES):
        record = inspection.get_effect(tenant, effect_id)
        refuse_unless_awaiting(record, decision)
        try:
            return _write_decision(rt, record, decision, actor=actor, reason=why)
        except StaleWriteError:
            continue  # someone wrote first: read again and decide on what is there
    record = inspection.get_effect(tenant, effect_id)
    refuse_unless_awaiting(record, decision)
    return _write_decision(rt, record, decision, actor=actor, reason=why)


def _write_decision(
    rt: Runtime, record: EffectRecord, decision: str, *, actor: str, reason: str
) -> EffectRecord:
    offset = rt.clock.database_offset()
    now = rt.clock.now()
    expired: EffectRecord | None = None
    decided: EffectRecord | None = None
    with transaction.atomic():
        ahead = store.lock_awaiting_approval(record, offset)
        if ahead is None:
            raise StaleWriteError(
                f"effect {record.effect_id} changed while it was being decided",
                effect_id=record.effect_id,
                expected_version=record.version,
            )
        if not ahead:
            # The deadline passed on the database's clock and the sweeper has not
            # been by yet: the operator is too late, as if it had.
            expired = _expire(rt, record, actor="approval deadline", now=now)
        elif decision == APPROVED:
            decided = _approve(rt, record, actor=actor, reason=reason, now=now)
        else:
            decided = store.transition(
                record,
                EffectStatus.FAILED_FINAL,
                event_type=DENIED,
                actor=actor,
                now=now,
                metadata={"reason": reason, "decision": "denied"},
                changes={"next_action_at": None},
            )
    if expired is not None or decided is None:
        raise _expired_error(record)
    metrics.approval_decided(decided, "approved" if decision == APPROVED else "denied")
    logger.info(
        "approval decided",
        extra={
            "action": decision,
            "effect_id": decided.effect_id,
            "operator": actor,
            "new_status": decided.status.value,
        },
    )
    return decided


def _approve(
    rt: Runtime, record: EffectRecord, *, actor: str, reason: str, now: datetime
) -> EffectRecord:
    contract = rt.registry.get(record.contract_name, record.contract_version)
    approved = store.transition(
        record,
        EffectStatus.PREPARED,
        event_type=APPROVED,
        actor=actor,
        now=now,
        # What the approval is bound to (domain/approval.py): the worker recomputes
        # the binding before the first send and sends nothing if it differs.
        metadata={
            "reason": reason,
            "decision": "approved",
            "contract": contract.label,
            "contract_fingerprint": contract_fingerprint(contract),
            "binding": approval_binding(record.effect_id, record.request_hash, contract),
        },
        changes={"next_action_at": db_time.after_now(rt.clock.database_offset())},
    )
    # Deferred in the same transaction (STYLE rule 5): one job iff the approval
    # commits. A second approval never gets this far (refused above).
    rt.scheduler.dispatch(record.effect_id)
    return approved


def expire_due(rt: Runtime, record: EffectRecord, *, actor: str) -> EffectRecord | None:
    """The sweeper's expiry of one effect found past its approval deadline (its row
    locked by the sweep's read); None when an operator decided first."""
    try:
        return _expire(rt, record, actor=actor, now=rt.clock.now())
    except StaleWriteError:
        return None


def _expire(
    rt: Runtime, record: EffectRecord, *, actor: str, now: datetime
) -> EffectRecord:
    deadline = record.next_action_at
    expired = store.transition(
        record,
        EffectStatus.FAILED_FINAL,
        event_type=EXPIRED,
        actor=actor,
        now=now,
        # No attempt was ever made (an awaiting effect has no dispatch job, and a
        # dispatch job that runs anyway refuses it): nothing was sent.
        metadata={
            "reason": "approval_expired",
            "approval_deadline": deadline.isoformat() if deadline else "",
            "attempts": record.attempt_count,
        },
        changes={"next_action_at": None},
    )
    metrics.approval_decided(expired, "expired")
    logger.info(
        "approval expired",
        extra={"action": EXPIRED, "effect_id": expired.effect_id, "actor": actor},
    )
    return expired


# --- refusals -------------------------------------------------------------------------


def last_decision(effect_id: str) -> StoredEvent | None:
    """The effect's newest approval event (approved, denied, expired, invalidated)."""
    found = [e for e in store.load_events(effect_id) if e.facts.event_type in DECISIONS]
    return found[-1] if found else None


def refuse_unless_awaiting(record: EffectRecord, decision: str) -> None:
    """Raise the stable refusal for a decision on an effect not awaiting approval."""
    if record.status is EffectStatus.AWAITING_APPROVAL:
        return
    last = last_decision(record.effect_id)
    kind = last.facts.event_type if last is not None else ""
    details: dict[str, object] = {
        "effect_id": record.effect_id,
        "effect_status": record.status.value,
        "old": record.status.value,
        "new": EffectStatus.PREPARED.value
        if decision == APPROVED
        else EffectStatus.FAILED_FINAL.value,
    }
    if kind == APPROVED and last is not None:
        raise AlreadyApprovedError(
            f"effect {record.effect_id} was already approved by {last.facts.actor} "
            f"at {last.facts.occurred_at.isoformat()} (it is {record.status.value}); "
            "an approval is given once and consumed by one dispatch, so this "
            + ("second approval" if decision == APPROVED else "denial")
            + " changed nothing and sent nothing",
            approved_by=last.facts.actor,
            approved_at=last.facts.occurred_at.isoformat(),
            **details,
        )
    if kind == EXPIRED and last is not None:
        raise _expired_error(record, last.facts.metadata)
    if kind == DENIED and last is not None:
        raise ApprovalNotPendingError(
            f"effect {record.effect_id} was denied by {last.facts.actor}: it is "
            "failed_final and was never sent; a decision cannot be changed",
            denied_by=last.facts.actor,
            **details,
        )
    raise ApprovalNotPendingError(
        f"effect {record.effect_id} is {record.status.value}: it is not awaiting "
        "approval (its contract did not ask for one when it was submitted)",
        **details,
    )


def _expired_error(
    record: EffectRecord, metadata: Mapping[str, object] | None = None
) -> ApprovalExpiredError:
    deadline = (metadata or {}).get("approval_deadline") or (
        record.next_action_at.isoformat() if record.next_action_at else ""
    )
    return ApprovalExpiredError(
        f"effect {record.effect_id} was not approved before its deadline {deadline} "
        "(database clock): it ended failed_final (approval_expired) and was never "
        "sent; nothing was written now",
        effect_id=record.effect_id,
        effect_status=EffectStatus.FAILED_FINAL.value,
        approval_deadline=str(deadline),
    )
