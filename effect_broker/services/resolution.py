"""Operator resolution of unknown outcomes, and requests to reconcile them.

Spec "HTTP, CLI, and MCP surfaces": operator resolution has three explicit choices -
attach proof of success, attach proof of non-commit and requeue where the contract
permits it, or mark final failure - and there is no "retry anyway" shortcut for unsafe
effects. The read-only side (effect lookup, history, receipts, the operator listing)
is ``services.inspection``.

Who may resolve (issue 9, defect 5): only an operator - an active staff user holding
``effect_broker.resolve_effect`` (``services.operators``). Every entry point takes that
user and re-checks it; the name in the events is the user's, never a request field.
Evidence has a minimal shape per resolution (``domain.evidence``).

When ``not_committed`` may requeue depends on the safety class (an unsafe effect
never; ``services.operator_steps`` has the rules). Forks are ``services.forking``.

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
from enum import StrEnum
from typing import Any

from django.db import transaction

from effect_broker import store
from effect_broker.domain.errors import (
    IllegalTransitionError,
    InvalidRequestError,
    UnknownContractError,
)
from effect_broker.domain.ids import new_row_id
from effect_broker.domain.keys import digest_hex
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import Tenant
from effect_broker.services import inspection
from effect_broker.services.operator_steps import (
    RESOLVABLE,
    SETTLED,
    checked_evidence,
    log_resolution,
    reason_text,
    refuse_requeue,
    resolvable_effect,
    text_field,
    to_review,
)
from effect_broker.services.operators import operator_name
from effect_broker.services.payloads import seal_result
from effect_broker.services.runtime import Runtime, get_runtime
from effect_broker.store import db_time

logger = logging.getLogger(__name__)

__all__ = [
    "RESOLVABLE",
    "ReconcileRequest",
    "Resolution",
    "request_reconciliation",
    "resolve",
    "resolve_failed",
    "resolve_not_committed",
    "resolve_succeeded",
]

MAX_EXTERNAL_ID_CHARS = 500


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
    operator: Any,
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
            evidence=evidence,
            runtime=runtime,
        )
    return resolve_succeeded(
        tenant,
        effect_id,
        operator=operator,
        reason=reason,
        evidence=evidence,
        external_id=external_id,
        runtime=runtime,
    )


def resolve_succeeded(
    tenant: Tenant,
    effect_id: str,
    *,
    operator: Any,
    reason: str,
    evidence: Mapping[str, object] | None,
    external_id: str | None = None,
    runtime: Runtime | None = None,
) -> EffectRecord:
    """Proof of success: SUCCEEDED with a receipt whose encrypted result is the evidence.

    The evidence must name its ``source`` and ``reference`` (``domain.evidence``): a
    success without proof would turn an effect that never happened into a receipt (an
    omission nobody would look for again).
    """
    rt = runtime or get_runtime()
    actor, why = operator_name(operator), reason_text(reason)
    proof, evidence_digest = checked_evidence(evidence, kind="succeeded")
    external = _external_id(external_id)
    record = resolvable_effect(tenant, effect_id, EffectStatus.SUCCEEDED)
    key_id, blob, preview = seal_result(rt, record, proof, _preview_fields(rt, record))
    receipt_id = new_row_id()
    now = rt.clock.now()
    with transaction.atomic():
        review = to_review(record, Resolution.SUCCEEDED, actor=actor, now=now)
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
            changes={**SETTLED, "receipt_id": receipt_id},
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
    log_resolution("resolve_succeeded", record, done, actor, evidence_digest)
    return done


def resolve_not_committed(
    tenant: Tenant,
    effect_id: str,
    *,
    operator: Any,
    reason: str,
    evidence: Mapping[str, object] | None,
    runtime: Runtime | None = None,
) -> EffectRecord:
    """Proof of non-commit: back to PREPARED and a dispatch job, where the contract and
    the effect's safety class permit a resend under the same key.

    The operator attests, with evidence naming its ``source`` and ``checked_at``, that
    the target never applied the request. Whether that attestation may requeue depends
    on the safety class (module docstring; refusals are ``IllegalTransitionError`` with
    a stable ``refusal`` and write nothing): an unsafe effect never resends under its
    key (spec rule 6: no "retry anyway"; fork it), a reconcilable one not before its
    settlement deadline, an idempotent one not once its key retention has lapsed.
    "Where the contract permits it" is also the retry limit: the dispatcher refuses a
    resend past it, so the requeue is refused up front with advice to mark it failed.
    """
    rt = runtime or get_runtime()
    actor, why = operator_name(operator), reason_text(reason)
    _, evidence_digest = checked_evidence(evidence, kind="not_committed")
    record = resolvable_effect(tenant, effect_id, EffectStatus.PREPARED)
    refuse_requeue(rt, record)  # per safety class, on the database clock
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
        review = to_review(record, Resolution.NOT_COMMITTED, actor=actor, now=now)
        requeued = store.transition(
            review,
            EffectStatus.PREPARED,
            event_type="resolved_not_committed",
            actor=actor,
            now=now,
            metadata={"reason": why, "evidence_digest": evidence_digest},
            # The operator attests, with evidence, that nothing committed: the doubt
            # ends here, on the record, under the operator's name.
            changes={
                **SETTLED,
                "next_action_at": db_time.after_now(rt.clock.database_offset()),
                "outcome_in_doubt": False,
            },
        )
        # Deferred in the same transaction (STYLE rule 5): requeued iff committed.
        rt.scheduler.dispatch(record.effect_id)
    log_resolution("resolve_not_committed", record, requeued, actor, evidence_digest)
    return requeued


def resolve_failed(
    tenant: Tenant,
    effect_id: str,
    *,
    operator: Any,
    reason: str,
    evidence: Mapping[str, object] | None = None,
    runtime: Runtime | None = None,
) -> EffectRecord:
    """Mark final failure: FAILED_FINAL, no receipt, never dispatched again.

    Evidence is optional here (giving up needs no proof); when given, it must name its
    ``source`` and its digest is recorded like the others'.
    """
    rt = runtime or get_runtime()
    actor, why = operator_name(operator), reason_text(reason)
    metadata: dict[str, object] = {"reason": why}
    if evidence:
        metadata["evidence_digest"] = checked_evidence(evidence, kind="failed")[1]
    record = resolvable_effect(tenant, effect_id, EffectStatus.FAILED_FINAL)
    now = rt.clock.now()
    with transaction.atomic():
        review = to_review(record, Resolution.FAILED, actor=actor, now=now)
        failed = store.transition(
            review,
            EffectStatus.FAILED_FINAL,
            event_type="resolved_failed",
            actor=actor,
            now=now,
            metadata=metadata,
            changes=SETTLED,
        )
    log_resolution(
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
            "can settle it and it is never resent automatically (the unsafe class's "
            "promise: docs/explanation/guarantees.md); an "
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


def _preview_fields(rt: Runtime, record: EffectRecord) -> tuple[str, ...]:
    # An operator must still be able to settle an effect whose contract version was
    # since removed from the file: fall back to the fields every receipt may show.
    try:
        fields = rt.registry.get(record.contract_name, record.contract_version)
    except UnknownContractError:
        return ("id", "status")
    return (*fields.preview_fields, "id", "status")


def _external_id(value: str | None) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return text_field(value, name="external_id", limit=MAX_EXTERNAL_ID_CHARS)
