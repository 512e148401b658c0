"""The public effects surface: a tenant's API key, and only that tenant's effects.

The tenant comes from the key (``Authorization: Bearer eb_...``), never from a request
field. Operator resolution and forks are not here: they live on the operator router,
behind an operator token (``effect_broker.api.operators``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django.http import HttpRequest, HttpResponse
from ninja import Field, Query, Router, Schema, Status
from ninja.security import HttpBearer
from pydantic import ConfigDict

from effect_broker.api.idempotency_key import (
    IDEMPOTENCY_KEY_PARAMETER,
    REPLAYED_HEADER,
    SUBMIT_RESPONSE_HEADERS,
    operation_key,
    with_policy_link,
)
from effect_broker.api.problems import domain_error
from effect_broker.api.rate_limit import charge_submit
from effect_broker.api.schemas import EffectOut, effect_out, with_problems
from effect_broker.domain.errors import PayloadConflictError
from effect_broker.domain.keys import MAX_OPERATION_KEY_LENGTH
from effect_broker.domain.records import (
    MAX_REQUESTED_BY_LENGTH,
    MAX_TOOL_LENGTH,
    MAX_TRACE_ID_LENGTH,
    EffectRequest,
)
from effect_broker.domain.states import EffectStatus
from effect_broker.models import Tenant
from effect_broker.services import inspection, pauses, resolution
from effect_broker.services.inspection import MAX_PAGE
from effect_broker.services.submission import submit
from effect_broker.services.tenants import authenticate


class ApiKeyAuth(HttpBearer):
    """``Authorization: Bearer eb_...``: the tenant comes from the key, nowhere else."""

    def authenticate(self, request: HttpRequest, token: str) -> Tenant:
        return authenticate(token)


class SubmitKeyAuth(ApiKeyAuth):
    """The tenant key, then the tenant's submit rate limit: charged here, before the
    body is parsed, so a refused submit costs what a refused key does."""

    def authenticate(self, request: HttpRequest, token: str) -> Tenant:
        tenant = authenticate(token)
        charge_submit(str(tenant.pk), _declared_length(request))
        return tenant


def _declared_length(request: HttpRequest) -> int:
    # The body-size middleware has already refused a length over the limit, and a
    # chunked body past it; a missing or odd header counts as an empty body.
    raw = request.META.get("CONTENT_LENGTH") or "0"
    return int(raw) if raw.isdigit() else 0


router = Router(auth=ApiKeyAuth(), tags=["effects"])


def _tenant(request: HttpRequest) -> Tenant:
    """The tenant ``ApiKeyAuth`` authenticated for this request."""
    # ninja sets ``request.auth`` at runtime; HttpRequest's stubs don't declare it.
    return cast(Tenant, request.auth)  # type: ignore[attr-defined]


class SubmitIn(Schema):
    """POST /v1/effects body. Unknown fields are refused (422 ``unknown_field``): the
    tenant comes from the key, so a ``tenant_id`` here is a caller's mistake."""

    model_config = ConfigDict(extra="forbid")

    operation_key: str = Field(
        min_length=1,
        max_length=MAX_OPERATION_KEY_LENGTH,
        description="The business operation's identity, the same on every retry: "
        "printable characters only (no control or format characters), with no "
        "leading or trailing whitespace; else 400 invalid_request.",
    )
    tool: str = Field(min_length=1, max_length=MAX_TOOL_LENGTH)
    arguments: dict[str, Any]
    trace_id: str | None = Field(default=None, max_length=MAX_TRACE_ID_LENGTH)
    requested_by: str = Field(default="", max_length=MAX_REQUESTED_BY_LENGTH)


class SubmitOneIn(SubmitIn):
    """POST /v1/effects body: ``operation_key`` may instead come in the
    ``Idempotency-Key`` header (issue 21); one of the two is required."""

    operation_key: str | None = Field(  # type: ignore[assignment]
        default=None,
        min_length=1,
        max_length=MAX_OPERATION_KEY_LENGTH,
        description="The business operation's identity, the same on every retry; or "
        "send it in the Idempotency-Key header (then drift is 422, not 409). "
        "Printable characters only, no leading or trailing whitespace; neither, or "
        "a header and a body that disagree: 400 invalid_request.",
    )


class ListFilters(Schema):
    """GET /v1/effects filters."""

    status: EffectStatus | None = None
    tool: str | None = None
    operation_prefix: str | None = None
    #: A page is bounded (issue 12): at most MAX_PAGE effects, each with a preview
    #: bounded by its contract; a larger limit is a 422, not a silent clamp.
    limit: int = Field(50, ge=1, le=MAX_PAGE)


class ReconcileOut(EffectOut):
    """The effect, and whether a reconcile job was deferred for it."""

    reconcile_requested: bool


class EventOut(Schema):
    """One stored transition event."""

    sequence: int
    event_type: str
    old_status: str | None
    new_status: str
    version: int
    actor: str
    occurred_at: datetime
    metadata: dict[str, Any]
    digest: str


class HistoryOut(Schema):
    """The effect folded from its verified event chain up to ``at_sequence``."""

    effect_id: str
    at_sequence: int
    latest_sequence: int
    status: str
    version: int
    chain_verified: bool
    events: list[EventOut]


