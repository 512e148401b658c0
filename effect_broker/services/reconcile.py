"""Reconcile: resolve an unknown outcome from the target's truth, never by guessing.

Spec "State machine" rules 4-6:

* idempotent   - redispatch with the SAME downstream key while the target still retains
                 it (less a safety margin); after that, manual review;
* reconcilable - probe first. COMMITTED records the receipt without any resend; a
                 NOT_COMMITTED answer is conclusive only if the probe was issued at or
                 after the settlement deadline, read on the database's clock BEFORE the
                 probe is sent (``services.deadlines``); before it, or with no deadline
                 at all, it counts as unknown; only a conclusive NOT_COMMITTED requeues
                 the effect, and only it clears the doubt;
* unsafe       - never redispatched; it stays outcome_unknown until an operator acts.
"""

from __future__ import annotations

import logging
import random
from datetime import datetime

from django.db import transaction

from effect_broker import store
from effect_broker.adapters.base import DispatchResult, ProbeRequest, ProbeResult
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import StaleWriteError
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, ProbeStatus, SafetyClass
from effect_broker.observability import metrics
from effect_broker.observability.instrumentation import reconcile_span
from effect_broker.services import deadlines, outcomes, pauses
from effect_broker.services.dispatch import note_stale_write, send_attempt
from effect_broker.services.outcomes import to_manual_review
from effect_broker.services.payloads import load_arguments
from effect_broker.services.runtime import Runtime, get_runtime
from effect_broker.store import db_time

_CLEAR_LEASE = {"lease_owner": None, "lease_expires_at": None}


def reconcile(
    effect_id: str, *, worker: str, runtime: Runtime | None = None
) -> EffectRecord:
    """Reconcile ``effect_id`` if its outcome is unknown and it is due."""
    rt = runtime or get_runtime()
    record = store.load_effect_for_worker(effect_id)
    if record.status is not EffectStatus.OUTCOME_UNKNOWN:
        return record
    if record.safety is SafetyClass.UNSAFE:
        return record  # rule 6: an operator resolves it; nothing automatic, ever
    database_now = store.database_now(rt.clock.database_offset())
    if record.next_action_at is not None and record.next_action_at > database_now:
        rt.scheduler.reconcile(effect_id, at=record.next_action_at)
        return record
    if record.safety is SafetyClass.IDEMPOTENT and _held(record):
        return record
    contract = rt.registry.get(record.contract_name, record.contract_version)
    with reconcile_span(record) as work:  # its outcome counted by ended()
        return work.ended(_reconcile_due(rt, record, contract, worker, database_now))


def _held(record: EffectRecord) -> bool:
    """An idempotent effect's reconciliation is a same-key resend: a request that can
    create the charge, which an operator's pause holds (domain/pauses.py). The job
    ends here, scheduling nothing; resuming the pause defers it again. A lookup
    (reconcilable) only reads, and is never held."""
    held = pauses.pause_holding(record)
    if held is None:
        return False
    metrics.deferred(record, reason="paused")
    logging.getLogger(__name__).info(
        "resend held by a pause",
        extra={
            "action": "resend_paused",
            "effect_id": record.effect_id,
            "pause_id": held.pause_id,
        },
    )
    return True


def _reconcile_due(
    rt: Runtime,
    record: EffectRecord,
    contract: EffectContract,
    worker: str,
    database_now: datetime,
) -> EffectRecord:
    try:
        claimed = store.transition(
            record,
            EffectStatus.RECONCILING,
            event_type="reconcile_started",
            actor=worker,
            now=rt.clock.now(),
            changes={
                "lease_owner": worker,
                "lease_expires_at": deadlines.lease_until(rt),
            },
        )
        if record.safety is SafetyClass.IDEMPOTENT:
            return _reconcile_idempotent(
                rt, claimed, contract, worker=worker, database_now=database_now
            )
        if record.safety is SafetyClass.RECONCILABLE:
            return _reconcile_by_probe(rt, claimed, contract, worker=worker)
        return to_manual_review(
            rt,
            claimed,
            actor=worker,
            reason=f"{record.safety} effect with unknown outcome",
        )
    except StaleWriteError as exc:
        note_stale_write(rt, exc, actor=worker)
        return store.load_effect_for_worker(record.effect_id)


