"""The MCP server mounted in the API: ``uvicorn config.asgi:application`` serves
``/v1/...`` and ``/mcp`` on one port, and a real MCP client session
(``mcp.client.streamable_http``) talks to it with a tenant key as
``Authorization: Bearer`` (issue 10, item 1).

Waiting proxy calls share one LISTEN connection per process (item 3 of the same issue,
``services.awaiting.ChangeHub``): counted in ``pg_stat_activity``, and killed with
``pg_terminate_backend`` while calls wait.

This process plays the worker (in-process ``dispatch`` on a simulated target), so a
test decides exactly when an effect settles.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from django.db import connection
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from effect_broker.domain.states import EffectStatus
from effect_broker.services.dispatch import dispatch
from tests.integration.mcp_support import (
    MANAGEMENT,
    ROOT,
    WAIT_SECONDS,
    World,
    charge,
    effect_by_key,
    in_thread,
    text_of,
)
from tests.served import served

pytestmark = [pytest.mark.django_db(transaction=True)]

ACCEPT = "application/json, text/event-stream"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def api_server(world: World, *, lifespan: str = "on") -> Iterator[str]:
    """``uvicorn config.asgi:application`` on the test database; its base URL once
    ``/healthz`` answers."""
    port = _free_port()
    with tempfile.TemporaryFile() as log:
        yield from _serve(world, port, lifespan, log)


def _serve(world: World, port: int, lifespan: str, log: Any) -> Iterator[str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "config.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--lifespan",
            lifespan,
            "--no-access-log",
        ],
        env=world.env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    with served(process, f"http://127.0.0.1:{port}", "uvicorn", log) as base:
        yield base


def in_session(
    base: str, api_key: str, body: Callable[[ClientSession], Awaitable[Any]]
) -> Any:
    """Open a streamable-HTTP client session on ``base``/mcp and run ``body`` in it."""

    async def main() -> Any:
        headers = {"Authorization": f"Bearer {api_key}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as client,
            streamable_http_client(f"{base}/mcp", http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await body(session)

    return anyio.run(main)


def _listeners() -> int:
    """Backends of this database that LISTEN for effect changes."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
        return int(cur.fetchone()[0])


def _terminate_listeners() -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
            "FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
        return int(cur.fetchone()[0])


async def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await in_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await anyio.sleep(0.05)


@pytest.mark.parametrize("lifespan", ["on", "off"])
def test_mcp_is_served_by_the_api_process_with_a_bearer_key(
    mcp_world: World, lifespan: str
) -> None:
    key = f"run:{uuid.uuid4().hex[:8]}:step:charge"

    async def body(session: ClientSession) -> dict[str, Any]:
        listed = await session.list_tools()
        results: dict[str, Any] = {"listed": listed}

        async def call() -> None:
            results["call"] = await session.call_tool("charge_idempotent", charge(key))

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            # When the worker (this process) dispatches it while the call waits
            effect_id = await in_thread(effect_by_key, mcp_world.tenant, key)
            await in_thread(lambda: dispatch(effect_id, worker="test"))
        results["effect_id"] = effect_id
        results["read"] = await session.call_tool("get_effect", {"effect_id": effect_id})
        return results

    # Given the API process, with or without the ASGI lifespan
    with api_server(mcp_world, lifespan=lifespan) as base:
        # When an MCP client with the tenant's key lists tools and calls a proxy tool
        out = in_session(base, mcp_world.api_key, body)
        # Then the REST API on the same port sees the same effect, for the same key
        rest = httpx.get(
            f"{base}/v1/effects/{out['effect_id']}",
            headers={"Authorization": f"Bearer {mcp_world.api_key}"},
        )

    assert {t.name for t in out["listed"].tools} == MANAGEMENT | {
        "charge_unsafe",
        "charge_idempotent",
    }
    call = out["call"]
    assert not call.is_error, text_of(call)
    assert call.structured_content["status"] == "succeeded"
    assert call.structured_content["charge_id"]
    assert call.meta == {"effect_broker/effect_id": out["effect_id"]}
    read = out["read"]
    assert not read.is_error
    assert read.structured_content["status"] == "succeeded"
    assert rest.status_code == 200
    assert rest.json()["status"] == "succeeded"
    assert mcp_world.intents() == 1


