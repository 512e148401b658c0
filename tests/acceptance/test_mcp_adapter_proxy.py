"""Issue 10's acceptance, for a tool behind the ``mcp`` adapter: an MCP client calls the
broker's proxy tool (``effect-broker mcp --transport stdio``), whose contract puts the
broker in front of the example payments MCP server (a stdio subprocess of each worker
attempt), which charges through the real target service. The call is delivered three
times under one operation key, and the worker is SIGKILLed right after the target
committed. The target's own table holds exactly one charge, and the ledger one effect.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from django.conf import settings
from django.db import connection
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from config.database import url_from_settings
from effect_broker import store
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectIntent, EffectReceipt
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import WorkerProcess, broker_env, wait_until
from examples.mcp_upstream.contracts import MCP_TOOLS, ROOT, mcp_contracts_toml
from tests.job_tables import forget_old_jobs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TOOL = MCP_TOOLS["idempotent"]
OPERATION_KEY = "order:42:charge:v1"
ARGUMENTS = {"operation_key": OPERATION_KEY, "order": "42", "amount_minor": 1999}


@pytest.fixture
def target() -> Iterator[TargetProcess]:
    connection.ensure_connection()
    forget_old_jobs()
    url = url_from_settings(connection.settings_dict)
    service = start_target(url, settlement_delay="300ms", schema="mcp_proxy_target")
    try:
        service.reset()
        yield service
    finally:
        service.stop()


def in_thread(fn: Any, *args: Any) -> Any:
    def run() -> Any:
        try:
            return fn(*args)
        finally:
            connection.close()

    return anyio.to_thread.run_sync(run)


def test_three_deliveries_and_a_worker_killed_after_commit_leave_one_charge(
    target: TargetProcess, tmp_path: Path
) -> None:
    # Given the broker's MCP server with a proxy tool whose contract uses the mcp
    # adapter in front of the payments MCP server (idempotent: the broker's key fills
    # its idempotency_key argument on every attempt)
    contracts = tmp_path / "contracts.toml"
    contracts.write_text(mcp_contracts_toml(target.url, mcp_face=True))
    tenant, api_key = create_tenant(f"mcp-adapter-{uuid.uuid4().hex[:6]}")
    assert settings.EFFECT_BROKER_MASTER_KEY is not None
    database_url = url_from_settings(connection.settings_dict)

    def env(failpoints: str = "") -> dict[str, str]:
        return broker_env(
            database_url,
            contracts,
            settings.EFFECT_BROKER_MASTER_KEY,
            failpoints=failpoints,
            extra={
                "EFFECT_BROKER_API_KEY": api_key,
                "EFFECT_BROKER_MCP_WAIT_SECONDS": "20",
            },
        )

    # and a worker that SIGKILLs itself right after the target committed
    doomed = WorkerProcess("mcp-doomed", env("after_target_commit"))
    rescuer: WorkerProcess | None = None
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "effect_broker.cli", "mcp", "--transport", "stdio"],
        env=env(),
        cwd=ROOT,
    )

    async def agent() -> tuple[types.ListToolsResult, list[types.CallToolResult], int]:
        nonlocal rescuer
        async with (
            stdio_client(server) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
            # When the transport delivers the call (1) while the worker dies
            answers = [await session.call_tool(TOOL, ARGUMENTS)]
            code = await in_thread(doomed.wait, 60)
            # (2) again, while a fresh worker's sweeper recovers the effect
            rescuer = await in_thread(WorkerProcess, "mcp-rescuer", env())
            answers.append(await session.call_tool(TOOL, ARGUMENTS))
            await in_thread(
                lambda: wait_until(
                    lambda: EffectIntent.objects.filter(
                        tenant_id=tenant.id, status=EffectStatus.SUCCEEDED.value
                    ).exists(),
                    timeout=60,
                    what="the effect to succeed",
                )
            )
            # (3) and once more after it settled
            answers.append(await session.call_tool(TOOL, ARGUMENTS))
            return listed, answers, code

    started = time.monotonic()
    try:
        listed, answers, code = anyio.run(agent)
    finally:
        doomed.close()
        if rescuer is not None:
            rescuer.stop()
    elapsed = time.monotonic() - started

    # Then the proxy tool is listed with its contract's schema and a required key
    tool = next(t for t in listed.tools if t.name == TOOL)
    assert tool.input_schema["required"] == ["operation_key", "order", "amount_minor"]
    assert code == -9, "the failpoint should have SIGKILLed the first worker"
    # The three deliveries are one effect...
    effects = EffectIntent.objects.filter(tenant_id=tenant.id)
    assert effects.count() == 1
    effect = effects.get()
    ids = {
        (a.structured_content or {}).get("effect_id")
        or (a.meta or {}).get("effect_broker/effect_id")
        for a in answers
    }
    assert ids == {str(effect.id)}
    # ...which succeeded, and the last delivery carries the receipt's result
    last = answers[-1]
    assert last.is_error is False
    record = store.load_effect_for_worker(str(effect.id))
    assert record.status is EffectStatus.SUCCEEDED
    assert EffectReceipt.objects.filter(effect_id=effect.id).count() == 1
    assert last.structured_content is not None
    charge_id = last.structured_content["id"]
    assert charge_id.startswith("ch_")
    # The target's own table: exactly one charge, under the broker's one key
    assert target.count_by_key("idempotent", record.downstream_key) == 1
    assert target.count_charges() == 1
    assert [c.id for c in target.charges()] == [charge_id]
    print(f"mcp adapter acceptance: one charge after 3 deliveries in {elapsed:.1f}s")
