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

When ``not_committed`` may requeue (compared on the database clock, like the deadlines):

- unsafe: never under the same key; the way on is a fork (a new operation key);
- reconcilable: only from its settlement deadline on (before it, the target may still
  settle the request, so "not there" is not conclusive);
- idempotent: only while the target still holds the key (retention deadline minus the
  margin); past it a resend is not deduplicated, so resolve or fork instead;
- transactional: the broker's own table is the truth; allowed.

A fork (spec "Replay and time-travel semantics") settles the old effect and reserves a
new one under a NEW operation key in one transaction. The old effect ends FAILED_FINAL
with the event ``resolved_forked``: the operator attests, with evidence, that it never
committed, and the event names the fork; the link is also a row (``effect_forks``) so
either effect finds the other.

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
    PayloadConflictError,
    UnknownContractError,
)
from effect_broker.domain.evidence import check_evidence
from effect_broker.domain.ids import new_row_id
from effect_broker.domain.keys import digest_hex, validate_operation_key
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass, is_terminal
from effect_broker.models import Tenant
from effect_broker.services import inspection
from effect_broker.services.operators import operator_name
from effect_broker.services.payloads import load_arguments, seal_result
from effect_broker.services.runtime import Runtime, get_runtime
from effect_broker.services.submission import submit

logger = logging.getLogger(__name__)

RESOLVABLE: frozenset[EffectStatus] = frozenset(
    {EffectStatus.OUTCOME_UNKNOWN, EffectStatus.MANUAL_REVIEW}
)
"""Statuses an operator may resolve; everything else is refused."""

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
class Fork:
    """A fork: the old effect as settled (FAILED_FINAL, ``resolved_forked``) and the
    new effect reserved under the new operation key (PREPARED, dispatch queued)."""

    old: EffectRecord
    new: EffectRecord


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
    actor, why = operator_name(operator), _reason(reason)
    proof, evidence_digest = _evidence(evidence, kind="succeeded")
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
    actor, why = operator_name(operator), _reason(reason)
    _, evidence_digest = _evidence(evidence, kind="not_committed")
    record = _resolvable(tenant, effect_id, EffectStatus.PREPARED)
    _refuse_requeue(rt, record)
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
    actor, why = operator_name(operator), _reason(reason)
    metadata: dict[str, object] = {"reason": why}
    if evidence:
        metadata["evidence_digest"] = _evidence(evidence, kind="failed")[1]
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


def fork(
    tenant: Tenant,
    effect_id: str,
    *,
    operator: Any,
    new_operation_key: str,
    reason: str,
    evidence: Mapping[str, object] | None,
    runtime: Runtime | None = None,
) -> Fork:
    """Continue an unresolved effect's business as a NEW effect under a new key.

    Spec "Replay and time-travel semantics": turning a fork into live work creates a
    new business operation, requires a new operation key and is an explicit operator
    action. In ONE transaction: the new effect is reserved through ``submit`` (same
    tenant, tool and arguments, pinned to the tool's currently active contract, a new
    downstream key) with its dispatch job, and the old effect is settled FAILED_FINAL
    by ``resolved_forked`` - the operator's attestation of non-commit (``reason`` and
    evidence digest, as for ``not_committed``) naming the fork - plus the link row.

    Refused, writing nothing: the same key as the old effect, a key already in use, a
    settled or unresolvable effect, and a reconcilable effect before its settlement
    deadline (the old request may still settle: the fork would be its duplicate).
    """
    rt = runtime or get_runtime()
    actor, why = operator_name(operator), _reason(reason)
    _, evidence_digest = _evidence(evidence, kind="fork")
    new_key = validate_operation_key(new_operation_key)
    record = _resolvable(tenant, effect_id, EffectStatus.FAILED_FINAL)
    if new_key == record.operation_key:
        raise InvalidRequestError(
            f"a fork needs a NEW operation key; {new_key!r} is effect "
            f"{record.effect_id}'s own (spec: a fork never inherits a live effect's key)",
            refusal="same_operation_key",
            field="new_operation_key",
        )
    if record.safety is SafetyClass.RECONCILABLE:
        _refuse_before_settlement(record, action="a fork")
    arguments = load_arguments(rt, record)
    now = rt.clock.now()
    with transaction.atomic():
        try:
            reservation = submit(
                tenant,
                EffectRequest(
                    operation_key=new_key,
                    tool=record.tool,
                    arguments=arguments,
                    requested_by=actor,
                    trace_id=record.trace_id,
                ),
                runtime=rt,
            )
        except PayloadConflictError as exc:
            raise _key_taken(record, new_key, str(exc.details["effect_id"])) from exc
        if not reservation.created:
            # Raising rolls back everything above: the old effect stays unresolved.
            raise _key_taken(record, new_key, reservation.effect.effect_id)
        new = reservation.effect
        review = _to_review(record, "fork", actor=actor, now=now)
        old = store.transition(
            review,
            EffectStatus.FAILED_FINAL,
            event_type="resolved_forked",
            actor=actor,
            now=now,
            metadata={
                "reason": why,
                "evidence_digest": evidence_digest,
                "attested": Resolution.NOT_COMMITTED.value,
                "forked_to": new.effect_id,
                "fork_operation_key": new_key,
            },
            changes=_SETTLED,
            riders=(
                store.fork_link(
                    review, new_effect_id=new.effect_id, operator=actor, now=now
                ),
            ),
        )
    _log("fork", record, old, actor, evidence_digest)
    logger.info(
        "effect forked",
        extra={"action": "fork", "effect_id": old.effect_id, "fork_id": new.effect_id},
    )
    return Fork(old=old, new=new)


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
    record: EffectRecord, resolution: Resolution | str, *, actor: str, now: datetime
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
        metadata={"resolution": str(resolution)},
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