def test_the_mounted_endpoint_keeps_the_api_boundary_guards(mcp_world: World) -> None:
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    with api_server(mcp_world) as base:
        wrong_key = httpx.post(
            f"{base}/mcp",
            headers={"Authorization": "Bearer eb_wrong", "Accept": ACCEPT},
            json=rpc,
        )
        no_key = httpx.post(f"{base}/mcp", headers={"Accept": ACCEPT}, json=rpc)
        too_big = httpx.post(
            f"{base}/mcp",
            headers={"Accept": ACCEPT, "Content-Type": "application/json"},
            content=b"x" * (300 * 1024),
        )
        in_query = httpx.post(f"{base}/mcp?api_key=eb_secret", json=rpc)
        wrong_host = httpx.post(
            f"{base}/mcp",
            headers={
                "Authorization": f"Bearer {mcp_world.api_key}",
                "Accept": ACCEPT,
                "Host": "evil.example",
            },
            json=rpc,
        )
        health = httpx.get(f"{base}/healthz")

    # A wrong or missing key is a problem document with the Bearer challenge
    for refused in (wrong_key, no_key):
        assert refused.status_code == 401
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["code"] == "unauthenticated"
    # An oversized body is refused before it is read or the key is checked
    assert too_big.status_code == 413
    assert too_big.json()["code"] == "payload_too_large"
    # A credential in the query string is refused, whatever it is
    assert in_query.status_code == 400
    assert in_query.json()["code"] == "credential_in_query"
    # A Host the API would refuse is refused on /mcp too, before the key is checked
    assert wrong_host.status_code == 400
    assert wrong_host.headers["content-type"].startswith("application/problem+json")
    assert wrong_host.json()["code"] == "disallowed_host"
    # The process's health route answers without a key
    assert health.status_code == 200


def test_concurrent_waiting_calls_share_one_listening_connection(
    mcp_world: World,
) -> None:
    calls = 8
    keys = [f"run:{uuid.uuid4().hex[:8]}:step:{n}" for n in range(calls)]

    async def body(session: ClientSession) -> dict[str, Any]:
        results: dict[str, Any] = {}

        async def call(key: str) -> None:
            results[key] = await session.call_tool("charge_idempotent", charge(key))

        async with anyio.create_task_group() as group:
            for key in keys:
                group.start_soon(call, key)
            # Given every call reserved its effect and is waiting (nobody dispatches)
            for key in keys:
                await in_thread(effect_by_key, mcp_world.tenant, key)
            await _until(lambda: _listeners() >= 1, "the listener")
            # When the calls wait, the listening backends are counted
            results["listeners"] = [await in_thread(_listeners) for _ in range(10)]
        return results

    with api_server(mcp_world) as base:
        out = in_session(base, mcp_world.api_key, body)

    # Then all of them wait on one LISTEN connection, not one each
    assert out["listeners"] == [1] * 10
    for key in keys:
        assert out[key].structured_content["status"] == "prepared"
        assert out[key].structured_content["done"] is False


def test_waiters_finish_when_the_listening_connection_is_killed(
    mcp_world: World,
) -> None:
    calls = 4
    keys = [f"run:{uuid.uuid4().hex[:8]}:step:{n}" for n in range(calls)]

    async def body(session: ClientSession) -> dict[str, Any]:
        results: dict[str, Any] = {}

        async def call(key: str) -> None:
            started = time.monotonic()
            results[key] = await session.call_tool("charge_idempotent", charge(key))
            results[f"{key}:elapsed"] = time.monotonic() - started

        async with anyio.create_task_group() as group:
            for key in keys:
                group.start_soon(call, key)
            effect_ids = [
                await in_thread(effect_by_key, mcp_world.tenant, key) for key in keys
            ]
            await _until(lambda: _listeners() == 1, "the listener")
            # Given the calls wait, when their listening connection is killed
            results["killed"] = await in_thread(_terminate_listeners)
            # and the effects settle while it may be down
            for effect_id in effect_ids:
                settled = await in_thread(
                    lambda effect_id=effect_id: dispatch(effect_id, worker="test")
                )
                assert settled.status is EffectStatus.SUCCEEDED
        # and the process listens again afterwards, on one connection
        await _until(lambda: _listeners() == 1, "the listener to reconnect")
        return results

    with api_server(mcp_world) as base:
        out = in_session(base, mcp_world.api_key, body)

    assert out["killed"] == 1
    for key in keys:
        # Then every call still gets its receipt, before its wait ran out
        result = out[key]
        assert not result.is_error, text_of(result)
        assert result.structured_content["status"] == "succeeded"
        # Woken, not waited out: that path ends at WAIT_SECONDS or later (issue 19).
        assert out[f"{key}:elapsed"] < WAIT_SECONDS
