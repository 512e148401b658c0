"""Admission: claim an effect for an attempt, within its contract's dispatch limits.

Issue 24, item 7: ``max_in_flight`` and ``rate_limit`` hold across every worker. For a
contract that declares either, the claim (DISPATCHING and the attempt row, committed
before any I/O) commits in ONE transaction with the admission decision, taken under
the contract's row lock (``store.dispatch_controls``): the next worker's decision
waits for this claim's commit and counts it. A refused effect is not written at all;
its job is deferred to the wake time the decision gives (in the same transaction),
so it waits, and is never failed for a limit. A contract without limits claims as
before: one statement, no lock, nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from effect_broker import store
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.dispatch_limits import admit
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.observability import metrics
from effect_broker.services import deadlines
from effect_broker.services.runtime import Runtime
from effect_broker.store import dispatch_controls


@dataclass(frozen=True, slots=True)
class Waiting:
    """The contract's limit refused the attempt for now: why, and until when."""

    reason: str
    wake_at: datetime


def claim(
    rt: Runtime,
    record: EffectRecord,
    contract: EffectContract,
    *,
    worker: str,
    metadata: Mapping[str, object] | None = None,
) -> tuple[EffectRecord, str] | Waiting:
    """Commit DISPATCHING and the attempt row, or (over a limit) nothing but the
    limit's state and, for a dispatch job, the job's next run. ``metadata``: more
    facts for the ``dispatch_started`` event (the approval a first send consumes)."""
    changes = deadlines.claim_changes(rt, record, contract, worker=worker)
    limits = contract.limits
    if not limits.limited:
        return store.start_attempt(
            record, worker=worker, now=rt.clock.now(), changes=changes, metadata=metadata
        )
    offset = rt.clock.database_offset()
    with transaction.atomic():
        state, now = dispatch_controls.lock_bucket(contract.name, offset=offset)
        in_flight = (
            dispatch_controls.count_in_flight(contract.name, offset=offset)
            if limits.max_in_flight is not None
            else 0
        )
        decision = admit(limits, state, now=now, in_flight=in_flight)
        dispatch_controls.store_bucket(contract.name, decision.state)
        if decision.admitted:
            # A refused claim (StaleWriteError) rolls the token back with it.
            return store.start_attempt(
                record,
                worker=worker,
                now=rt.clock.now(),
                changes=changes,
                # When, on the database's clock, the limits admitted it: what the
                # guarantee is stated on (docs/how-to/operator-controls.md).
                metadata={
                    **(metadata or {}),
                    "admitted_at": now.isoformat(),
                    "in_flight": in_flight,
                },
            )
        assert decision.reason is not None
        assert decision.wake_at is not None
        if record.status is not EffectStatus.RECONCILING:
            # Committed with the limit's state; a same-key resend (RECONCILING) is
            # rescheduled by its caller, which writes the wait into the ledger.
            rt.scheduler.dispatch(record.effect_id, at=decision.wake_at)
    metrics.deferred(record, reason=decision.reason)
    return Waiting(decision.reason, decision.wake_at)
