"""``GET /v1/effects/{effect_id}/wait``: a bounded long-poll on one effect.

Answers the effect (the same body as ``GET /v1/effects/{effect_id}``) as soon as it
reaches a state where the caller's wait ends (``until``: ``domain.waits``), or as it
is once ``timeout`` seconds have passed - whichever comes first; at most
``MAX_WAIT_SECONDS`` a request. A client that waits longer (an operator's decision can
take an hour) loops over polls: the SDK's ``wait`` does, instead of reading every
second.

Tenant-scoped like the read: the tenant comes from the key, another tenant's effect is
a 404. The view is async and waits on the process's one LISTEN connection
(``services.awaiting.ChangeHub``, which the MCP proxy tools use too): while it waits it
holds no database connection and no thread - its key check and each read run in a
worker thread that gives its connection back (``awaiting.in_thread``) - and it is
outside the API's in-flight limit (``api.admission``), so a hundred waiting agents
take neither the pool nor the request slots the other routes need.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.security import HttpBearer

from effect_broker.api.effects import _tenant
from effect_broker.api.schemas import EffectOut, effect_out, with_problems
from effect_broker.domain.waits import MAX_WAIT_SECONDS, Until
from effect_broker.models import Tenant
from effect_broker.services import awaiting, inspection
from effect_broker.services.tenants import authenticate

#: The path's last segment (``api.admission`` recognises a long-poll by it).
WAIT_SEGMENT = "wait"


class WaitingApiKeyAuth(HttpBearer):
    """The tenant key, checked in a worker thread that returns its connection: the
    request then holds none while it waits (a sync check would keep the one it drew
    on the request's thread until the answer)."""

    async def authenticate(self, request: HttpRequest, token: str) -> Tenant:
        return await awaiting.in_thread(authenticate, token)


router = Router(auth=WaitingApiKeyAuth(), tags=["effects"])


class WaitQuery(Schema):
    """GET /v1/effects/{effect_id}/wait parameters."""

    timeout: float = Field(
        MAX_WAIT_SECONDS,
        ge=0,
        le=MAX_WAIT_SECONDS,
        allow_inf_nan=False,
        description=f"Seconds to wait at most (0 to {MAX_WAIT_SECONDS:g}; a larger "
        "value is a 422, not a silent clamp). The answer comes as soon as the effect "
        "reaches a state `until` stops at, else as it is when the time is up.",
    )
    until: Until = Field(
        Until.ANSWER,
        description="`answer`: stop at a final state or as soon as only an operator "
        "can settle the effect (unsafe `outcome_unknown`, `manual_review`); "
        "`settled`: stop at a final state only, waiting through an operator's "
        "resolution. Neither turns an unknown outcome into a result.",
    )


@router.get(
    f"/v1/effects/{{effect_id}}/{WAIT_SEGMENT}",
    response=with_problems({200: EffectOut}, 404),
    summary=f"Wait up to {MAX_WAIT_SECONDS:g} s for the effect to settle (long-poll); "
    "answer its state then",
)
async def wait_for_effect(
    request: HttpRequest, effect_id: str, query: Query[WaitQuery]
) -> dict[str, Any]:
    tenant = _tenant(request)
    until = query.until
    record = await awaiting.wait_until_settled(
        tenant,
        effect_id,
        query.timeout,
        stop=lambda r: awaiting.stops_waiting(until, r),
    )
    links = await awaiting.in_thread(inspection.fork_links, record)
    return effect_out(record, links=links)
