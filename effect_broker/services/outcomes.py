"""Recording how a dispatch or probe ended: one fenced write per outcome.

Spec "State machine" rules 2-3: only proof of non-commit becomes RETRYABLE; a timeout,
a lost connection after send, worker death or an expired lease becomes OUTCOME_UNKNOWN,
never an ordinary retry. The transition, its event, the attempt's close and the receipt
are one statement (``store.transition`` riders); only an outcome that also defers a job
needs a transaction around it.

Unknown is sticky (issue "correctness at the edges", defect 3): once an attempt may
have reached the target unanswered (``outcome_in_doubt``), a later refusal, terminal
answer or spent retry budget proves nothing about that earlier attempt - it may hold
the charge. Such an effect goes back to OUTCOME_UNKNOWN (reconciliation: a same-key
resend or a probe) or to MANUAL_REVIEW with the reason, never to FAILED_FINAL. Only
proof of non-commit (a conclusive probe, an operator's attestation) clears the doubt.
"""

from __future__ import annotations

import logging
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
from effect_broker.domain.states import EffectStatus
from effect_broker.observability import metrics
from effect_broker.services import deadlines
from effect_broker.services.payloads import seal_result
from effect_broker.services.running_jobs import RunningJob
from effect_broker.services.runtime import Runtime
from effect_broker.store import db_time

_CLEAR_LEASE = {"lease_owner": None, "lease_expires_at": None}
#: The ``via`` label of a success, by the event that recorded it.
_VIA = {"dispatch_succeeded": "dispatch", "reconciled_committed": "reconcile"}

#: Said wherever a refusal may not end an effect: the reason operators read.
_IN_DOUBT = (
    "an earlier attempt may have reached the target unanswered, so this cannot prove "
    "that nothing was charged"
)

logger = logging.getLogger(__name__)


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
    job: RunningJob | None = None,
) -> EffectRecord:
    """Write the receipt and SUCCEEDED together (or nothing, if the fence refuses).

    ``job``: the dispatch job this runs in; written in autocommit, the same statement
    finishes it (``services.running_jobs``). Inside a caller's transaction the job is
    left to procrastinate: that commit is not this function's to report."""
    now = rt.clock.now()
    in_transaction = transaction.get_connection().in_atomic_block
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
    finishes = job if job is not None and not in_transaction else None
    if finishes is not None:
        riders.append(store.finish_job(finishes.id, delete=finishes.delete))
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
        # The outcome is known now: whatever was in doubt, this is the receipt.
        changes={
            **_CLEAR_LEASE,
            "receipt_id": receipt_id,
            "next_action_at": None,
            "outcome_in_doubt": False,
        },
        riders=riders,
    )
    if not in_transaction:
        # Only here has the receipt really committed (the transactional path commits
        # in its caller and passes this failpoint there).
        if finishes is not None:
            finishes.finished_by_outcome()
        failpoints.hit("after_receipt_commit", subject=_subject(record))
    metrics.succeeded(updated, via=_VIA.get(event_type, "other"), now=now)
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
        if record.outcome_in_doubt:
            return _back_to_unknown(
                rt,
                record,
                actor=actor,
                riders=(closed,),
                reason=f"retry limit reached ({reason}); {_IN_DOUBT}",
                event_type="retries_exhausted_in_doubt",
            )
        return metrics.failed(
            store.transition(
                record,
                EffectStatus.FAILED_FINAL,
                event_type="retries_exhausted",
                actor=actor,
                now=now,
                metadata={"reason": reason, "attempts": record.attempt_count},
                changes={**_CLEAR_LEASE, "next_action_at": None},
                riders=(closed,),
            )
        )
    due = db_time.after_now(
        rt.clock.database_offset(), contract.backoff(record.attempt_count)
    )
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
        rt.scheduler.dispatch(record.effect_id, at=updated.next_action_at)
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
    """A definitive refusal by the target: FAILED_FINAL, unless an earlier attempt
    is in doubt (then reconciliation or an operator decides, module docstring)."""
    now = rt.clock.now()
    closing = _closing(
        attempt_id,
        store.AttemptOutcome(outcome="refused", error_category=reason),
        now=now,
    )
    if record.outcome_in_doubt:
        if record.status is EffectStatus.DISPATCHING:
            return _back_to_unknown(
                rt,
                record,
                actor=actor,
                riders=closing,
                reason=f"{reason}; {_IN_DOUBT}",
                event_type="refused_in_doubt",
            )
        return to_manual_review(rt, record, actor=actor, reason=f"{reason}; {_IN_DOUBT}")
    return metrics.failed(
        store.transition(
            record,
            EffectStatus.FAILED_FINAL,
            event_type=event_type,
            actor=actor,
            now=now,
            metadata={"reason": reason},
            changes={**_CLEAR_LEASE, "next_action_at": None},
            riders=closing,
        )
    )


