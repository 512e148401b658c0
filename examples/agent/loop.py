"""The agent loop: a real MCP client of the broker's server, over stdio.

The loop opens ``effect-broker mcp --transport stdio`` with the official client
(``mcp.ClientSession`` over ``stdio_client``), lists the tools, shows them to a
``ModelProvider`` and runs the calls it asks for. What the model decides is which tool
and which business arguments. Everything that decides whether an action can happen
twice is fixed code here, the same whatever the model:

- the operation key is ``effect_broker.keys.agent_key(run_id, tool_call_id)``: the
  model never sees the ``operation_key`` parameter (it is removed from the schema it
  is shown) and cannot choose or vary it;
- how many times the transport delivers a call (``DeliveryPolicy.copies``; the demo
  uses 3 to play an at-least-once transport) and how long the loop keeps asking again
  while the broker answers "still running" - always with the same key and arguments;
- an error, an unknown outcome included, goes back to the model as it came; the loop
  never resends it under another key.

The safety class is the contract's: the broker decides it, not the loop or the model.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from effect_broker.keys import agent_key
from examples.agent.providers import Message, ModelProvider, ToolCall, ToolSpec

ROOT = Path(__file__).resolve().parents[2]
KEY_FIELD = "operation_key"
EFFECT_ID_META = "effect_broker/effect_id"


def broker_command() -> tuple[str, list[str]]:
    """``effect-broker mcp --transport stdio``, from this interpreter's environment."""
    script = Path(sys.executable).with_name("effect-broker")
    args = ["mcp", "--transport", "stdio"]
    if script.exists():
        return str(script), args
    # Not installed as a script (a bare checkout): the same CLI as a module.
    return sys.executable, ["-m", "effect_broker.cli", *args]


@asynccontextmanager
async def broker_session(
    env: Mapping[str, str], *, errlog: TextIO | None = None
) -> AsyncIterator[ClientSession]:
    """Start the broker's stdio MCP server with ``env`` and yield an initialized
    client session; the server stops when the block ends (its stdin closes)."""
    command, args = broker_command()
    params = StdioServerParameters(command=command, args=args, env=dict(env), cwd=ROOT)
    async with (
        stdio_client(params, errlog=errlog or sys.stderr) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@dataclass(frozen=True)
class DeliveryPolicy:
    """How the loop delivers a side-effecting call: fixed code, never the model's."""

    #: Times the transport delivers each call (at-least-once; same key each time).
    copies: int = 1
    #: How long a delivery keeps asking again while the broker says "still running".
    settle_timeout: float = 120.0
    #: Pause before asking again (the server itself waits for settlement first).
    ask_again_after: float = 0.5


@dataclass(frozen=True)
class Delivery:
    """What one delivered copy of a call ended with."""

    call_id: str
    tool: str
    copy: int
    operation_key: str
    asks: int
    effect_id: str | None
    status: str
    is_error: bool


@dataclass
class AgentRun:
    """The run's record: final answer, conversation, and every delivery."""

    run_id: str
    final: str | None = None
    conversation: list[Message] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)


def model_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A proxy tool's schema as the model sees it: without ``operation_key``."""
    properties = {k: v for k, v in (schema.get("properties") or {}).items()}
    properties.pop(KEY_FIELD, None)
    shown = {**schema, "properties": properties}
    if "required" in schema:
        shown["required"] = [r for r in schema["required"] if r != KEY_FIELD]
    return shown


def is_proxy_tool(tool: types.Tool) -> bool:
    """A proxy tool (a side effect) requires an operation key; management tools don't."""
    return KEY_FIELD in (tool.input_schema.get("required") or [])


def tool_specs(tools: Sequence[types.Tool]) -> list[ToolSpec]:
    """The MCP tools in the provider-neutral form a model is shown."""
    return [
        ToolSpec(tool.name, tool.description or "", model_schema(tool.input_schema))
        for tool in tools
    ]


def effect_id_of(result: types.CallToolResult) -> str | None:
    """The effect a tool result is about, wherever the server put it."""
    meta = result.meta or {}
    if isinstance(meta.get(EFFECT_ID_META), str):
        return str(meta[EFFECT_ID_META])
    data = (
        result.structured_content if isinstance(result.structured_content, dict) else {}
    )
    found = data.get("effect_id") or (data.get("details") or {}).get("effect_id")
    return str(found) if found else None


def still_running(result: types.CallToolResult) -> bool:
    """The broker's "not settled yet, ask again with the same key" answer."""
    data = result.structured_content
    return not result.is_error and isinstance(data, dict) and data.get("done") is False


def status_of(result: types.CallToolResult) -> str:
    """A short word for a tool result: the error code, the effect's status while it
    is still running, else ``succeeded``."""
    data = (
        result.structured_content if isinstance(result.structured_content, dict) else {}
    )
    if result.is_error:
        return str(data.get("code") or "error")
    return str(data.get("status") or "running") if still_running(result) else "succeeded"


