"""The operator surface: resolution, forks and approvals, behind an operator token.

Issue 9, defect 5: these routes took the tenant's submit key and an operator name from
the body, so an agent could resolve (and requeue) its own effects. Now they take only
``Authorization: Bearer ebop_...`` - a token owned by a staff user holding
``effect_broker.resolve_effect``, re-checked on every call - and the operator in the
events is that user. A tenant API key here is a 401; a body naming an ``operator`` is
a 422 (identity is never a body field). Operators act across tenants: the tenant of
an effect is looked up from its id.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status
from ninja.security import HttpBearer
from pydantic import ConfigDict

from effect_broker.api.schemas import EffectOut, effect_out, with_problems
from effect_broker.domain.keys import MAX_OPERATION_KEY_LENGTH
from effect_broker.services import (
    approvals,
    forking,
    inspection,
    operators,
    resolution,
)
from effect_broker.services.operator_steps import MAX_REASON_CHARS
from effect_broker.services.resolution import Resolution


class OperatorTokenAuth(HttpBearer):
    """``Authorization: Bearer ebop_...``: the operator is the token's staff user."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return operators.authenticate_token(token)


router = Router(auth=OperatorTokenAuth(), tags=["operator"])


#: Text with at least one non-blank character: the services strip and require it.
REQUIRED_TEXT = r"\S"


class ResolveIn(Schema):
    """POST /v1/effects/{id}/resolve body: one of the operator's three choices.

    Evidence shapes (``effect_broker.domain.evidence``): succeeded needs ``source``
    and ``reference``; not_committed needs ``source`` and ``checked_at``; failed
    needs none, but evidence given must have a ``source``.
    """

    model_config = ConfigDict(extra="forbid")

    resolution: Resolution
    reason: str = Field(pattern=REQUIRED_TEXT, max_length=MAX_REASON_CHARS)
    evidence: dict[str, Any] = Field(default_factory=dict)
    external_id: str | None = None


class ForkIn(Schema):
    """POST /v1/effects/{id}/fork body: the new operation key and the attestation
    that the old effect never committed (evidence: ``source`` and ``checked_at``)."""

    model_config = ConfigDict(extra="forbid")

    new_operation_key: str = Field(min_length=1, max_length=MAX_OPERATION_KEY_LENGTH)
    reason: str = Field(pattern=REQUIRED_TEXT, max_length=MAX_REASON_CHARS)
    evidence: dict[str, Any] = Field(default_factory=dict)


class DecisionIn(Schema):
    """POST /v1/effects/{id}/approve and /deny body: why (recorded in the event, with
    the operator: the token's user)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(pattern=REQUIRED_TEXT, max_length=MAX_REASON_CHARS)


class ForkOut(Schema):
    """The settled old effect and the new effect that continues its business."""

    old: EffectOut
    new: EffectOut


@router.post(
    "/v1/effects/{effect_id}/resolve",
    response=with_problems({200: EffectOut}, 403, 404, 409, 415),
    summary="Operator resolution: proof of success, proof of non-commit (requeue where "
    "the contract and safety class permit), or final failure",
)
def resolve_effect(
    request: HttpRequest, effect_id: str, body: ResolveIn
) -> dict[str, Any]:
    record = resolution.resolve(
        inspection.tenant_of(effect_id),
        effect_id,
        body.resolution,
        operator=request.auth,  # type: ignore[attr-defined]
        reason=body.reason,
        evidence=body.evidence,
        external_id=body.external_id,
    )
    return effect_out(record, links=inspection.fork_links(record))


@router.post(
    "/v1/effects/{effect_id}/fork",
    response=with_problems({201: ForkOut}, 403, 404, 409, 415),
    summary="Fork an unresolved effect into a new effect under a new operation key "
    "(the old one is settled failed_final, event resolved_forked)",
)
def fork_effect(
    request: HttpRequest, effect_id: str, body: ForkIn
) -> Status[dict[str, Any]]:
    forked = forking.fork(
        inspection.tenant_of(effect_id),
        effect_id,
        operator=request.auth,  # type: ignore[attr-defined]
        new_operation_key=body.new_operation_key,
        reason=body.reason,
        evidence=body.evidence,
    )
    return Status(
        201,
        {
            "old": effect_out(forked.old, links=inspection.fork_links(forked.old)),
            "new": effect_out(forked.new, links=inspection.fork_links(forked.new)),
        },
    )


@router.post(
    "/v1/effects/{effect_id}/approve",
    response=with_problems({200: EffectOut}, 403, 404, 409, 415),
    summary="Approve an effect awaiting approval: it is dispatched once, bound to its "
    "payload and pinned contract (409 already_approved, approval_expired, "
    "approval_not_pending)",
)
def approve_effect(
    request: HttpRequest, effect_id: str, body: DecisionIn
) -> dict[str, Any]:
    record = approvals.approve(
        inspection.tenant_of(effect_id),
        effect_id,
        operator=request.auth,  # type: ignore[attr-defined]
        reason=body.reason,
    )
    return effect_out(record)


@router.post(
    "/v1/effects/{effect_id}/deny",
    response=with_problems({200: EffectOut}, 403, 404, 409, 415),
    summary="Deny an effect awaiting approval: failed_final, never sent (409 "
    "already_approved, approval_expired, approval_not_pending)",
)
def deny_effect(request: HttpRequest, effect_id: str, body: DecisionIn) -> dict[str, Any]:
    record = approvals.deny(
        inspection.tenant_of(effect_id),
        effect_id,
        operator=request.auth,  # type: ignore[attr-defined]
        reason=body.reason,
    )
    return effect_out(record)
