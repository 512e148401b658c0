"""The REST surface (django-ninja): thin glue that parses, calls a service, maps errors.

Every error leaves as ``application/problem+json`` (RFC 9457) with a stable ``code``;
no traceback ever reaches a caller, whatever ``DEBUG`` says.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any, cast

from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse
from ninja import Field, NinjaAPI, Query, Schema, Status
from ninja.errors import AuthenticationError as NinjaAuthenticationError
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer

from effect_broker import store
from effect_broker.domain.canonical import canonical_json, parse_json_strict
from effect_broker.domain.errors import (
    AuthenticationError,
    EffectBrokerError,
    EffectNotFoundError,
    InvalidJsonError,
)
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import Tenant
from effect_broker.services import inspection, resolution
from effect_broker.services.resolution import Resolution
from effect_broker.services.submission import submit
from effect_broker.services.tenants import authenticate

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
MAX_BODY_BYTES = 256 * 1024
_PROBLEM_MEMBERS = frozenset({"type", "title", "status", "code", "detail"})


class StrictJsonParser(Parser):
    """Parse bodies with the domain's strict JSON rules (no duplicate keys, no NaN)."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        if len(request.body) > MAX_BODY_BYTES:
            raise InvalidJsonError(f"request body exceeds {MAX_BODY_BYTES} bytes")
        value = parse_json_strict(request.body)
        if not isinstance(value, dict):
            raise InvalidJsonError("request body must be a JSON object")
        return value


def _tenant(request: HttpRequest) -> Tenant:
    """The tenant ``ApiKeyAuth`` authenticated for this request."""
    # ninja sets ``request.auth`` at runtime; HttpRequest's stubs don't declare it.
    return cast(Tenant, request.auth)  # type: ignore[attr-defined]


class ApiKeyAuth(HttpBearer):
    """``Authorization: Bearer eb_...``: the tenant comes from the key, nowhere else."""

    def authenticate(self, request: HttpRequest, token: str) -> Tenant:
        return authenticate(token)


api = NinjaAPI(
    title="effect-broker",
    version="1",
    description=(
        "Reserve side effects once, dispatch them under one downstream idempotency key, "
        "and report outcome_unknown plainly when the target cannot prove what happened."
    ),
    parser=StrictJsonParser(),
    urls_namespace="effect_broker_api",
)


