"""When a worker may act: leases, attempt limits, key retention and settlement.

Every deadline here is written by the database in the write itself and compared with
the database's clock (``store.db_time``, ``store.database_now``), never with a host's:
one host whose clock is off must not expire a live lease, stretch a retention horizon
or make a negative lookup conclusive early (issue "correctness at the edges", defect 7).

Settlement (defect 2) counts from the latest moment the request may still have been
sent, not from the attempt's start:

* the worker recorded the unknown outcome itself: its call has returned, so the latest
  send was before now - the bound counts from now (plus the send margin, for bytes
  still in flight);
* the worker is presumed dead (its lease expired): a paused worker passes the send gate
  only before its lease ends less the margin (``services.lease``), so the bound counts
  from the end of the lease it held, plus the margin.

A deadline only ever moves later (``GREATEST``): an earlier attempt's bound still holds.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import UnknownContractError
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import SafetyClass
from effect_broker.services.runtime import Runtime
from effect_broker.store import db_time


def attempt_limit(rt: Runtime, contract: EffectContract) -> timedelta:
    """The total time one attempt may take: the contract's, or the lease less the
    send margin (so an attempt that overruns is noticed by its own worker first)."""
    if contract.attempt_timeout is not None:
        return contract.attempt_timeout
    return max(rt.timing.lease - rt.timing.send_margin, timedelta(milliseconds=100))


def lease_until(rt: Runtime) -> db_time.DbTime:
    """A lease from now, on the database's clock."""
    return db_time.after_now(rt.clock.database_offset(), rt.timing.lease)


def claim_changes(
    rt: Runtime, record: EffectRecord, contract: EffectContract, *, worker: str
) -> dict[str, Any]:
    """Lease, first-dispatch time and retention horizon written with DISPATCHING.

    The settlement deadline is not set here: it is set when an outcome becomes
    unknown, from the moment the request may last have been sent (module docstring).
    """
    offset = rt.clock.database_offset()
    changes: dict[str, Any] = {
        "lease_owner": worker,
        "lease_expires_at": lease_until(rt),
        "next_action_at": None,
        "first_dispatch_at": db_time.first_dispatch_or_now(offset),
    }
    if contract.safety is SafetyClass.IDEMPOTENT and contract.key_retention:
        # Counted from the first dispatch: the target remembers the key from then on.
        changes["retention_deadline"] = db_time.after_first_dispatch(
            offset, contract.key_retention
        )
    return changes


def unknown_changes(
    rt: Runtime, record: EffectRecord, *, lease_expired: bool
) -> dict[str, Any]:
    """What becomes true with OUTCOME_UNKNOWN: in doubt, no lease, and when to look.

    unsafe: never looked at again automatically (spec rule 6). idempotent: reconcile
    now (a same-key resend is safe). reconcilable: at the settlement deadline, counted
    from the latest moment the request may have been sent.
    """
    offset = rt.clock.database_offset()
    changes: dict[str, Any] = {
        "lease_owner": None,
        "lease_expires_at": None,
        "outcome_in_doubt": True,
    }
    if record.safety is SafetyClass.UNSAFE:
        changes["next_action_at"] = None
    elif record.safety is SafetyClass.RECONCILABLE:
        bound = _settlement_bound(rt, record)
        if bound is None:
            # No bound known: no negative lookup can ever be conclusive; a probe may
            # still find the effect committed.
            changes["next_action_at"] = db_time.after_now(offset)
        else:
            wait = rt.timing.send_margin + bound
            latest_send = (
                db_time.after_lease_end(offset, wait)
                if lease_expired
                else db_time.after_now(offset, wait)
            )
            deadline = db_time.no_earlier_than_settlement(latest_send)
            changes["settlement_deadline"] = deadline
            changes["next_action_at"] = deadline
    else:
        changes["next_action_at"] = db_time.after_now(offset)
    return changes


def _settlement_bound(rt: Runtime, record: EffectRecord) -> timedelta | None:
    try:
        contract = rt.registry.get(record.contract_name, record.contract_version)
    except UnknownContractError:
        return None
    return contract.settlement_bound


def within_key_retention(
    rt: Runtime, record: EffectRecord, database_now: datetime
) -> bool:
    """True while an idempotent target still remembers the downstream key (less the
    margin), by the database's clock.

    Spec rule 4 and "Important constraints": once the target may have forgotten the
    key, a resend could create a second effect, so automatic retry stops.
    """
    if record.safety is not SafetyClass.IDEMPOTENT or record.retention_deadline is None:
        return True
    return database_now < record.retention_deadline - rt.timing.retention_margin


def settled(record: EffectRecord, probe_issued_at: datetime) -> bool:
    """Whether a negative lookup issued at ``probe_issued_at`` (database clock, read
    before the probe was sent) is conclusive. A missing deadline never is."""
    deadline = record.settlement_deadline
    return deadline is not None and probe_issued_at >= deadline
