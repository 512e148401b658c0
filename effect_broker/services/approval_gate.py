"""The worker's check, before an effect's first send, that its approval still holds.

Issue 24, "bound and single-use": an ``approved`` event binds the effect id, its
request hash and the pinned contract's terms as the approving process loaded them
(``domain.approval.approval_binding``). Before the first attempt of an effect whose
contract asks for approvals, the dispatching worker recomputes that binding with the
contract IT loaded. Only a match may be sent, and the claim that starts the attempt
names the binding it consumes (``dispatch_started``'s ``approval``).

No match - the pinned contract was edited in place by a redeploy after the approval,
or it now asks for approval of an effect reserved before it did - sends the effect
back to ``awaiting_approval`` (event ``approval_invalidated``, a fresh deadline, a new
notice): nothing was sent, and an operator decides again on the terms now deployed.
Why not ``failed_final``: the caller's operation is still wanted and still unsent;
ending it would push the caller to submit it again under a second identity, the habit
that duplicates charges everywhere else.

Later attempts of the same effect (a proved non-commit, a same-key resend) are the
same approved request under the same downstream key: the approval was consumed by
the first, and is not asked for again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction

from effect_broker import store
from effect_broker.domain.approval import approval_binding, contract_fingerprint
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.services import approval_notices
from effect_broker.services.approvals import APPROVED, DECISIONS, INVALIDATED
from effect_broker.services.payloads import load_arguments
from effect_broker.services.runtime import Runtime
from effect_broker.store import db_time

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GateAnswer:
    """May the worker send? ``binding``: the approval the send consumes ("" when none
    was needed); ``held``: the effect as sent back to an operator, when it may not."""

    binding: str = ""
    held: EffectRecord | None = None


def check_first_send(
    rt: Runtime,
    read: store.DispatchRead,
    contract: EffectContract,
    *,
    worker: str,
) -> GateAnswer:
    """Whether ``read.record`` may be sent now under ``contract`` (module docstring)."""
    record = read.record
    rule = contract.approval
    if rule is None or record.status is not EffectStatus.PREPARED:
        return GateAnswer()
    if record.attempt_count > 0:
        return GateAnswer()  # consumed by the first attempt
    events = store.load_events(record.effect_id)
    waited = any(e.facts.new_status == EffectStatus.AWAITING_APPROVAL for e in events)
    if not waited and not rule.applies_to(load_arguments(rt, record, read.sealed)):
        return GateAnswer()  # its contract never asked for an approval of it
    expected = approval_binding(record.effect_id, record.request_hash, contract)
    decisions = [e.facts for e in events if e.facts.event_type in DECISIONS]
    last = decisions[-1] if decisions else None
    if last is not None and last.event_type == APPROVED:
        if last.metadata.get("binding") == expected:
            return GateAnswer(binding=expected)
        why = (
            f"the approval by {last.actor} was given under other terms of contract "
            f"{contract.label} (fingerprint "
            f"{str(last.metadata.get('contract_fingerprint', ''))[:12]}, deployed now "
            f"{contract_fingerprint(contract)[:12]}): a redeploy changed the contract "
            "after the approval"
        )
    else:
        why = (
            f"contract {contract.label} asks for an approval of this effect and it has "
            "none (the rule was deployed after the effect was reserved)"
        )
    return GateAnswer(held=_hold(rt, record, contract, worker=worker, why=why))


def _hold(
    rt: Runtime, record: EffectRecord, contract: EffectContract, *, worker: str, why: str
) -> EffectRecord:
    """Back to ``awaiting_approval``, unsent, with a fresh deadline and a notice."""
    assert contract.approval is not None
    offset = rt.clock.database_offset()
    with transaction.atomic():
        held = store.transition(
            record,
            EffectStatus.AWAITING_APPROVAL,
            event_type=INVALIDATED,
            actor=worker,
            now=rt.clock.now(),
            metadata={
                "reason": f"{why}; nothing was sent, an operator decides again",
                "contract": contract.label,
                "contract_fingerprint": contract_fingerprint(contract),
                "approval_rule": contract.approval.describe(),
            },
            changes={"next_action_at": db_time.after_now(offset, contract.approval.ttl)},
        )
        approval_notices.ask_for_notice(rt, record.effect_id)
    logger.warning(
        "approval no longer holds; effect awaits an operator again",
        extra={"action": INVALIDATED, "effect_id": record.effect_id, "reason": why},
    )
    return held
