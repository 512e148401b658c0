"""The sweeper: worker death is expected, so recovery is a routine, periodic job.

Spec "Durability and consistency mechanics": a stale DISPATCHING lease is converted to
OUTCOME_UNKNOWN - it is never assumed that the old worker did nothing. Due retries and
reconciliations whose job was lost are deferred again (queueing locks drop duplicates).
An effect still awaiting approval past its deadline (database clock) ends FAILED_FINAL,
``approval_expired``, never sent (issue 24; ``services.approvals``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.db import transaction

from effect_broker import store
from effect_broker.domain.errors import StaleWriteError
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.observability import metrics
from effect_broker.services import approvals, outcomes
from effect_broker.services.dispatch import note_stale_write
from effect_broker.services.runtime import Runtime, get_runtime
from effect_broker.store import db_time
from effect_broker.store.lock_waits import gave_up_waiting
from effect_broker.store.reads import due_effects, expired_leases, open_attempt_id

logger = logging.getLogger(__name__)

_ALL = [s.value for s in SafetyClass]
_AUTOMATIC = [s.value for s in SafetyClass if s is not SafetyClass.UNSAFE]


@dataclass(frozen=True)
class SweepReport:
    """What one sweep did."""

    leases_expired: int
    redeferred_dispatch: int
    redeferred_reconcile: int
    stale_writes: int
    #: Rows or jobs skipped: another session held them past the sweep's lock wait.
    busy: int = 0
    #: Effects whose approval deadline passed: failed_final, never sent.
    approvals_expired: int = 0


def _unless_busy(work: Callable[[], object]) -> bool:
    """Run ``work`` in a savepoint; False (and nothing of it kept) when a statement
    gave up waiting for a lock another session holds. A stuck session must not stop
    the sweep that recovers everything else (issue 19 item 7)."""
    try:
        with transaction.atomic():
            work()
    except Exception as exc:  # Django's or procrastinate's wrapping of psycopg's
        if not gave_up_waiting(exc):
            raise
        return False
    return True


def sweep(*, actor: str = "sweeper", runtime: Runtime | None = None) -> SweepReport:
    """Convert expired leases to unknown outcomes and re-defer due work."""
    rt = runtime or get_runtime()
    now = rt.clock.now()
    offset = rt.clock.database_offset()
    expired = stale = busy = 0
    # Expired by the database's clock: a sweeper on a host whose clock runs ahead
    # must not declare a live worker dead. Rows another session holds are not read
    # (SKIP LOCKED); the sweep's lock waits are bounded (store.lock_waits).
    for record in expired_leases(
        [EffectStatus.DISPATCHING, EffectStatus.RECONCILING], offset=offset
    ):
        try:
            if not _unless_busy(partial(_expire, rt, record, actor, now)):
                busy += 1
                continue
            expired += 1
            metrics.lease_expired(record)
        except StaleWriteError as exc:  # the worker finished after all, just in time
            note_stale_write(rt, exc, actor=actor)
            stale += 1
    grace = rt.timing.redefer_grace
    dispatch_due = 0
    for status in (EffectStatus.PREPARED, EffectStatus.RETRYABLE):
        for record in due_effects(status, grace=grace, safety=_ALL, offset=offset):
            if _unless_busy(partial(rt.scheduler.dispatch, record.effect_id)):
                dispatch_due += 1
            else:
                busy += 1
    reconcile_due = 0
    for record in due_effects(
        EffectStatus.OUTCOME_UNKNOWN, grace=grace, safety=_AUTOMATIC, offset=offset
    ):
        if _unless_busy(partial(rt.scheduler.reconcile, record.effect_id)):
            reconcile_due += 1
        else:
            busy += 1
    approvals_expired = 0
    # Past the deadline on the database's clock (no grace: the deadline is the
    # contract's promise to the caller). The read locks the rows it returns, so an
    # operator's approval of one of them waits for this sweep, then finds it expired.
    for record in due_effects(
        EffectStatus.AWAITING_APPROVAL, grace=timedelta(0), safety=_ALL, offset=offset
    ):
        decided: list[EffectRecord | None] = []
        if not _unless_busy(partial(_expire_approval, rt, record, actor, decided)):
            busy += 1
        elif decided and decided[0] is not None:
            approvals_expired += 1
    report = SweepReport(
        expired, dispatch_due, reconcile_due, stale, busy, approvals_expired
    )
    if expired or stale or busy:
        logger.warning("sweep", extra={"action": "sweep", **report.__dict__})
    return report


def _expire_approval(
    rt: Runtime, record: EffectRecord, actor: str, decided: list[EffectRecord | None]
) -> None:
    """Expire one effect past its approval deadline (None: an operator was first)."""
    decided.append(approvals.expire_due(rt, record, actor=actor))


def _expire(rt: Runtime, record: EffectRecord, actor: str, now: datetime) -> None:
    """Hand an expired lease on: DISPATCHING becomes OUTCOME_UNKNOWN, RECONCILING is
    reconciled again."""
    if record.status is EffectStatus.DISPATCHING:
        outcomes.record_unknown(
            rt,
            record,
            actor=actor,
            # The dead worker's attempt is closed as "unknown": bytes may have
            # left, and nobody saw an answer.
            attempt_id=open_attempt_id(record.effect_id),
            reason=f"dispatch lease of {record.lease_owner} expired",
            event_type="lease_expired",
            # The worker may be paused, not dead: it could have sent as late
            # as the end of its lease, and settlement counts from there.
            lease_expired=True,
        )
    else:
        # An interrupted reconciliation learned nothing: the outcome is still
        # unknown, and it is reconciled again.
        with transaction.atomic():
            unknown = store.transition(
                record,
                EffectStatus.OUTCOME_UNKNOWN,
                event_type="reconcile_lease_expired",
                actor=actor,
                now=now,
                changes={
                    "lease_owner": None,
                    "lease_expires_at": None,
                    "next_action_at": db_time.after_now(rt.clock.database_offset()),
                },
            )
            rt.scheduler.reconcile(record.effect_id)
        outcomes.log_unknown(
            unknown,
            reason=f"reconcile lease of {record.lease_owner} expired",
            event="reconcile_lease_expired",
            actor=actor,
            level=logging.INFO,
        )