class ReceiptOut(Schema):
    """An immutable terminal receipt, result included (the caller's own data)."""

    receipt_id: str
    effect_id: str
    external_id: str | None
    result: dict[str, Any]
    result_preview: dict[str, Any]
    evidence_digest: str
    target_timestamp: datetime | None
    contract_version: str
    downstream_key_digest: str
    created_at: datetime


@router.post(
    "/v1/effects",
    response=with_problems({200: EffectOut, 202: EffectOut}, 403, 409, 415, 429),
    summary="Reserve an effect (202 new, 200 replay, 409 payload drift; 422 when the "
    "key came in Idempotency-Key)",
    auth=SubmitKeyAuth(),
    openapi_extra={
        "parameters": [IDEMPOTENCY_KEY_PARAMETER],
        "responses": SUBMIT_RESPONSE_HEADERS,
    },
)
def submit_effect(request: HttpRequest, body: SubmitOneIn, response: HttpResponse) -> Any:
    key = operation_key(request, body.operation_key)
    try:
        reservation = submit(
            _tenant(request),
            EffectRequest(
                operation_key=key.value,
                tool=body.tool,
                arguments=body.arguments,
                requested_by=body.requested_by,
                trace_id=body.trace_id,
            ),
        )
    except PayloadConflictError as exc:
        if not key.from_header:
            raise  # the product spec's 409, for a key sent in the body
        # The draft: "reuse of an idempotency key with a different request payload"
        # is 422. Same code, same members; only the status follows how it was sent.
        return with_policy_link(domain_error(request, exc, status=422))
    with_policy_link(response)
    if reservation.replayed:
        # Every replay says so, whichever way the key came (the draft's header).
        response[REPLAYED_HEADER] = "true"
    return Status(
        202 if reservation.created else 200,
        # No pause lookup here: a replay stays one read and a new key one read and
        # one reservation (issues 13, 25); the effect's reads say whether a pause
        # holds it.
        effect_out(
            reservation.effect, created=reservation.created, replayed=reservation.replayed
        ),
    )


@router.get("/v1/effects/{effect_id}", response=with_problems({200: EffectOut}, 404))
def get_effect(request: HttpRequest, effect_id: str) -> dict[str, Any]:
    record = inspection.get_effect(_tenant(request), effect_id)
    return effect_out(
        record, links=inspection.fork_links(record), pause=pauses.pause_holding(record)
    )


@router.get("/v1/effects", response=with_problems({200: list[EffectOut]}))
def list_effects(
    request: HttpRequest, filters: Query[ListFilters]
) -> list[dict[str, Any]]:
    records = inspection.list_effects(
        _tenant(request),
        status=filters.status,
        tool=filters.tool,
        operation_prefix=filters.operation_prefix,
        limit=filters.limit,
    )
    active = pauses.active_pauses()  # one read for the page
    return [effect_out(r, pause=pauses.pause_holding(r, active)) for r in records]


@router.get(
    "/v1/effects/{effect_id}/history",
    response=with_problems({200: HistoryOut}, 404),
    summary="Fold the verified event chain; inspect state at an optional event sequence",
)
def effect_history(
    request: HttpRequest,
    effect_id: str,
    # Sequences start at 1; one past this effect's last event is a 400 that names it.
    at_sequence: int | None = Query(None, ge=1),
) -> dict[str, Any]:
    folded = inspection.history(_tenant(request), effect_id, at_sequence)
    return {
        "effect_id": folded.effect_id,
        "at_sequence": folded.at_sequence,
        "latest_sequence": folded.latest_sequence,
        "status": folded.status.value,
        "version": folded.version,
        # history() raises event_chain_broken rather than return an unverified chain.
        "chain_verified": True,
        "events": [
            {
                "sequence": e.facts.sequence,
                "event_type": e.facts.event_type,
                "old_status": e.facts.old_status,
                "new_status": e.facts.new_status,
                "version": e.facts.version,
                "actor": e.facts.actor,
                "occurred_at": e.facts.occurred_at,
                "metadata": dict(e.facts.metadata),
                "digest": e.digest.hex(),
            }
            for e in folded.events
        ],
    }


@router.get(
    "/v1/effects/{effect_id}/receipt",
    response=with_problems({200: ReceiptOut}, 404),
    summary="Return the immutable terminal receipt (404 while there is none)",
)
def effect_receipt(request: HttpRequest, effect_id: str) -> dict[str, Any]:
    receipt = inspection.get_receipt(_tenant(request), effect_id)
    return {
        "receipt_id": receipt.receipt_id,
        "effect_id": receipt.effect_id,
        "external_id": receipt.external_id,
        "result": dict(receipt.result),
        "result_preview": dict(receipt.result_preview),
        "evidence_digest": receipt.evidence_digest,
        "target_timestamp": receipt.target_timestamp,
        "contract_version": receipt.contract_version,
        "downstream_key_digest": receipt.downstream_key_digest,
        "created_at": receipt.created_at,
    }


@router.post(
    "/v1/effects/{effect_id}/reconcile",
    response=with_problems({200: ReconcileOut, 202: ReconcileOut}, 404, 409),
    summary="Request reconciliation (202 deferred, 200 nothing to do); never forces an "
    "unsafe retry (409)",
)
def reconcile_effect(request: HttpRequest, effect_id: str) -> Status[dict[str, Any]]:
    asked = resolution.request_reconciliation(
        _tenant(request), effect_id, requested_by="api"
    )
    return Status(
        202 if asked.deferred else 200,
        {**effect_out(asked.effect), "reconcile_requested": asked.deferred},
    )