def problem(status: int, code: str, detail: str, **extra: object) -> HttpResponse:
    """Build an RFC 9457 problem response."""
    body = {
        "type": f"https://effect-broker.invalid/problems/{code}",
        "title": code.replace("_", " "),
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    return HttpResponse(canonical_json(body), status=status, content_type=PROBLEM_JSON)


@api.exception_handler(EffectBrokerError)
def _domain_error(request: HttpRequest, exc: EffectBrokerError) -> HttpResponse:
    # A detail named like a problem member (e.g. "status") must not replace it.
    safe = {
        k: v
        for k, v in exc.details.items()
        if isinstance(v, str | int | bool) and k not in _PROBLEM_MEMBERS
    }
    return problem(exc.http_status, exc.code, str(exc), **safe)


@api.exception_handler(NinjaValidationError)
def _validation_error(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    fields = [".".join(str(p) for p in e.get("loc", ())) for e in exc.errors]
    detail = "; ".join(
        f"{f}: {e.get('msg', 'invalid')}" for f, e in zip(fields, exc.errors, strict=True)
    )
    return problem(422, "invalid_request", detail or "invalid request")


@api.exception_handler(NinjaAuthenticationError)
def _auth_error(request: HttpRequest, exc: NinjaAuthenticationError) -> HttpResponse:
    return problem(401, AuthenticationError.code, "missing or malformed API key")


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja wraps parser failures in HttpError(400) "from" the original error; ours
    # carries the stable code and a precise message, so surface it.
    if isinstance(exc.__cause__, EffectBrokerError):
        return _domain_error(request, exc.__cause__)
    return problem(exc.status_code, "http_error", str(exc))


@api.exception_handler(Exception)
def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    logger.exception("unhandled error", extra={"action": "api", "path": request.path})
    return problem(500, "internal_error", "internal error; see server logs")


class SubmitIn(Schema):
    """POST /v1/effects body."""

    operation_key: str
    tool: str
    arguments: dict[str, Any]
    trace_id: str | None = None
    requested_by: str = ""


class EffectOut(Schema):
    """An effect as callers see it: state, never raw arguments."""

    effect_id: str
    operation_key: str
    tool: str
    contract: str
    safety_class: str
    status: str
    version: int
    attempt_count: int
    arguments_preview: dict[str, Any]
    receipt_id: str | None
    created_at: datetime
    updated_at: datetime
    created: bool | None = None
    replayed: bool | None = None


def _effect_out(record: EffectRecord, **flags: bool) -> dict[str, Any]:
    return {
        "effect_id": record.effect_id,
        "operation_key": record.operation_key,
        "tool": record.tool,
        "contract": f"{record.contract_name}@{record.contract_version}",
        "safety_class": record.safety.value,
        "status": record.status.value,
        "version": record.version,
        "attempt_count": record.attempt_count,
        "arguments_preview": dict(record.arguments_preview),
        "receipt_id": record.receipt_id,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        **flags,
    }


@api.post(
    "/v1/effects",
    auth=ApiKeyAuth(),
    response={200: EffectOut, 202: EffectOut},
    summary="Reserve an effect (202 new, 200 replay, 409 payload drift)",
)
def submit_effect(request: HttpRequest, body: SubmitIn) -> Status[dict[str, Any]]:
    reservation = submit(
        _tenant(request),
        EffectRequest(
            operation_key=body.operation_key,
            tool=body.tool,
            arguments=body.arguments,
            requested_by=body.requested_by,
            trace_id=body.trace_id,
        ),
    )
    status = 202 if reservation.created else 200
    return Status(
        status,
        _effect_out(
            reservation.effect, created=reservation.created, replayed=reservation.replayed
        ),
    )


@api.get("/v1/effects/{effect_id}", auth=ApiKeyAuth(), response=EffectOut)
def get_effect(request: HttpRequest, effect_id: str) -> dict[str, Any]:
    return _effect_out(store.get_effect(str(_tenant(request).id), _uuid(effect_id)))


class ListFilters(Schema):
    """GET /v1/effects filters."""

    status: EffectStatus | None = None
    tool: str | None = None
    operation_prefix: str | None = None
    limit: int = 50


@api.get("/v1/effects", auth=ApiKeyAuth(), response=list[EffectOut])
def list_effects(
    request: HttpRequest, filters: Query[ListFilters]
) -> list[dict[str, Any]]:
    records = store.list_effects(
        str(_tenant(request).id),
        status=filters.status,
        tool=filters.tool,
        operation_prefix=filters.operation_prefix,
        limit=filters.limit,
    )
    return [_effect_out(r) for r in records]


class ResolveIn(Schema):
    """POST /v1/effects/{id}/resolve body: one of the operator's three choices."""

    resolution: Resolution
    reason: str
    evidence: dict[str, Any] = Field(default_factory=dict)
    external_id: str | None = None
    operator: str


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


@api.get(
    "/v1/effects/{effect_id}/history",
    auth=ApiKeyAuth(),
    response=HistoryOut,
    summary="Fold the verified event chain; inspect state at an optional event sequence",
)
def effect_history(
    request: HttpRequest, effect_id: str, at_sequence: int | None = None
) -> dict[str, Any]:
    folded = inspection.history(_tenant(request), _uuid(effect_id), at_sequence)
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


@api.get(
    "/v1/effects/{effect_id}/receipt",
    auth=ApiKeyAuth(),
    response=ReceiptOut,
    summary="Return the immutable terminal receipt (404 while there is none)",
)
def effect_receipt(request: HttpRequest, effect_id: str) -> dict[str, Any]:
    receipt = inspection.get_receipt(_tenant(request), _uuid(effect_id))
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


@api.post(
    "/v1/effects/{effect_id}/reconcile",
    auth=ApiKeyAuth(),
    response={200: ReconcileOut, 202: ReconcileOut},
    summary="Request reconciliation (202 deferred, 200 nothing to do); never forces an "
    "unsafe retry (409)",
)
def reconcile_effect(request: HttpRequest, effect_id: str) -> Status[dict[str, Any]]:
    asked = resolution.request_reconciliation(
        _tenant(request), _uuid(effect_id), requested_by="api"
    )
    return Status(
        202 if asked.deferred else 200,
        {**_effect_out(asked.effect), "reconcile_requested": asked.deferred},
    )


@api.post(
    "/v1/effects/{effect_id}/resolve",
    auth=ApiKeyAuth(),
    response=EffectOut,
    summary="Operator resolution: proof of success, proof of non-commit (requeue where "
    "the contract permits), or final failure",
)
def resolve_effect(
    request: HttpRequest, effect_id: str, body: ResolveIn
) -> dict[str, Any]:
    record = resolution.resolve(
        _tenant(request),
        _uuid(effect_id),
        body.resolution,
        operator=body.operator,
        reason=body.reason,
        evidence=body.evidence,
        external_id=body.external_id,
    )
    return _effect_out(record)


def _uuid(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise EffectNotFoundError(f"no effect {value}") from None


@api.get("/healthz", summary="Liveness")
def healthz(request: HttpRequest) -> dict[str, str]:
    return {"status": "ok"}


@api.get("/readyz", summary="Readiness: Postgres answers and migrations are applied")
def readyz(request: HttpRequest) -> HttpResponse | dict[str, str]:
    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:  # any database failure means not ready
        return problem(503, "not_ready", f"database unavailable: {type(exc).__name__}")
    if pending:
        return problem(503, "not_ready", f"{len(pending)} migrations not applied")
    return {"status": "ready"}