def _reconcile_idempotent(
    rt: Runtime,
    record: EffectRecord,
    contract: EffectContract,
    *,
    worker: str,
    database_now: datetime,
) -> EffectRecord:
    if not deadlines.within_key_retention(rt, record, database_now):
        metrics.retry_blocked(record)
        return to_manual_review(
            rt, record, actor=worker, reason="downstream key retention expired"
        )
    if record.attempt_count > contract.retry_limit:
        return to_manual_review(
            rt, record, actor=worker, reason="retry limit reached with outcome unknown"
        )
    # The same key on the wire again: the target deduplicates, so at most one effect.
    metrics.retry_retention(record, database_now)
    return send_attempt(rt, record, contract, rt.adapter_for(contract), worker=worker)


def _reconcile_by_probe(
    rt: Runtime, record: EffectRecord, contract: EffectContract, *, worker: str
) -> EffectRecord:
    adapter = rt.adapter_for(contract)
    arguments = load_arguments(rt, record)
    # When the probe was ISSUED decides whether "not found" is conclusive: read the
    # database's clock before sending it (a slow probe must not make itself late).
    issued_at = store.database_now(rt.clock.database_offset())
    probe = adapter.probe(
        ProbeRequest(effect=record, arguments=arguments, contract=contract)
    )
    settled = deadlines.settled(record, issued_at)
    evidence = _evidence(probe)
    if probe.status is ProbeStatus.COMMITTED:
        return outcomes.record_success(
            rt,
            record,
            contract,
            DispatchResult(
                external_id=probe.external_id, output=dict(probe.output or {})
            ),
            actor=worker,
            attempt_id=None,
            event_type="reconciled_committed",
            evidence=evidence,
        )
    if probe.status is ProbeStatus.NOT_COMMITTED and settled:
        return _requeue_not_committed(
            rt, record, contract, actor=worker, evidence=evidence
        )
    # Inconclusive: NOT_COMMITTED before the bound, or UNKNOWN.
    if record.settlement_deadline is None:
        return to_manual_review(
            rt,
            record,
            actor=worker,
            reason="no settlement deadline is known, so a negative lookup can never be "
            "conclusive; the lookup did not find the effect committed",
        )
    if settled and issued_at >= record.settlement_deadline + rt.timing.reconcile_window:
        return to_manual_review(
            rt, record, actor=worker, reason="lookup stayed inconclusive past its bound"
        )
    # Back off: each inconclusive lookup waits longer, up to backoff_max, jittered.
    waited = issued_at - record.settlement_deadline
    due = max(
        record.settlement_deadline,
        issued_at + contract.lookup_backoff(waited, random.random()),  # noqa: S311
    )
    with transaction.atomic():
        updated = store.transition(
            record,
            EffectStatus.OUTCOME_UNKNOWN,
            event_type="reconcile_inconclusive",
            actor=worker,
            now=rt.clock.now(),
            metadata={"settled": settled, **evidence},
            changes={**_CLEAR_LEASE, "next_action_at": due},
        )
        rt.scheduler.reconcile(record.effect_id, at=due)
    # Still unknown: INFO, since it repeats until the lookup settles or the window ends.
    outcomes.log_unknown(
        updated,
        reason="lookup inconclusive",
        event="reconcile_inconclusive",
        actor=worker,
        level=logging.INFO,
    )
    return updated


def _requeue_not_committed(
    rt: Runtime,
    record: EffectRecord,
    contract: EffectContract,
    *,
    actor: str,
    evidence: dict[str, object],
) -> EffectRecord:
    """Rule 5: a conclusive NOT_COMMITTED is the only way back to a resend."""
    now = rt.clock.now()
    with transaction.atomic():
        if record.attempt_count > contract.retry_limit:
            return metrics.failed(
                store.transition(
                    record,
                    EffectStatus.FAILED_FINAL,
                    event_type="not_committed_retries_exhausted",
                    actor=actor,
                    now=now,
                    metadata=evidence,
                    changes={**_CLEAR_LEASE, "next_action_at": None},
                )
            )
        updated = store.transition(
            record,
            EffectStatus.PREPARED,
            event_type="reconciled_not_committed",
            actor=actor,
            now=now,
            metadata=evidence,
            # A conclusive lookup proves no earlier attempt committed: the doubt ends.
            changes={
                **_CLEAR_LEASE,
                "next_action_at": db_time.after_now(rt.clock.database_offset()),
                "outcome_in_doubt": False,
            },
        )
        rt.scheduler.dispatch(record.effect_id)
    return updated


def _evidence(probe: ProbeResult) -> dict[str, object]:
    doc: dict[str, object] = {"probe": probe.status.value}
    if probe.external_id:
        doc["external_id"] = probe.external_id
    for key, value in (probe.evidence or {}).items():
        if isinstance(value, str | int | bool | float) or value is None:
            doc[f"evidence_{key}"] = value
    return doc
