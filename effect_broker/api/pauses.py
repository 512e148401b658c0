"""The operator's dispatch pauses over HTTP (issue 24, item 7), behind an operator token.

Same authority as resolution (``effect_broker.api.operators``): ``Authorization:
Bearer ebop_...``, a token owned by a staff user holding ``resolve_effect``; a
tenant's API key is a 401, and the operator recorded is the token's user, never a
body field. Pauses act across tenants; a pause may name one tenant by name.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict

from effect_broker.api.operators import REQUIRED_TEXT, OperatorTokenAuth
from effect_broker.api.schemas import with_problems
from effect_broker.domain.pauses import MAX_PAUSE_REASON, Pause
from effect_broker.services import pauses

router = Router(auth=OperatorTokenAuth(), tags=["operator"])


class PauseIn(Schema):
    """POST /v1/operator/pauses body: a scope (one or more of tool, contract,
    tenant; every one given must match) and the reason callers will read."""

    model_config = ConfigDict(extra="forbid")

    tool: str | None = Field(default=None, min_length=1, max_length=200)
    contract: str | None = Field(
        default=None,
        min_length=1,
        max_length=400,
        description="NAME (every version) or NAME@VERSION",
    )
    tenant: str | None = Field(
        default=None, min_length=1, max_length=200, description="a tenant's name"
    )
    reason: str = Field(pattern=REQUIRED_TEXT, max_length=MAX_PAUSE_REASON)


class ResumeIn(Schema):
    """POST /v1/operator/pauses/{pause_id}/resume body."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=MAX_PAUSE_REASON)


class PauseOut(Schema):
    """One pause: its scope, who paused it, when and why, and whether it still holds."""

    pause_id: str
    tool: str | None
    contract: str | None
    tenant: str | None
    #: The scope in words: "tool charge_card for tenant acme".
    scope: str
    reason: str
    paused_by: str
    paused_at: datetime
    active: bool
    resumed_by: str | None
    resumed_at: datetime | None
    resume_reason: str
    #: Effects in its scope that a pause holds now (waiting to be sent).
    held_effects: int


class ResumeOut(Schema):
    """The resumed pause, and how many held effects' jobs were deferred again."""

    pause: PauseOut
    redeferred: int


class PauseFilters(Schema):
    """GET /v1/operator/pauses filters."""

    include_resumed: bool = False
    limit: int = Field(100, ge=1, le=500)


def pause_out(pause: Pause) -> dict[str, Any]:
    """The operator's wire shape of a pause."""
    return {
        "pause_id": pause.pause_id,
        "tool": pause.scope.tool,
        "contract": pause.scope.contract,
        "tenant": pause.tenant_name,
        "scope": pause.describe(),
        "reason": pause.reason,
        "paused_by": pause.paused_by,
        "paused_at": pause.paused_at,
        "active": pause.active,
        "resumed_by": pause.resumed_by,
        "resumed_at": pause.resumed_at,
        "resume_reason": pause.resume_reason,
        "held_effects": pauses.held_count(pause.pause_id),
    }


@router.post(
    "/v1/operator/pauses",
    response=with_problems({201: PauseOut}, 403, 404, 409, 415),
    summary="Pause dispatch of a tool, a contract or a tenant: effects wait, none "
    "fails; attempts in flight finish (409 already_paused)",
)
def create_pause(request: HttpRequest, body: PauseIn) -> Status[dict[str, Any]]:
    paused = pauses.pause(
        tool=body.tool,
        contract=body.contract,
        tenant=body.tenant,
        reason=body.reason,
        operator=request.auth,  # type: ignore[attr-defined]
    )
    return Status(201, pause_out(paused))


@router.get("/v1/operator/pauses", response=with_problems({200: list[PauseOut]}, 403))
def list_pauses(
    request: HttpRequest, filters: Query[PauseFilters]
) -> list[dict[str, Any]]:
    found = pauses.list_pauses(
        include_resumed=filters.include_resumed, limit=filters.limit
    )
    return [pause_out(p) for p in found]


@router.get(
    "/v1/operator/pauses/{pause_id}", response=with_problems({200: PauseOut}, 403, 404)
)
def get_pause(request: HttpRequest, pause_id: str) -> dict[str, Any]:
    return pause_out(pauses.get_pause(pause_id))


@router.post(
    "/v1/operator/pauses/{pause_id}/resume",
    response=with_problems({200: ResumeOut}, 403, 404, 415),
    summary="Resume a pause: the effects it held are sent (limits permitting); 404 "
    "pause_not_found when it is not active",
)
def resume_pause(request: HttpRequest, pause_id: str, body: ResumeIn) -> dict[str, Any]:
    resumed = pauses.resume(
        pause_id,
        operator=request.auth,  # type: ignore[attr-defined]
        reason=body.reason,
    )
    return {"pause": pause_out(resumed.pause), "redeferred": resumed.redeferred}
