"""An operator reads an effect's full arguments, and the ledger records that they did.

Issue 20: the operator decided blind - the admin showed only the contract's preview
fields, in a collapsed block. The arguments are encrypted at rest and may hold personal
data, so a full read is an audited act: it needs the operator permission and a reason,
and it appends an ``arguments_read`` event (who, why) to the effect's chain in the same
transaction that decrypts. If the event cannot be written, nothing is shown.

Only while the effect waits for a person (``outcome_unknown``, ``manual_review``, and
``awaiting_approval``: issue 24, an operator approves what they have read): then no
worker writes the row, so the event's compare-and-swap cannot make a worker's fenced
write stale; a settled effect's chain is final.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.db import transaction

from effect_broker import store
from effect_broker.domain.errors import IllegalTransitionError
from effect_broker.domain.states import EffectStatus
from effect_broker.models import Tenant
from effect_broker.services import inspection
from effect_broker.services.operator_steps import RESOLVABLE, reason_text
from effect_broker.services.operators import operator_name
from effect_broker.services.payloads import load_arguments
from effect_broker.services.runtime import Runtime, get_runtime

logger = logging.getLogger(__name__)

EVENT_TYPE = "arguments_read"
#: The statuses in which an operator may read an effect's full arguments.
READABLE = RESOLVABLE | {EffectStatus.AWAITING_APPROVAL}


def read_arguments(
    tenant: Tenant,
    effect_id: str,
    *,
    operator: Any,
    reason: str,
    runtime: Runtime | None = None,
) -> Mapping[str, Any]:
    """Return the effect's decrypted arguments after recording the operator's read."""
    rt = runtime or get_runtime()
    actor, why = operator_name(operator), reason_text(reason)
    record = inspection.get_effect(tenant, effect_id)
    if record.status not in READABLE:
        raise IllegalTransitionError(
            f"effect {record.effect_id} is {record.status.value}: its full arguments "
            "are shown only while it waits for an operator or an approval (the "
            "preview fields are always shown)",
            refusal="not_awaiting_operator",
            effect_id=record.effect_id,
        )
    with transaction.atomic():
        store.touch(
            record,
            event_type=EVENT_TYPE,
            actor=actor,
            now=rt.clock.now(),
            metadata={"reason": why},
        )
        arguments = load_arguments(rt, record)
    logger.info(
        "operator read arguments",
        extra={"action": EVENT_TYPE, "effect_id": record.effect_id, "operator": actor},
    )
    return arguments
