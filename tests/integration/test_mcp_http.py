"""The MCP server over streamable HTTP: ``effect-broker mcp --transport http`` as a
subprocess, a tenant API key as ``Authorization: Bearer``, and a real client session
(``mcp.client.streamable_http``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import httpx2
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from effect_broker.domain.records import EffectRequest
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from tests.integration.mcp_support import MANAGEMENT, World, standalone_http

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def server(mcp_world: World) -> Iterator[str]:
    """The HTTP server's base URL, once its health route answers."""
    with standalone_http(mcp_world.env) as base:
        yield base


def _session_calls(base: str, api_key: str, effect_ids: list[str]) -> list[Any]:
    async def main() -> list[Any]:
        headers = {"Authorization": f"Bearer {api_key}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as client,
            streamable_http_client(f"{base}/mcp", http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            out: list[Any] = [await session.list_tools()]
            for effect_id in effect_ids:
                out.append(
                    await session.call_tool("get_effect", {"effect_id": effect_id})
                )
            return out

    return anyio.run(main)


def test_health_answers_without_a_key_and_mcp_refuses_without_one(
    server: str,
) -> None:
    assert httpx.get(f"{server}/healthz").json() == {"status": "ok"}
    for headers in ({}, {"Authorization": "Bearer eb_wrong"}, {"Authorization": "x"}):
        refused = httpx.post(
            f"{server}/mcp",
            headers={**headers, "Accept": "application/json, text/event-stream"},
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        )
        assert refused.status_code == 401
        assert refused.json()["code"] == "unauthenticated"


def test_the_http_transport_has_the_api_boundary_guards(server: str) -> None:
    # An oversized body is refused before it is read and before the key is checked
    too_big = httpx.post(
        f"{server}/mcp",
        headers={"Accept": "application/json, text/event-stream"},
        content=b"x" * (300 * 1024),
    )
    assert too_big.status_code == 413
    assert too_big.headers["content-type"].startswith("application/problem+json")
    assert too_big.json()["code"] == "payload_too_large"
    # A credential in the query string is refused, whatever it is
    in_query = httpx.post(f"{server}/mcp?api_key=eb_secret", json={})
    assert in_query.status_code == 400
    assert in_query.json()["code"] == "credential_in_query"
    # A missing key is a problem document with the Bearer challenge
    no_key = httpx.post(f"{server}/mcp", json={})
    assert no_key.status_code == 401
    assert no_key.headers["content-type"].startswith("application/problem+json")
    assert no_key.headers["www-authenticate"] == "Bearer"


def test_bearer_key_picks_the_tenant_for_tools(mcp_world: World, server: str) -> None:
    # Given an effect of this tenant and one of another tenant
    other, _ = create_tenant(f"other-{uuid.uuid4().hex[:6]}")
    mine = submit(
        mcp_world.tenant,
        EffectRequest(operation_key="mine:1", tool="charge_unsafe", arguments={}),
    ).effect
    theirs = submit(
        other, EffectRequest(operation_key="theirs:1", tool="charge_unsafe", arguments={})
    ).effect

    # When a client with this tenant's key lists tools and reads both effects
    listed, own, foreign = _session_calls(
        server, mcp_world.api_key, [mine.effect_id, theirs.effect_id]
    )

    # Then it sees the same tools as over stdio, and only its own effect
    assert {t.name for t in listed.tools} == MANAGEMENT | {
        "charge_unsafe",
        "charge_idempotent",
    }
    assert isinstance(own, types.CallToolResult)
    assert not own.is_error
    assert own.structured_content["effect_id"] == mine.effect_id
    assert foreign.is_error
    assert foreign.structured_content["code"] == "effect_not_found"
