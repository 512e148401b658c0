"""The demo agent's loop over a real MCP stdio session (issue 10, items 7 and 8).

``examples.agent.loop`` starts ``effect-broker mcp --transport stdio`` on the test
database with the official client; a real ``procrastinate worker`` process dispatches
to the real HTTP payments service, whose own table is counted. The model is
``ScriptedProvider``: what these tests pin is the loop's fixed delivery code - the key
it derives, the redelivery it survives, and the unknown outcome it never resends.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import psycopg
import pytest
from django.conf import settings
from django.db import connection
from psycopg import sql

from config.database import url_from_settings
from effect_broker.keys import agent_key
from effect_broker.models import EffectIntent, Tenant
from effect_broker.services.tenants import create_tenant
from examples.agent.demo import contracts_toml
from examples.agent.loop import AgentLoop, AgentRun, DeliveryPolicy, broker_session
from examples.agent.providers import Message, ModelTurn, ScriptedProvider, ToolSpec
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import WorkerProcess, broker_env
from tests.job_tables import forget_old_jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

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


@pytest.fixture
def agent_world(tmp_path: Path) -> Iterator[AgentWorld]:
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


class Recording(ScriptedProvider):
    """The scripted model, remembering the tools it was shown."""

    shown: list[ToolSpec]

    async def next_turn(
        self, conversation: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelTurn:
        self.shown = list(tools)
        return await super().next_turn(conversation, tools)


def run_agent(world: AgentWorld, provider: ScriptedProvider, run_id: str) -> AgentRun:
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
            return await loop.run("charge order 42")

    return anyio.run(main)


def test_the_scripted_agent_charges_once_though_the_call_is_delivered_three_times(
    agent_world: AgentWorld,
) -> None:
    # Given the scripted model and a transport that delivers every call three times
    provider = Recording(charge_tool="charge_order")
    run_id = f"run-{uuid.uuid4().hex[:8]}"

    # When the agent is asked to charge order 42
    run = run_agent(agent_world, provider, run_id)

    # Then the model was shown the charge tool without an operation_key: it cannot
    # choose one; the loop derived it from the run id and the model's call id
    charge_tool = next(t for t in provider.shown if t.name == "charge_order")
    assert "operation_key" not in charge_tool.parameters["properties"]
    assert charge_tool.parameters["required"] == ["order", "amount_minor", "currency"]
    charges = [d for d in run.deliveries if d.call_id == "call-1"]
    assert len(charges) == 3
    assert {d.operation_key for d in charges} == {agent_key(run_id, "call-1")}
    # and all three deliveries got the same succeeded effect
    assert {d.status for d in charges} == {"succeeded"}
    assert len({d.effect_id for d in charges}) == 1
    # which the model read back through get_receipt before it answered
    assert [d.call_id for d in run.deliveries].count("call-2") == 0  # a read: no copies
    assert run.final is not None
    assert run.final.startswith("Order 42 is charged (EUR 19.99): target charge ch_")
    # And the target's own table holds one charge; the ledger one intent
    assert agent_world.target.count_charges() == 1
    assert agent_world.intents() == 1


def test_an_unknown_outcome_reaches_the_agent_and_is_never_resent_under_another_key(
    agent_world: AgentWorld,
) -> None:
    # Given an unsafe tool whose next answer is lost after the target committed
    agent_world.target.inject("drop_connection_after_commit")
    provider = ScriptedProvider(charge_tool="charge_order_unsafe")

    # When the agent charges order 42, the call delivered three times
    run = run_agent(agent_world, provider, f"run-{uuid.uuid4().hex[:8]}")

    # Then every delivery reports the unknown outcome as an error naming it
    assert len(run.deliveries) == 3
    assert {d.status for d in run.deliveries} == {"error [outcome_unknown]"}
    assert len({d.effect_id for d in run.deliveries}) == 1
    # and the model's answer says plainly that nobody knows
    assert run.final is not None
    assert run.final.startswith("Order 42 was not confirmed: [outcome_unknown]")
    assert "Nobody knows yet whether this happened" in run.final
    # And nothing was resent: one intent, one request at the target, one charge
    assert agent_world.intents() == 1
    assert agent_world.target.stats()["requests"] == 1
    assert agent_world.target.count_charges() == 1
