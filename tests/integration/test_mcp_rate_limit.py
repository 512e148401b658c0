"""One per-tenant submit limiter for every surface (issue 19, item 10): MCP proxy
calls go through the limiter REST submits go through, and an MCP refusal is a
``rate_limited`` tool error with a retry hint.

Measured before the fix, limit 1/s burst 5: REST accepted 5 and refused 25 with 429;
MCP accepted all 30. Here a real MCP client session (``mcp.client.streamable_http``)
talks to ``/mcp`` mounted in the API process; the rate is 1 token per 100 s so the
count cannot drift with how long the calls take.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import httpx
import mcp.types as types
import pytest
from mcp import ClientSession

from effect_broker.models import EffectIntent
from tests.integration.mcp_support import World, charge, text_of
from tests.integration.test_mcp_mounted import api_server, in_session

pytestmark = [pytest.mark.django_db(transaction=True)]

BURST = 5
CALLS = 30


def test_mcp_proxy_calls_share_the_tenants_submit_limit_with_rest(
    mcp_world: World,
) -> None:
    # Given a tenant limited to a burst of 5 submits (refilling 1 per 100 s), and an
    # API that answers a proxy call at once ("still running") instead of waiting
    world = dataclasses.replace(
        mcp_world,
        env={
            **mcp_world.env,
            "EFFECT_BROKER_TENANT_SUBMIT_RATE": "0.01",
            "EFFECT_BROKER_TENANT_SUBMIT_BURST": str(BURST),
            "EFFECT_BROKER_MCP_WAIT_SECONDS": "0",
        },
    )
    prefix = f"rl:{uuid.uuid4().hex[:8]}"

    async def body(session: ClientSession) -> list[types.CallToolResult]:
        return [
            await session.call_tool("charge_idempotent", charge(f"{prefix}:{n}"))
            for n in range(CALLS)
        ]

    with api_server(world) as base:
        # When an MCP client makes 30 proxy calls
        results: list[types.CallToolResult] = in_session(base, world.api_key, body)
        # and then the same tenant submits over REST
        rest = httpx.post(
            f"{base}/v1/effects",
            json={
                "operation_key": f"{prefix}:rest",
                "tool": "charge_idempotent",
                "arguments": {"order": "42", "amount_minor": 1},
            },
            headers={"Authorization": f"Bearer {world.api_key}"},
        )

    # Then the burst is accepted and every later call is refused with a retry hint
    accepted = [r for r in results if not r.is_error]
    refused = [r for r in results if r.is_error]
    assert len(accepted) == BURST, [text_of(r) for r in results]
    assert all(r.structured_content["done"] is False for r in accepted)
    assert results[:BURST] == accepted
    assert len(refused) == CALLS - BURST
    for result in refused:
        content: dict[str, Any] = result.structured_content or {}
        assert content["code"] == "rate_limited"
        seconds = content["details"]["retry_after_seconds"]
        assert isinstance(seconds, int)
        assert 1 <= seconds <= 100
        assert text_of(result).startswith("[rate_limited] ")
        assert f"retry in {seconds} s with the same operation key" in text_of(result)
    # and the refused calls stored nothing
    stored = EffectIntent.objects.filter(
        tenant_id=world.tenant.id, operation_key__startswith=prefix
    )
    assert sorted(stored.values_list("operation_key", flat=True)) == sorted(
        f"{prefix}:{n}" for n in range(BURST)
    )
    # and REST draws on the same, now empty, bucket
    assert rest.status_code == 429, rest.text[:500]
    assert rest.json()["code"] == "rate_limited"
    assert int(rest.headers["retry-after"]) >= 1
