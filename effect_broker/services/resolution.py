"""Operator resolution of unknown outcomes, and requests to reconcile them.

Spec "HTTP, CLI, and MCP surfaces": operator resolution has three explicit choices -
attach proof of success, attach proof of non-commit and requeue where the contract
permits it, or mark final failure - and there is no "retry anyway" shortcut for unsafe
effects. The read-only side (effect lookup, history, receipts, the operator listing)
is ``services.inspection``.

Each resolution is ONE transaction of fenced writes: both events when it passes through
MANUAL_REVIEW (the table has no direct edge out of OUTCOME_UNKNOWN), the receipt, the
dispatch job - all or nothing. A concurrent writer makes it raise ``StaleWriteError``
and nothing is written; the caller reloads and decides again, because what the operator
decided about may have changed. Such a refusal is a normal race between two live actors,
not a zombie's late write, so it is not counted in ``effect_stale_writes`` (that count
alerts on fenced-out workers).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db import transaction

from effect_broker import store
from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.errors import (
    IllegalTransitionError,
    InvalidRequestError,
    UnknownContractError,
)
from effect_broker.domain.ids import new_row_id
from effect_broker.domain.keys import digest_hex
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass, is_terminal
from effect_broker.models import Tenant
from effect_broker.services import inspection
from effect_broker.services.payloads import seal_result
from effect_broker.services.runtime import Runtime, get_runtime

logger = logging.getLogger(__name__)

RESOLVABLE: frozenset[EffectStatus] = frozenset(
    {EffectStatus.OUTCOME_UNKNOWN, EffectStatus.MANUAL_REVIEW}
)
"""Statuses an operator may resolve; everything else is refused."""

MAX_OPERATOR_CHARS = 200
MAX_REASON_CHARS = 2000
MAX_EXTERNAL_ID_CHARS = 500
MAX_EVIDENCE_BYTES = 64 * 1024

_SETTLED = {"lease_owner": None, "lease_expires_at": None, "next_action_at": None}


class Resolution(StrEnum):
    """The operator's three explicit choices (spec "HTTP, CLI, and MCP surfaces")."""

    SUCCEEDED = "succeeded"
    NOT_COMMITTED = "not_committed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ReconcileRequest:
    """The effect as read, and whether a reconcile job was deferred for it."""

    effect: EffectRecord
    deferred: bool


# --- resolutions ------------------------------------------------------------------


def resolve(
    tenant: Tenant,
    effect_id: str,
    resolution: Resolution | str,
    *,
    operator: str,
    reason: str,
    evidence: Mapping[str, object] | None = None,
    external_id: str | None = None,
    runtime: Runtime | None = None,
) -> EffectRecord:
    """Apply one of the three resolutions by name (one entry point for every surface)."""
    try:
        choice = Resolution(resolution)
    except ValueError:
        raise InvalidRequestError(
            f"unknown resolution {resolution!r}; choose one of "
            + ", ".join(r.value for r in Resolution)
        ) from None
    if choice is Resolution.FAILED:
        return resolve_failed(
            tenant,
            effect_id,
            operator=operator,
            reason=reason,
            evidence=evidence,
            runtime=runtime,
        )
    if choice is Resolution.NOT_COMMITTED:
        return resolve_not_committed(
            tenant,
            effect_id,
            operator=operator,
            reason=reason,
            evidence=evidence or {},
            runtime=runtime,
        )
    return resolve_succeeded(
        tenant,
        effect_id,
        operator=operator,
        reason=reason,
        evidence=evidence or {},
        external_id=external_id,
        runtime=runtime,
    )


def resolve_succeeded(
    tenant: Tenant,
    effect_id: str,
    *,
    operator: str,
    reason: str,
    evidence: Mapping[str, object],
    external_id: str | None = None,
    runtime: Runtime | None = None,
) -> EffectRecord:
    """Proof of success: SUCCEEDED with a receipt whose encrypted result is the evidence.

    The evidence must be a non-empty JSON object: a success without proof would turn an
    effect that never happened into a receipt (an omission nobody would look for again).
    """
    rt = runtime or get_runtime()
    actor, why = _operator(operator), _reason(reason)
    proof, evidence_digest = _evidence(evidence, what="proof of success")
    external = _external_id(external_id)
    record = _resolvable(tenant, effect_id, EffectStatus.SUCCEEDED)
    key_id, blob, preview = seal_result(rt, record, proof, _preview_fields(rt, record))
    receipt_id = new_row_id()
    now = rt.clock.now()
    with transaction.atomic():
        review = _to_review(record, Resolution.SUCCEEDED, actor=actor, now=now)
        done = store.transition(
            review,
            EffectStatus.SUCCEEDED,
            event_type="resolved_succeeded",
            actor=actor,
            now=now,
            metadata={
                "reason": why,
                "evidence_digest": evidence_digest,
                "receipt_id": receipt_id,
                "external_id": external or "",
            },
            changes={**_SETTLED, "receipt_id": receipt_id},
            riders=(
                store.receipt(
                    review,
                    store.ReceiptData(
                        external_id=external,
                        result_ciphertext=blob,
                        result_key_id=key_id,
                        result_preview=preview,
                        evidence_digest=evidence_digest,
                        downstream_key_digest=digest_hex(record.downstream_key.encode()),
                        contract_version=record.contract_version,
                    ),
                    now=now,
                    receipt_id=receipt_id,
                ),
            ),
        )
    _log("resolve_succeeded", record, done, actor, evidence_digest)
    return done


