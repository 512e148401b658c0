"""The steps every operator settlement shares: which effects may be settled, the pass
through MANUAL_REVIEW, the reason and evidence checks, the structured log, and the rules
for when a proof of non-commit may resend under the same key.

Used by ``services.resolution`` (the three choices) and ``services.forking`` (forks);
the surfaces never call these directly.

When ``not_committed`` may requeue (compared on the DATABASE clock, on which the
deadlines are written; issue 9, defect 5):

- unsafe: never under the same key; the way on is a fork (a new operation key);
- reconcilable: only from its settlement deadline on (before it, the target may still
  settle the request, so "not there" is not conclusive);
- idempotent: only while the target still holds the key (retention deadline minus the
  margin); past it a resend is not deduplicated, so resolve or fork instead;
- transactional: the broker's own table is the truth; allowed.

Each refusal is an ``IllegalTransitionError`` with a stable ``refusal`` and writes
nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from effect_broker import store
from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.errors import IllegalTransitionError, InvalidRequestError
from effect_broker.domain.evidence import check_evidence
from effect_broker.domain.keys import digest_hex
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass, is_terminal
from effect_broker.models import Tenant
from effect_broker.services import inspection
from effect_broker.services.runtime import Runtime

logger = logging.getLogger(__name__)

RESOLVABLE: frozenset[EffectStatus] = frozenset(
    {EffectStatus.OUTCOME_UNKNOWN, EffectStatus.MANUAL_REVIEW}
)
"""Statuses an operator may resolve or fork; everything else is refused."""

MAX_REASON_CHARS = 2000
MAX_EVIDENCE_BYTES = 64 * 1024

SETTLED: dict[str, object] = {
    "lease_owner": None,
    "lease_expires_at": None,
    "next_action_at": None,
}
"""The changes that clear an effect's lease and next action when an operator acts."""


def resolvable_effect(
    tenant: Tenant, effect_id: str, target: EffectStatus
) -> EffectRecord:
    """The effect if an operator may settle it now; refused (stable ``refusal``)
    when it is already settled or not awaiting an operator."""
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
            "settled effect is never resolved again: its receipt and events are final",
            refusal="already_settled",
            **details,
        )
    raise IllegalTransitionError(
        f"effect {record.effect_id} is {record.status.value}; operator resolution "
        "applies only to outcome_unknown or manual_review effects",
        refusal="not_resolvable",
        **details,
    )


def to_review(
    record: EffectRecord, resolution: str, *, actor: str, now: datetime
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
        changes=SETTLED,
    )


def text_field(value: object, *, name: str, limit: int) -> str:
    """A required, stripped, bounded text field, or ``InvalidRequestError``."""
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        raise InvalidRequestError(f"{name} is required")
    if len(text) > limit:
        raise InvalidRequestError(f"{name} must be at most {limit} characters")
    return text


def reason_text(value: str) -> str:
    """The operator's reason: required, at most ``MAX_REASON_CHARS``."""
    return text_field(value, name="reason", limit=MAX_REASON_CHARS)


def checked_evidence(
    evidence: Mapping[str, object] | None, *, kind: str
) -> tuple[dict[str, Any], str]:
    """Check the evidence's shape (``domain.evidence``); return it and its digest
    (the digest goes in the event and the log, the document never does)."""
    document = check_evidence(kind, evidence)
    canonical = canonical_json(document)  # refuses NaN, big numbers, non-JSON values
    if len(canonical) > MAX_EVIDENCE_BYTES:
        raise InvalidRequestError(f"evidence exceeds {MAX_EVIDENCE_BYTES} bytes")
    return document, digest_hex(canonical)


def refuse_requeue(rt: Runtime, record: EffectRecord) -> None:
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
            "operation key, whatever the evidence (the target cannot deduplicate a "
            "resend: docs/explanation/guarantees.md). If you have proof it never "
            "committed, fork it: a new effect under a new operation key "
            "(effect-broker effects fork ID "
            "--new-operation-key KEY ...; POST /v1/effects/{id}/fork); otherwise "
            "resolve it as succeeded or failed",
            refusal="unsafe_never_requeued",
            **details,
        )
    if record.safety is SafetyClass.RECONCILABLE:
        refuse_before_settlement(rt, record, action="a not_committed requeue")
    elif record.safety is SafetyClass.IDEMPOTENT and record.retention_deadline:
        horizon = record.retention_deadline - rt.timing.retention_margin
        if store.database_now(rt.clock.database_offset()) >= horizon:
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


def refuse_before_settlement(rt: Runtime, record: EffectRecord, *, action: str) -> None:
    """A reconcilable target may still settle the request until its deadline."""
    deadline = record.settlement_deadline
    if (
        deadline is not None
        and store.database_now(rt.clock.database_offset()) >= deadline
    ):
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


def log_resolution(
    action: str,
    before: EffectRecord,
    after: EffectRecord,
    operator: str,
    evidence_digest: str = "",
) -> None:
    """Log one operator act: structured, and only the digest of the evidence."""
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
