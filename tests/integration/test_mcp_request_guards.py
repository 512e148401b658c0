"""Checks on streamable-HTTP MCP requests (issue 19, item 12), over real HTTP to the
API process (``/mcp`` mounted) and to ``effect-broker mcp --transport http``:

- an ``Origin`` header must be allowed (DNS rebinding); no ``Origin`` is fine;
- the standalone server on a non-loopback bind checks ``Host`` as the API does;
- a body goes through REST's strict JSON parser (``1e-400``, duplicate keys);
- a disabled tenant gets REST's answer, 403 ``tenant_disabled``.
"""

from __future__ import annotations

import dataclasses
import json

import httpx
import pytest

from effect_broker.services.tenants import set_disabled
from tests.integration.mcp_support import World, standalone_http
from tests.integration.test_mcp_mounted import ACCEPT, api_server

pytestmark = [pytest.mark.django_db(transaction=True)]

ALLOWED_ORIGIN = "https://agents.example.com"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "guard-test", "version": "1"},
    },
}


def with_env(world: World, **extra: str) -> World:
    return dataclasses.replace(world, env={**world.env, **extra})


def post(base: str, api_key: str, *, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{base}/mcp",
        headers={
            "Authorization": f"Bearer {api_key}",
            "Accept": ACCEPT,
            "Content-Type": "application/json",
            **headers,
        },
        content=body,
        timeout=30,
    )


def test_the_mounted_mcp_refuses_a_foreign_origin_and_serves_no_origin(
    mcp_world: World,
) -> None:
    # Given the API process with one allowed web origin
    world = with_env(mcp_world, EFFECT_BROKER_MCP_ALLOWED_ORIGINS=ALLOWED_ORIGIN)
    body = json.dumps(INITIALIZE).encode()
    with api_server(world) as base:
        # When a page of another origin (a rebound DNS name), no browser, and the
        # allowed origin each send a request with a valid key
        foreign = post(base, world.api_key, body=body, Origin="http://evil.example")
        rebound = post(
            base, world.api_key, body=body, Origin="http://127.0.0.1.nip.io:8000"
        )
        no_origin = post(base, world.api_key, body=body)
        allowed = post(base, world.api_key, body=body, Origin=ALLOWED_ORIGIN)
    # Then the foreign ones are a 403 problem that does not echo the origin
    for refused in (foreign, rebound):
        assert refused.status_code == 403
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.json()["code"] == "origin_not_allowed"
        assert "evil" not in refused.text
        assert "nip.io" not in refused.text
    # And a client without Origin, and the allowed origin, are served
    for served_ok in (no_origin, allowed):
        assert served_ok.status_code == 200, served_ok.text
        assert served_ok.json()["result"]["serverInfo"]["name"] == "effect-broker"


def test_the_standalone_server_on_a_public_bind_checks_host_and_origin(
    mcp_world: World,
) -> None:
    body = json.dumps(INITIALIZE).encode()
    # Given `effect-broker mcp --transport http --host 0.0.0.0`
    with standalone_http(mcp_world.env, "0.0.0.0") as base:  # noqa: S104 - what is tested
        # When requests name another host, or come from another origin
        wrong_host = post(base, mcp_world.api_key, body=body, Host="evil.example")
        foreign = post(base, mcp_world.api_key, body=body, Origin="http://evil.example")
        fine = post(base, mcp_world.api_key, body=body)
    # Then both are refused; a request for an allowed host with no Origin is served
    assert wrong_host.status_code == 400
    assert wrong_host.json()["code"] == "disallowed_host"
    assert foreign.status_code == 403
    assert foreign.json()["code"] == "origin_not_allowed"
    assert fine.status_code == 200, fine.text


@pytest.mark.parametrize(
    ("raw_arguments", "code"),
    [
        # REST refuses a non-zero number that would underflow to 0 ...
        ('{"operation_key": "k:1", "order": "42", "amount_minor": 1e-400}', None),
        # ... and duplicate keys, which are gone once a lenient parser is done.
        (
            '{"operation_key": "k:2", "order": "42", "amount_minor": 5, '
            '"amount_minor": 500}',
            "invalid_json",
        ),
    ],
    ids=["underflow", "duplicate-key"],
)
def test_mcp_json_is_parsed_as_strictly_as_rest(
    mcp_world: World, raw_arguments: str, code: str | None
) -> None:
    # Given a tools/call whose arguments REST's parser refuses
    body = (
        '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": '
        '{"name": "charge_unsafe", "arguments": ' + raw_arguments + "}}"
    ).encode()
    with api_server(mcp_world) as base:
        # When it is posted to /mcp, and the same arguments to REST
        mcp = post(base, mcp_world.api_key, body=body)
        rest = httpx.post(
            f"{base}/v1/effects",
            headers={
                "Authorization": f"Bearer {mcp_world.api_key}",
                "Content-Type": "application/json",
            },
            content=(
                '{"operation_key": "rest:1", "tool": "charge_unsafe", "arguments": '
                + raw_arguments
                + "}"
            ).encode(),
        )
    # Then /mcp answers exactly what REST answers, and nothing was written
    assert rest.status_code == 400
    assert mcp.status_code == 400, mcp.text
    assert mcp.headers["content-type"].startswith("application/problem+json")
    assert mcp.json()["code"] == rest.json()["code"] == (code or "number_out_of_range")
    assert mcp_world.intents() == 0


def test_a_disabled_tenant_gets_the_same_403_on_mcp_and_rest(mcp_world: World) -> None:
    # Given a disabled tenant
    set_disabled(str(mcp_world.tenant.id), disabled=True)
    with api_server(mcp_world) as base:
        # When its key is used on both surfaces
        mcp = post(base, mcp_world.api_key, body=json.dumps(INITIALIZE).encode())
        rest = httpx.get(
            f"{base}/v1/effects",
            headers={"Authorization": f"Bearer {mcp_world.api_key}"},
        )
    # Then both answer 403 tenant_disabled, without a Bearer challenge
    assert rest.status_code == mcp.status_code == 403
    assert rest.json()["code"] == mcp.json()["code"] == "tenant_disabled"
    assert mcp.headers["content-type"].startswith("application/problem+json")
    assert "www-authenticate" not in mcp.headers
