"""Recording how a dispatch or probe ended: one fenced write per outcome.

Spec "State machine" rules 2-3: only proof of non-commit becomes RETRYABLE; a timeout,
a lost connection after send, worker death or an expired lease becomes OUTCOME_UNKNOWN,
never an ordinary retry. The transition, its event, the attempt's close and the receipt
are one statement (``store.transition`` riders); only an outcome that also defers a job
needs a transaction around it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from django.db import transaction

from effect_broker import failpoints, store
from effect_broker.adapters.base import DispatchResult
from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.ids import new_row_id
from effect_broker.domain.keys import digest_hex
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.services.payloads import seal_result
from effect_broker.services.runtime import Runtime

_CLEAR_LEASE = {"lease_owner": None, "lease_expires_at": None}


def _subject(record: EffectRecord) -> str:
    """Whom a failpoint armed by the crash matrix targets."""
    return f"{record.tenant_id}/{record.operation_key}"


def _closing(
    attempt_id: str | None, outcome: store.AttemptOutcome, *, now: datetime
) -> tuple[store.Rider, ...]:
    """The attempt close riding on an outcome's transition, if there is an attempt."""
    if attempt_id is None:
        return ()
    return (store.close_attempt(attempt_id, outcome, now=now),)


def record_success(
    rt: Runtime,
    record: EffectRecord,
    contract: EffectContract,
    result: DispatchResult,
    *,
    actor: str,
    attempt_id: str | None,
    event_type: str,
    evidence: Mapping[str, object] | None = None,
) -> EffectRecord:
    """Write the receipt and SUCCEEDED together (or nothing, if the fence refuses)."""
    now = rt.clock.now()
    receipt_id = new_row_id()
    output = dict(result.output)
    output_json = canonical_json(output)  # sealed, and digested as response/evidence
    key_id, blob, preview = seal_result(
        rt,
        record,
        output,
        (*contract.preview_fields, "id", "status"),
        canonical=output_json,
    )
    evidence_json = output_json if evidence is None else canonical_json(dict(evidence))
    riders = [
        store.receipt(
            record,
            store.ReceiptData(
                external_id=result.external_id,
                result_ciphertext=blob,
                result_key_id=key_id,
                result_preview=preview,
                evidence_digest=digest_hex(evidence_json),
                downstream_key_digest=digest_hex(record.downstream_key.encode()),
                contract_version=record.contract_version,
                target_timestamp=result.target_timestamp,
            ),
            now=now,
            receipt_id=receipt_id,
        )
    ]
    if attempt_id is not None:
        riders.append(
            store.close_attempt(
                attempt_id,
                store.AttemptOutcome(
                    outcome="succeeded",
                    response_digest=digest_hex(output_json),
                ),
                now=now,
            )
        )
    # The receipt's write (transition, event, receipt, attempt: one statement) is
    # about to be sent: dying here leaves the target's effect without a receipt.
    failpoints.hit("before_receipt_commit", subject=_subject(record))
    updated = store.transition(
        record,
        EffectStatus.SUCCEEDED,
        event_type=event_type,
        actor=actor,
        now=now,
        metadata={"receipt_id": receipt_id, "external_id": result.external_id or ""},
        changes={**_CLEAR_LEASE, "receipt_id": receipt_id, "next_action_at": None},
        riders=riders,
    )
    if not transaction.get_connection().in_atomic_block:
        # Only here has the receipt really committed (the transactional path commits
        # in its caller and passes this failpoint there).
        failpoints.hit("after_receipt_commit", subject=_subject(record))
    return updated


def record_retryable(
    rt: Runtime,
    record: EffectRecord,
    contract: EffectContract,
    *,
    actor: str,
    attempt_id: str,
    reason: str,
) -> EffectRecord:
    """Proof of non-commit: back off and retry, or stop when the budget is spent."""
    now = rt.clock.now()
    closed = store.close_attempt(
        attempt_id,
        store.AttemptOutcome(
            outcome="not_committed", error_category=reason, bytes_may_have_left=False
        ),
        now=now,
    )
    if record.attempt_count > contract.retry_limit:
        return store.transition(
            record,
            EffectStatus.FAILED_FINAL,
            event_type="retries_exhausted",
            actor=actor,
            now=now,
            metadata={"reason": reason, "attempts": record.attempt_count},
            changes={**_CLEAR_LEASE, "next_action_at": None},
            riders=(closed,),
        )
    due = now + contract.backoff(record.attempt_count)
    with transaction.atomic():  # the retry's job commits with the transition
        updated = store.transition(
            record,
            EffectStatus.RETRYABLE,
            event_type="dispatch_rejected",
            actor=actor,
            now=now,
            metadata={"reason": reason},
            changes={**_CLEAR_LEASE, "next_action_at": due},
            riders=(closed,),
        )
        rt.scheduler.dispatch(record.effect_id, at=due)
    return updated


def record_failed(
    rt: Runtime,
    record: EffectRecord,
    *,
    actor: str,
    attempt_id: str | None,
    reason: str,
    event_type: str = "dispatch_refused",
) -> EffectRecord:
    """A definitive refusal by the target: FAILED_FINAL."""
    now = rt.clock.now()
    return store.transition(
        record,
        EffectStatus.FAILED_FINAL,
        event_type=event_type,
        actor=actor,
        now=now,
        metadata={"reason": reason},
        changes={**_CLEAR_LEASE, "next_action_at": None},
        riders=_closing(
            attempt_id,
            store.AttemptOutcome(outcome="refused", error_category=reason),
            now=now,
        ),
    )


def unknown_follow_up(record: EffectRecord, now: datetime) -> datetime | None:
    """When to reconcile an unknown outcome; None for unsafe (an operator decides)."""
    if record.safety is SafetyClass.UNSAFE:
        return None
    if record.safety is SafetyClass.RECONCILABLE and record.settlement_deadline:
        # A negative lookup is not conclusive before the settlement deadline, and a
        # positive one may not be visible yet either: probe once it has passed.
        return max(now, record.settlement_deadline)
    return now


def record_unknown(
    rt: Runtime,
    record: EffectRecord,
    *,
    actor: str,
    attempt_id: str | None,
    reason: str,
    event_type: str = "outcome_unknown",
) -> EffectRecord:
    """Bytes may have left and no answer came back: OUTCOME_UNKNOWN, never a retry."""
    now = rt.clock.now()
    due = unknown_follow_up(record, now)
    with transaction.atomic():  # the reconciliation job commits with the transition
        updated = store.transition(
            record,
            EffectStatus.OUTCOME_UNKNOWN,
            event_type=event_type,
            actor=actor,
            now=now,
            metadata={"reason": reason},
            changes={**_CLEAR_LEASE, "next_action_at": due},
            riders=_closing(
                attempt_id,
                store.AttemptOutcome(outcome="unknown", error_category=reason),
                now=now,
            ),
        )
        if due is not None:
            rt.scheduler.reconcile(record.effect_id, at=due)
    return updated
