"""Forks: continue an unresolved effect's business as a new effect under a new key.

Spec "Replay and time-travel semantics": a fork cannot inherit a live effect's
operation key; turning it into live work creates a new business operation, requires a
new operation key and is an explicit operator action. Here that action settles the old
effect and reserves the new one in ONE transaction, so neither can exist without the
other. The old effect ends FAILED_FINAL with the event ``resolved_forked``: the
operator attests, with evidence (``source``, ``checked_at``), that it never committed,
and the event names the fork (``forked_to``, ``fork_operation_key``). The link is also
a row (``effect_forks``, append-only), so either effect finds the other
(``inspection.fork_links``). Why FAILED_FINAL: the old operation will never complete
under its own key; what makes that honest is the attestation on record under the
operator's name, not the status alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from effect_broker import store
from effect_broker.domain.errors import (
    IllegalTransitionError,
    InvalidRequestError,
    PayloadConflictError,
)
from effect_broker.domain.keys import validate_operation_key
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import Tenant
from effect_broker.services.operator_steps import (
    SETTLED,
    checked_evidence,
    log_resolution,
    reason_text,
    refuse_before_settlement,
    resolvable_effect,
    to_review,
)
from effect_broker.services.operators import operator_name
from effect_broker.services.payloads import load_arguments
from effect_broker.services.runtime import Runtime, get_runtime
from effect_broker.services.submission import submit

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Fork:
    """A fork: the old effect as settled (FAILED_FINAL, ``resolved_forked``) and the
    new effect reserved under the new operation key (PREPARED, dispatch queued; or
    AWAITING_APPROVAL when its contract asks for an operator's approval first)."""

    old: EffectRecord
    new: EffectRecord


def fork(
    tenant: Tenant,
    effect_id: str,
    *,
    operator: Any,
    new_operation_key: str,
    reason: str,
    evidence: Mapping[str, object] | None,
    runtime: Runtime | None = None,
) -> Fork:
    """Continue an unresolved effect's business as a NEW effect under a new key.

    Spec "Replay and time-travel semantics": turning a fork into live work creates a
    new business operation, requires a new operation key and is an explicit operator
    action. In ONE transaction: the new effect is reserved through ``submit`` (same
    tenant, tool and arguments, pinned to the tool's currently active contract, a new
    downstream key) with its dispatch job, and the old effect is settled FAILED_FINAL
    by ``resolved_forked`` - the operator's attestation of non-commit (``reason`` and
    evidence digest, as for ``not_committed``) naming the fork - plus the link row.

    Refused, writing nothing: the same key as the old effect, a key already in use, a
    settled or unresolvable effect, and a reconcilable effect before its settlement
    deadline (the old request may still settle: the fork would be its duplicate).
    """
    rt = runtime or get_runtime()
    actor, why = operator_name(operator), reason_text(reason)
    _, evidence_digest = checked_evidence(evidence, kind="fork")
    new_key = validate_operation_key(new_operation_key)
    record = resolvable_effect(tenant, effect_id, EffectStatus.FAILED_FINAL)
    if new_key == record.operation_key:
        raise InvalidRequestError(
            f"a fork needs a NEW operation key; {new_key!r} is effect "
            f"{record.effect_id}'s own (spec: a fork never inherits a live effect's key)",
            refusal="same_operation_key",
            field="new_operation_key",
        )
    if record.safety is SafetyClass.RECONCILABLE:
        refuse_before_settlement(rt, record, action="a fork")
    arguments = load_arguments(rt, record)
    now = rt.clock.now()
    with transaction.atomic():
        try:
            reservation = submit(
                tenant,
                EffectRequest(
                    operation_key=new_key,
                    tool=record.tool,
                    arguments=arguments,
                    requested_by=actor,
                    trace_id=record.trace_id,
                ),
                runtime=rt,
            )
        except PayloadConflictError as exc:
            raise _key_taken(record, new_key, str(exc.details["effect_id"])) from exc
        if not reservation.created:
            # Raising rolls back everything above: the old effect stays unresolved.
            raise _key_taken(record, new_key, reservation.effect.effect_id)
        new = reservation.effect
        review = to_review(record, "fork", actor=actor, now=now)
        old = store.transition(
            review,
            EffectStatus.FAILED_FINAL,
            event_type="resolved_forked",
            actor=actor,
            now=now,
            metadata={
                "reason": why,
                "evidence_digest": evidence_digest,
                "attested": "not_committed",
                "forked_to": new.effect_id,
                "fork_operation_key": new_key,
            },
            # Settled on the operator's attestation of non-commit, which is on record
            # (evidence digest): the doubt ends with it.
            changes={**SETTLED, "outcome_in_doubt": False},
            riders=(
                store.fork_link(
                    review, new_effect_id=new.effect_id, operator=actor, now=now
                ),
            ),
        )
    log_resolution("fork", record, old, actor, evidence_digest)
    logger.info(
        "effect forked",
        extra={"action": "fork", "effect_id": old.effect_id, "fork_id": new.effect_id},
    )
    return Fork(old=old, new=new)


def _key_taken(record: EffectRecord, key: str, holder: str) -> IllegalTransitionError:
    return IllegalTransitionError(
        f"operation key {key!r} is already effect {holder}; a fork needs an unused key",
        refusal="operation_key_taken",
        effect_id=record.effect_id,
        old=record.status.value,
        new=EffectStatus.FAILED_FINAL.value,
    )
