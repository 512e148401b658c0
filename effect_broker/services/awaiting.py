"""Wait a bounded time for an effect to settle, woken by its change notifications.

The MCP proxy tools (issue 10, item 3) answer a call with the effect's outcome when it
comes quickly, and with "still running, call again with the same key" when it does not.
Waiting is on PostgreSQL LISTEN/NOTIFY (``store.changes``), not polling: the row is
re-read only when a notification names this effect.
"""

from __future__ import annotations

import time

from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.models import Tenant
from effect_broker.services import inspection
from effect_broker.store.changes import listen_for_changes

#: Final states: nothing automatic changes them.
FINAL = frozenset(
    {EffectStatus.SUCCEEDED, EffectStatus.FAILED_FINAL, EffectStatus.COMPENSATED}
)


def settled_for_caller(record: EffectRecord) -> bool:
    """True when waiting longer cannot help the caller: the effect is final, or only an
    operator can move it on (an unsafe unknown outcome, manual review). A reconcilable
    or idempotent unknown outcome is still being worked on, so it is worth waiting for."""
    return record.status in FINAL or inspection.needs_operator(record)


def wait_until_settled(tenant: Tenant, effect_id: str, timeout: float) -> EffectRecord:
    """Return ``tenant``'s effect once it is settled for its caller, or as it is when
    ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    with listen_for_changes() as listener:
        # Read after LISTEN: a change committed before it is in this read.
        record = inspection.get_effect(tenant, effect_id)
        while not settled_for_caller(record):
            woken = listener.wait(record.effect_id, deadline - time.monotonic())
            # One read on waking, and one at the deadline: the caller gets the state
            # as it is when the wait ends.
            record = inspection.get_effect(tenant, effect_id)
            if not woken:
                break
    return record