def resolve_not_committed(
    tenant: Tenant,
    effect_id: str,
    *,
    operator: str,
    reason: str,
    evidence: Mapping[str, object],
    runtime: Runtime | None = None,
) -> EffectRecord:
    """Proof of non-commit: back to PREPARED and a dispatch job, if the contract permits.

    Which evidence is enough is the operator's judgement; the broker insists that there
    is some (a non-empty JSON object and a reason), keeps its digest in the event and
    refuses a resend the contract's retry limit does not allow.

    Unsafe effects are included on purpose. The spec forbids a "retry anyway" shortcut:
    resending because nobody knows what happened. This is the opposite - the operator
    attests, with evidence, that the target never applied the request, so the one resend
    cannot be a duplicate, and the attestation is on record under the operator's name.
    What makes it "retry anyway" is missing proof, so evidence is required here for
    every safety class: after ambiguity a reconcilable or expired-idempotent resend is
    no more deduplicated than an unsafe one. "Where the contract permits it" is the
    retry limit: the dispatcher itself refuses a resend past it, so the requeue is
    refused up front with advice to mark the effect failed (an unsafe contract with
    ``retry_limit = 0`` therefore never resends, whatever the operator attests).
    """
    rt = runtime or get_runtime()
    actor, why = _operator(operator), _reason(reason)
    _, evidence_digest = _evidence(evidence, what="proof of non-commit")
    record = _resolvable(tenant, effect_id, EffectStatus.PREPARED)
    contract = rt.registry.get(record.contract_name, record.contract_version)
    if record.attempt_count > contract.retry_limit:
        raise IllegalTransitionError(
            f"effect {record.effect_id} already made {record.attempt_count} attempt(s) "
            f"and contract {contract.name}@{contract.version} allows "
            f"{contract.retry_limit + 1} (retry_limit {contract.retry_limit}): the "
            "contract does not permit a resend; resolve it as failed instead",
            refusal="retry_limit_reached",
            effect_id=record.effect_id,
            old=record.status.value,
            new=EffectStatus.PREPARED.value,
            attempts=record.attempt_count,
            retry_limit=contract.retry_limit,
        )
    now = rt.clock.now()
    with transaction.atomic():
        review = _to_review(record, Resolution.NOT_COMMITTED, actor=actor, now=now)
        requeued = store.transition(
            review,
            EffectStatus.PREPARED,
            event_type="resolved_not_committed",
            actor=actor,
            now=now,
            metadata={"reason": why, "evidence_digest": evidence_digest},
            changes={**_SETTLED, "next_action_at": now},
        )
        # Deferred in the same transaction (STYLE rule 5): requeued iff committed.
        rt.scheduler.dispatch(record.effect_id)
    _log("resolve_not_committed", record, requeued, actor, evidence_digest)
    return requeued


def resolve_failed(
    tenant: Tenant,
    effect_id: str,
    *,
    operator: str,
    reason: str,
    evidence: Mapping[str, object] | None = None,
    runtime: Runtime | None = None,
) -> EffectRecord:
    """Mark final failure: FAILED_FINAL, no receipt, never dispatched again.

    Evidence is optional here (giving up needs no proof); when given, its digest is
    recorded like the others'.
    """
    rt = runtime or get_runtime()
    actor, why = _operator(operator), _reason(reason)
    metadata: dict[str, object] = {"reason": why}
    if evidence:
        metadata["evidence_digest"] = _evidence(evidence, what="evidence")[1]
    record = _resolvable(tenant, effect_id, EffectStatus.FAILED_FINAL)
    now = rt.clock.now()
    with transaction.atomic():
        review = _to_review(record, Resolution.FAILED, actor=actor, now=now)
        failed = store.transition(
            review,
            EffectStatus.FAILED_FINAL,
            event_type="resolved_failed",
            actor=actor,
            now=now,
            metadata=metadata,
            changes=_SETTLED,
        )
    _log(
        "resolve_failed", record, failed, actor, str(metadata.get("evidence_digest", ""))
    )
    return failed


