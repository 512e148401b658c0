"""Shared set-up of the demo agent's tests: the payments service in a schema of its
own, contracts with MCP faces (the demo's idempotent tool and an unsafe one), a tenant
with its API key, one real worker process, and a runner for the agent loop."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import psycopg
from django.conf import settings
from django.db import connection
from psycopg import sql

from config.database import url_from_settings
from effect_broker.models import EffectIntent, Tenant
from effect_broker.services.tenants import create_tenant
from examples.agent.demo import contracts_toml
from examples.agent.loop import AgentLoop, AgentRun, DeliveryPolicy, broker_session
from examples.agent.providers import ModelProvider
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import WorkerProcess, broker_env
from tests.job_tables import forget_old_jobs

UNSAFE_CONTRACT = """
[[contract]]
name = "demo.charge-order-unsafe"
version = "1"
tool = "charge_order_unsafe"
safety = "unsafe"
retry_limit = 3
adapter = "http"
[contract.adapter_options]
url = "{target_url}/unsafe/charges"
timeout = "10s"
connect_timeout = "1s"
[contract.mcp]
[contract.mcp.input_schema]
type = "object"
required = ["order", "amount_minor", "currency"]
additionalProperties = false
properties.order.type = "string"
properties.amount_minor = {{ type = "integer", minimum = 1 }}
properties.currency.type = "string"
"""


@dataclass
class AgentWorld:
    tenant: Tenant
    env: dict[str, str]
    target: TargetProcess

    def intents(self) -> int:
        return EffectIntent.objects.filter(tenant_id=self.tenant.id).count()


@contextmanager
def open_agent_world(tmp_path: Path) -> Iterator[AgentWorld]:
    """A tenant, the payments service in its own schema, contracts, one worker."""
    connection.ensure_connection()
    forget_old_jobs()
    database_url = url_from_settings(connection.settings_dict)
    schema = f"agent_loop_{uuid.uuid4().hex[:8]}"
    target = start_target(
        database_url, settlement_delay="500ms", key_retention="24h", schema=schema
    )
    contracts = tmp_path / "contracts.toml"
    contracts.write_text(
        contracts_toml(target.url) + UNSAFE_CONTRACT.format(target_url=target.url)
    )
    tenant, api_key = create_tenant(f"agent-{uuid.uuid4().hex[:6]}")
    master_key = settings.EFFECT_BROKER_MASTER_KEY
    assert master_key is not None
    env = broker_env(
        database_url,
        contracts,
        master_key,
        extra={
            "EFFECT_BROKER_API_KEY": api_key,
            "EFFECT_BROKER_MCP_WAIT_SECONDS": "15",
        },
    )
    worker = WorkerProcess("agent-loop", env, concurrency=1)
    try:
        yield AgentWorld(tenant, env, target)
    finally:
        worker.stop()
        target.stop()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )


def run_agent(
    world: AgentWorld,
    provider: ModelProvider,
    run_id: str,
    prompt: str = "charge order 42",
) -> AgentRun:
    events: list[str] = []

    async def main() -> AgentRun:
        async with broker_session(world.env) as session:
            loop = AgentLoop(
                session,
                provider,
                run_id=run_id,
                policy=DeliveryPolicy(copies=3, settle_timeout=60),
                on_event=events.append,
            )
            return await loop.run(prompt)

    return anyio.run(main)