def _reason(value: str) -> str:
    return _text(value, name="reason", limit=MAX_REASON_CHARS)


def _external_id(value: str | None) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return _text(value, name="external_id", limit=MAX_EXTERNAL_ID_CHARS)


def _evidence(
    evidence: Mapping[str, object] | None, *, kind: str
) -> tuple[dict[str, Any], str]:
    """Check the evidence's shape (``domain.evidence``); return it and its digest
    (the digest goes in the event and the log, the document never does)."""
    document = check_evidence(kind, evidence)
    canonical = canonical_json(document)  # refuses NaN, big numbers, non-JSON values
    if len(canonical) > MAX_EVIDENCE_BYTES:
        raise InvalidRequestError(f"evidence exceeds {MAX_EVIDENCE_BYTES} bytes")
    return document, digest_hex(canonical)


def _key_taken(record: EffectRecord, key: str, holder: str) -> IllegalTransitionError:
    return IllegalTransitionError(
        f"operation key {key!r} is already effect {holder}; a fork needs an unused key",
        refusal="operation_key_taken",
        effect_id=record.effect_id,
        old=record.status.value,
        new=EffectStatus.FAILED_FINAL.value,
    )


def _refuse_requeue(rt: Runtime, record: EffectRecord) -> None:
    """Refuse a same-key resend the safety class does not allow (module docstring)."""
    details = {
        "effect_id": record.effect_id,
        "old": record.status.value,
        "new": EffectStatus.PREPARED.value,
        "safety_class": record.safety.value,
    }
    if record.safety is SafetyClass.UNSAFE:
        raise IllegalTransitionError(
            f"effect {record.effect_id} is unsafe: it is never resent under the same "
            "operation key, whatever the evidence (spec rule 6; the target cannot "
            "deduplicate a resend). If you have proof it never committed, fork it: a "
            "new effect under a new operation key (effect-broker effects fork ID "
            "--new-operation-key KEY ...; POST /v1/effects/{id}/fork); otherwise "
            "resolve it as succeeded or failed",
            refusal="unsafe_never_requeued",
            **details,
        )
    if record.safety is SafetyClass.RECONCILABLE:
        _refuse_before_settlement(record, action="a not_committed requeue")
    elif record.safety is SafetyClass.IDEMPOTENT and record.retention_deadline:
        horizon = record.retention_deadline - rt.timing.retention_margin
        if store.database_now() >= horizon:
            raise IllegalTransitionError(
                f"effect {record.effect_id} is idempotent but the target's retention "
                f"of its key ends at {record.retention_deadline.isoformat()} (resends "
                f"stop {rt.timing.retention_margin} before, at {horizon.isoformat()}, "
                "database clock): a resend now would not be deduplicated. Resolve it as "
                "succeeded or failed with evidence, or fork it under a new operation key",
                refusal="key_retention_expired",
                retention_deadline=record.retention_deadline.isoformat(),
                **details,
            )


def _refuse_before_settlement(record: EffectRecord, *, action: str) -> None:
    """A reconcilable target may still settle the request until its deadline."""
    deadline = record.settlement_deadline
    if deadline is not None and store.database_now() >= deadline:
        return
    when = (
        f"from {deadline.isoformat()} (database clock)"
        if deadline is not None
        else "once a dispatch has set its settlement deadline"
    )
    raise IllegalTransitionError(
        f"effect {record.effect_id} is reconcilable and its settlement bound has not "
        f"passed: the target may still settle the request, so 'not committed' is not "
        f"conclusive yet. {action[0].upper() + action[1:]} becomes possible {when}; "
        "until then request reconciliation",
        refusal="before_settlement_bound",
        effect_id=record.effect_id,
        old=record.status.value,
        safety_class=record.safety.value,
        settlement_deadline=deadline.isoformat() if deadline else "",
    )


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