def request_reconciliation(
    tenant: Tenant,
    effect_id: str,
    *,
    requested_by: str = "",
    runtime: Runtime | None = None,
) -> ReconcileRequest:
    """Defer a reconcile job for an unknown outcome; never forces an unsafe retry.

    Writes no event: the job records ``reconcile_started`` when it claims the effect,
    and decides itself whether the probe is due yet (settlement deadline).
    """
    rt = runtime or get_runtime()
    record = inspection.get_effect(tenant, effect_id)
    if record.status is not EffectStatus.OUTCOME_UNKNOWN:
        return ReconcileRequest(effect=record, deferred=False)
    if record.safety is SafetyClass.UNSAFE:
        raise IllegalTransitionError(
            f"effect {record.effect_id} is unsafe and its outcome is unknown: no probe "
            "can settle it and it is never resent automatically (spec rule 6); an "
            "operator must resolve it with proof of success, proof of non-commit, or "
            "as failed",
            refusal="operator_required",
            effect_id=record.effect_id,
            old=record.status.value,
            new=EffectStatus.RECONCILING.value,
        )
    with transaction.atomic():
        rt.scheduler.reconcile(record.effect_id)
    logger.info(
        "reconciliation requested",
        extra={
            "action": "request_reconciliation",
            "effect_id": record.effect_id,
            "requested_by": requested_by,
        },
    )
    return ReconcileRequest(effect=record, deferred=True)


# --- internals --------------------------------------------------------------------


def _resolvable(tenant: Tenant, effect_id: str, target: EffectStatus) -> EffectRecord:
    record = inspection.get_effect(tenant, effect_id)
    if record.status in RESOLVABLE:
        return record
    details = {
        "effect_id": record.effect_id,
        "old": record.status.value,
        "new": target.value,
    }
    if is_terminal(record.status):
        raise IllegalTransitionError(
            f"effect {record.effect_id} is already settled as {record.status.value}; a "
            "settled effect is never resolved again (spec rule 7)",
            refusal="already_settled",
            **details,
        )
    raise IllegalTransitionError(
        f"effect {record.effect_id} is {record.status.value}; operator resolution "
        "applies only to outcome_unknown or manual_review effects",
        refusal="not_resolvable",
        **details,
    )


def _to_review(
    record: EffectRecord, resolution: Resolution, *, actor: str, now: datetime
) -> EffectRecord:
    """OUTCOME_UNKNOWN has no edge to a settled state: an operator passes via review."""
    if record.status is EffectStatus.MANUAL_REVIEW:
        return record
    return store.transition(
        record,
        EffectStatus.MANUAL_REVIEW,
        event_type="operator_review_started",
        actor=actor,
        now=now,
        metadata={"resolution": resolution.value},
        changes=_SETTLED,
    )


def _preview_fields(rt: Runtime, record: EffectRecord) -> tuple[str, ...]:
    # An operator must still be able to settle an effect whose contract version was
    # since removed from the file: fall back to the fields every receipt may show.
    try:
        fields = rt.registry.get(record.contract_name, record.contract_version)
    except UnknownContractError:
        return ("id", "status")
    return (*fields.preview_fields, "id", "status")


def _text(value: object, *, name: str, limit: int) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        raise InvalidRequestError(f"{name} is required")
    if len(text) > limit:
        raise InvalidRequestError(f"{name} must be at most {limit} characters")
    return text


def _operator(value: str) -> str:
    return _text(value, name="operator (who resolves this)", limit=MAX_OPERATOR_CHARS)


def _reason(value: str) -> str:
    return _text(value, name="reason", limit=MAX_REASON_CHARS)


def _external_id(value: str | None) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return _text(value, name="external_id", limit=MAX_EXTERNAL_ID_CHARS)


def _evidence(evidence: Mapping[str, object], *, what: str) -> tuple[dict[str, Any], str]:
    """Validate the evidence document; return it and its digest (never logged raw)."""
    if not isinstance(evidence, Mapping):
        raise InvalidRequestError("evidence must be a JSON object")
    document = dict(evidence)
    if not document:
        raise InvalidRequestError(
            f"{what} is required: attach evidence as a non-empty JSON object (e.g. the "
            "target's record of the request, or the ticket that confirms it)"
        )
    canonical = canonical_json(document)  # refuses NaN, big numbers, non-JSON values
    if len(canonical) > MAX_EVIDENCE_BYTES:
        raise InvalidRequestError(f"evidence exceeds {MAX_EVIDENCE_BYTES} bytes")
    return document, digest_hex(canonical)


def _log(
    action: str,
    before: EffectRecord,
    after: EffectRecord,
    operator: str,
    evidence_digest: str = "",
) -> None:
    # Structured, and only the digest of the evidence (STYLE rule 8).
    logger.info(
        "operator resolution",
        extra={
            "action": action,
            "effect_id": after.effect_id,
            "operator": operator,
            "old_status": before.status.value,
            "new_status": after.status.value,
            "evidence_digest": evidence_digest,
        },
    )
