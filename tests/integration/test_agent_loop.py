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
from pathlib import Path

import pytest

from effect_broker.keys import agent_key
from examples.agent.providers import Message, ModelTurn, ScriptedProvider, ToolSpec
from tests.integration.agent_support import AgentWorld, open_agent_world, run_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def agent_world(tmp_path: Path) -> Iterator[AgentWorld]:
    with open_agent_world(tmp_path) as world:
        yield world


class Recording(ScriptedProvider):
    """The scripted model, remembering the tools it was shown."""

    shown: list[ToolSpec]

    async def next_turn(
        self, conversation: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelTurn:
        self.shown = list(tools)
        return await super().next_turn(conversation, tools)


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