def text_of(result: types.CallToolResult) -> str:
    """The text content of a tool result."""
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def summary(result: types.CallToolResult) -> dict[str, Any]:
    """What the model is told about a tool result (JSON in the ``tool`` message)."""
    return {
        "is_error": result.is_error,
        "effect_id": effect_id_of(result),
        "text": text_of(result),
        "structured": result.structured_content,
    }


class AgentLoop:
    """One agent run over an open broker session."""

    def __init__(
        self,
        session: ClientSession,
        provider: ModelProvider,
        *,
        run_id: str,
        policy: DeliveryPolicy | None = None,
        on_event: Callable[[str], None] | None = None,
        before_delivery: Callable[[ToolCall, str], None] | None = None,
        max_turns: int = 8,
    ) -> None:
        """``before_delivery(call, operation_key)`` runs once per side-effecting call,
        after its key is derived and before its first delivery (the demo arms its
        failpoint for that key there)."""
        self.session = session
        self.provider = provider
        self.run_id = run_id
        self.policy = policy or DeliveryPolicy()
        self.on_event = on_event or (lambda text: None)
        self.before_delivery = before_delivery or (lambda call, key: None)
        self.max_turns = max_turns
        self._proxy: set[str] = set()

    async def run(self, prompt: str) -> AgentRun:
        """Run the conversation that starts with ``prompt`` to a final answer (or
        ``max_turns`` model turns, after which ``final`` stays None)."""
        listed = (await self.session.list_tools()).tools
        self._proxy = {tool.name for tool in listed if is_proxy_tool(tool)}
        specs = tool_specs(listed)
        record = AgentRun(self.run_id, tools=[tool.name for tool in listed])
        record.conversation.append(Message("user", prompt))
        self.on_event(f"user: {prompt}")
        for _ in range(self.max_turns):
            turn = await self.provider.next_turn(record.conversation, specs)
            if not turn.tool_calls:
                record.final = turn.final or ""
                record.conversation.append(Message("assistant", record.final))
                self.on_event(f"model ({self.provider.name}): {record.final}")
                return record
            record.conversation.append(
                Message("assistant", turn.text, tool_calls=turn.tool_calls)
            )
            for call in turn.tool_calls:
                answer = await self._execute(call, record)
                record.conversation.append(
                    Message("tool", json.dumps(answer, default=str), tool_call_id=call.id)
                )
        self.on_event(f"stopped after {self.max_turns} model turns without an answer")
        return record

    async def _execute(self, call: ToolCall, record: AgentRun) -> dict[str, Any]:
        arguments = dict(call.arguments)
        shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
        if call.name not in self._proxy:
            # A read (or an unknown name, which the server refuses): sent once.
            self.on_event(f"model -> {call.name}({shown})")
            return summary(await self.session.call_tool(call.name, arguments))
        if arguments.pop(KEY_FIELD, None) is not None:
            self.on_event("the model's own operation_key was dropped: the loop owns keys")
        key = agent_key(self.run_id, call.id)
        arguments[KEY_FIELD] = key
        self.on_event(f"model -> {call.name}({shown})")
        copies = self.policy.copies
        self.on_event(
            f"operation_key {key} (agent_key(run id, tool-call id {call.id!r}))"
        )
        self.before_delivery(call, key)
        if copies > 1:
            self.on_event(
                f"the transport delivers this call {copies} times at once "
                "(at-least-once redelivery), each with the same operation key"
            )
        results: list[types.CallToolResult | None] = [None] * copies

        async def deliver(copy: int) -> None:
            results[copy - 1] = await self._deliver(call, key, arguments, copy, record)

        async with anyio.create_task_group() as group:
            for copy in range(1, copies + 1):
                group.start_soon(deliver, copy)
        first = results[0]
        assert first is not None  # every task above set its slot before the group ended
        return summary(first)

    async def _deliver(
        self,
        call: ToolCall,
        key: str,
        arguments: dict[str, Any],
        copy: int,
        record: AgentRun,
    ) -> types.CallToolResult:
        """One delivered copy: ask, and while the broker says "still running" ask
        again with the same key and arguments, up to ``settle_timeout``."""
        deadline = time.monotonic() + self.policy.settle_timeout
        asks = 0
        label = f"delivery {copy}/{self.policy.copies}"
        while True:
            asks += 1
            result = await self.session.call_tool(call.name, arguments)
            effect_id = effect_id_of(result)
            if not still_running(result) or time.monotonic() >= deadline:
                break
            self.on_event(
                f"{label}: effect {effect_id} still {status_of(result)}; asking again "
                "with the same operation key"
            )
            await anyio.sleep(self.policy.ask_again_after)
        outcome = status_of(result)
        if result.is_error:
            outcome = f"error [{outcome}]"
        elif still_running(result):
            outcome = f"still {outcome} after {self.policy.settle_timeout:g}s"
        self.on_event(f"{label}: {outcome}, effect {effect_id} ({asks} ask(s))")
        record.deliveries.append(
            Delivery(
                call_id=call.id,
                tool=call.name,
                copy=copy,
                operation_key=key,
                asks=asks,
                effect_id=effect_id,
                status=outcome,
                is_error=result.is_error,
            )
        )
        return result