def record_key_reused(
    rt: Runtime,
    record: EffectRecord,
    *,
    actor: str,
    attempt_id: str | None,
    reason: str,
) -> EffectRecord:
    """The target refused this attempt because the effect's key already holds a
    request with other parameters (Stripe's ``idempotency_error``; issue 19, item 5).

    No resend under the key can succeed, so retrying only burns the budget; and the
    key proves something was sent under it - after an attempt in doubt, most likely
    this effect's own earlier attempt with other parameters (a rotated secret, a new
    contract version). Neither a retry nor FAILED_FINAL is honest: MANUAL_REVIEW with
    the reason, in one transaction. The state table has no edge from DISPATCHING to
    MANUAL_REVIEW, so it passes through OUTCOME_UNKNOWN, as resolutions pass through
    MANUAL_REVIEW; the doubt is recorded (what the key holds is not known).
    """
    now = rt.clock.now()
    if record.outcome_in_doubt:
        reason = f"{reason}; {_IN_DOUBT}"
    closing = _closing(
        attempt_id,
        store.AttemptOutcome(outcome="refused", error_category=reason),
        now=now,
    )
    with transaction.atomic():
        unknown = store.transition(
            record,
            EffectStatus.OUTCOME_UNKNOWN,
            event_type="key_reused",
            actor=actor,
            now=now,
            metadata={"reason": reason},
            changes={**_CLEAR_LEASE, "next_action_at": None, "outcome_in_doubt": True},
            riders=closing,
        )
        return to_manual_review(rt, unknown, actor=actor, reason=reason)


def to_manual_review(
    rt: Runtime, record: EffectRecord, *, actor: str, reason: str
) -> EffectRecord:
    """Stop automatic handling: the effect waits for an operator, with the reason."""
    return metrics.manual_review(
        store.transition(
            record,
            EffectStatus.MANUAL_REVIEW,
            event_type="manual_review_required",
            actor=actor,
            now=rt.clock.now(),
            metadata={"reason": reason},
            changes={**_CLEAR_LEASE, "next_action_at": None},
        )
    )


def _back_to_unknown(
    rt: Runtime,
    record: EffectRecord,
    *,
    actor: str,
    riders: tuple[store.Rider, ...],
    reason: str,
    event_type: str,
) -> EffectRecord:
    """An attempt ended in a refusal while an earlier one is in doubt: the outcome is
    still unknown, and reconciliation (or an operator) settles it."""
    return _write_unknown(
        rt,
        record,
        actor=actor,
        riders=riders,
        reason=reason,
        event_type=event_type,
        lease_expired=False,
    )


def log_unknown(
    record: EffectRecord,
    *,
    reason: str,
    event: str,
    actor: str,
    level: int = logging.WARNING,
) -> None:
    """Log that ``record`` is (still) OUTCOME_UNKNOWN: ids and classification only,
    never arguments, outputs or keys (STYLE rule 8). Call it after the commit, so
    the line never speaks of a state that rolled back."""
    logger.log(
        level,
        "effect outcome unknown",
        extra={
            "action": "outcome_unknown",
            "effect_id": record.effect_id,
            "tool": record.tool,
            "contract": f"{record.contract_name}@{record.contract_version}",
            "safety": record.safety.value,
            "attempt": record.attempt_count,
            "reason": reason,
            "event": event,
            "actor": actor,
        },
    )


def record_unknown(
    rt: Runtime,
    record: EffectRecord,
    *,
    actor: str,
    attempt_id: str | None,
    reason: str,
    event_type: str = "outcome_unknown",
    lease_expired: bool = False,
) -> EffectRecord:
    """Bytes may have left and no answer came back: OUTCOME_UNKNOWN, never a retry.

    ``lease_expired``: the worker is presumed dead rather than having seen its call
    end, so the request may have been sent as late as the end of its lease.
    """
    now = rt.clock.now()
    return _write_unknown(
        rt,
        record,
        actor=actor,
        riders=_closing(
            attempt_id,
            store.AttemptOutcome(outcome="unknown", error_category=reason),
            now=now,
        ),
        reason=reason,
        event_type=event_type,
        lease_expired=lease_expired,
    )


def _write_unknown(
    rt: Runtime,
    record: EffectRecord,
    *,
    actor: str,
    riders: tuple[store.Rider, ...],
    reason: str,
    event_type: str,
    lease_expired: bool,
) -> EffectRecord:
    with transaction.atomic():  # the reconciliation job commits with the transition
        updated = store.transition(
            record,
            EffectStatus.OUTCOME_UNKNOWN,
            event_type=event_type,
            actor=actor,
            now=rt.clock.now(),
            metadata={"reason": reason},
            changes=deadlines.unknown_changes(rt, record, lease_expired=lease_expired),
            riders=riders,
        )
        if updated.next_action_at is not None:
            rt.scheduler.reconcile(record.effect_id, at=updated.next_action_at)
    metrics.unknown(updated, cause=event_type)
    # Logged after the commit, so the line never speaks of a state that rolled back.
    log_unknown(updated, reason=reason, event=event_type, actor=actor)
    return updated
