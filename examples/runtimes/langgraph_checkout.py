"""Charge an order from a LangGraph graph, through the broker
(docs/how-to/runtime-langgraph.md).

With ``effect-broker dev`` running in another terminal and the API key it printed::

    export EFFECT_BROKER_API_KEY=...
    export RUNTIME_DATABASE_URL=$(effect-broker db url --dbname langgraph_checkout)
    python -m examples.runtimes.langgraph_checkout --order 42

The graph keeps its checkpoints in PostgreSQL (``PostgresSaver``). After a crash, run
the same command again: the graph resumes from its last checkpoint, re-runs the
``charge`` node, and the node replays the broker's effect under the key it stored in
the graph's state before anything was sent. When nobody knows whether the charge
happened (``OutcomeUnknown``), the node calls ``interrupt()``: the graph stops, its
checkpoint holds the pause, and the command exits (status 3). Once an operator has
settled the effect (``effect-broker effects resolve``), the same command resumes it.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt

from effect_broker.client import OutcomeUnknown
from effect_broker.keys import langgraph_key
from examples.runtimes.recipe_settings import (
    broker,
    charge_arguments,
    parse_order,
    runtime_database_url,
)

#: The exit status while the graph waits for an operator.
WAITING = 3


class Checkout(TypedDict, total=False):
    """The graph's state."""

    tool: str
    arguments: dict[str, Any]
    operation_key: str
    result: dict[str, Any]


def choose_key(state: Checkout, config: RunnableConfig) -> dict[str, Any]:
    """Fix the charge's key in the state, checkpointed before anything is sent."""
    # The thread and the business operation, never the node's position: a step or
    # task id can move after a recovery (an update_state before the resume re-runs
    # the node one step later), and a different key would be a second charge.
    # Computed once here and then only read by `charge`.
    order = state["arguments"]["order"]
    key = langgraph_key(config["configurable"]["thread_id"], f"order:{order}:charge")
    return {"operation_key": key}


def charge(state: Checkout) -> dict[str, Any]:
    """Charge through the broker under the stored key; pause while it is unknown."""
    with broker() as client:
        try:
            result = client.perform(
                state["operation_key"], tool=state["tool"], arguments=state["arguments"]
            )
        except OutcomeUnknown as unknown:
            # The graph stops here and its checkpoint keeps the pause. Resuming re-runs
            # this node from the top: its perform replays the effect as settled.
            interrupt({"effect_id": unknown.effect_id, "detail": str(unknown)})
            raise  # resumed while still unknown: fail the node, keep the checkpoint
    return {"result": result}


def build(saver: PostgresSaver) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The checkout graph: choose the key, then charge."""
    graph = StateGraph(Checkout)
    graph.add_node("choose_key", choose_key)
    graph.add_node("charge", charge)
    graph.add_edge(START, "choose_key")
    graph.add_edge("choose_key", "charge")
    graph.add_edge("charge", END)
    return graph.compile(checkpointer=saver)


def main(argv: list[str] | None = None) -> int:
    """Start, continue after a crash, or resume after an operator: whichever is due."""
    options = parse_order(__doc__ or "", argv)
    config: RunnableConfig = {"configurable": {"thread_id": f"checkout-{options.order}"}}
    with PostgresSaver.from_conn_string(runtime_database_url()) as saver:
        saver.setup()
        graph = build(saver)
        state = graph.get_state(config)
        if state.interrupts:  # paused on an unknown outcome
            effect_id = state.interrupts[0].value["effect_id"]
            with broker() as client:
                effect = client.get(effect_id)
            if not effect.settled:
                print(f"still waiting: effect {effect_id} is {effect.status}", flush=True)
                return WAITING
            out = graph.invoke(Command(resume=effect.status), config)
        elif state.next:  # a run stopped mid-graph: carry on from the checkpoint
            out = graph.invoke(None, config)
        elif "result" in state.values:  # done before: nothing to do
            out = state.values
        else:
            start = {"tool": options.tool, "arguments": charge_arguments(options)}
            out = graph.invoke(start, config)
    if "__interrupt__" in out:
        effect_id = out["__interrupt__"][0].value["effect_id"]
        print(
            f"outcome unknown: effect {effect_id} awaits an operator; run this "
            "command again once it is resolved",
            flush=True,
        )
        return WAITING
    print("charged:", json.dumps(out["result"], sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
