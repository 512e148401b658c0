"""Model providers: given the conversation and the tools, the model's next step.

A provider answers with tool calls or with a final answer; it never sees an operation
key (``loop`` removes ``operation_key`` from every schema it shows a model and derives
the key itself), so no model can pick, vary or forget one. ``ScriptedProvider`` is
deterministic and needs no network; ``OpenAIProvider`` and ``GrokProvider`` use the
official ``openai`` client (``pip install 'effect-broker[demo-agent]'``), Grok through
xAI's OpenAI-compatible endpoint.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

#: Where xAI serves its OpenAI-compatible API (https://docs.x.ai/docs/api-reference).
XAI_BASE_URL = "https://api.x.ai/v1"
DEFAULT_OPENAI_MODEL = "gpt-4.1-mini"
DEFAULT_GROK_MODEL = "grok-3-mini"

SYSTEM_PROMPT = (
    "You are an operations agent. Use the tools to do what the user asks, then answer "
    "in one or two sentences. If a tool reports that nobody knows yet whether an "
    "action happened, say so plainly and give the effect id; never try the action "
    "another way."
)


@dataclass(frozen=True)
class ToolSpec:
    """A tool as a model sees it: name, description, JSON Schema of its arguments."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for; ``id`` is the model's own call id."""

    id: str
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class Message:
    """One entry of the conversation, in a provider-neutral form."""

    role: Literal["user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    #: For a ``tool`` message: the call it answers.
    tool_call_id: str | None = None


@dataclass(frozen=True)
class ModelTurn:
    """The model's next step: tool calls to run, or (when there are none) ``final``."""

    tool_calls: tuple[ToolCall, ...] = ()
    final: str | None = None
    text: str = ""


class ModelProvider(Protocol):
    """A model: given the conversation and the tool list, the next step."""

    name: str

    async def next_turn(
        self, conversation: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelTurn:
        """Tool calls to run next, or a final answer."""
        ...


# --- scripted ------------------------------------------------------------------------


@dataclass
class ScriptedProvider:
    """A deterministic model for "charge order <id>": it calls the charge tool once,
    reads the receipt of the effect it got back, and answers.

    Its tool-call ids are fixed (``call-1``, ``call-2``): the loop derives the
    operation key from the run id and the call id, so a rerun of the same run gives
    the same key, as a loop resuming from a stored model answer would.
    """

    charge_tool: str = "charge_order"
    #: The "order book" the script charges from: order id -> (amount_minor, currency).
    orders: Mapping[str, tuple[int, str]] = field(
        default_factory=lambda: {"42": (1999, "EUR")}
    )
    name: str = "scripted"

    async def next_turn(
        self, conversation: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelTurn:
        """The script's next step for the conversation so far."""
        asked = next((m.content for m in conversation if m.role == "user"), "")
        match = re.search(r"charge order (\S+)", asked, flags=re.IGNORECASE)
        if match is None:
            return ModelTurn(final='I only know how to "charge order <id>".')
        order = match.group(1)
        if order not in self.orders:
            return ModelTurn(final=f"Order {order} is not in my order book.")
        if self.charge_tool not in {t.name for t in tools}:
            return ModelTurn(final=f"No tool {self.charge_tool!r} is listed.")
        answers = {m.tool_call_id: m.content for m in conversation if m.role == "tool"}
        if "call-1" not in answers:
            amount, currency = self.orders[order]
            return ModelTurn(
                tool_calls=(
                    ToolCall(
                        "call-1",
                        self.charge_tool,
                        {"order": order, "amount_minor": amount, "currency": currency},
                    ),
                )
            )
        charged = json.loads(answers["call-1"])
        if charged.get("is_error"):
            # An unknown outcome is reported as unknown, never retried another way.
            return ModelTurn(final=f"Order {order} was not confirmed: {charged['text']}")
        effect_id = charged.get("effect_id")
        if "call-2" not in answers and effect_id:
            return ModelTurn(
                tool_calls=(ToolCall("call-2", "get_receipt", {"effect_id": effect_id}),)
            )
        receipt = json.loads(answers.get("call-2", "{}")).get("structured") or {}
        result = receipt.get("result") or charged.get("structured") or {}
        amount, currency = self.orders[order]
        return ModelTurn(
            final=(
                f"Order {order} is charged ({currency} {amount / 100:.2f}): target "
                f"charge {result.get('id')}, receipt {receipt.get('receipt_id')} of "
                f"effect {effect_id}."
            )
        )


# --- OpenAI-compatible -----------------------------------------------------------------


def openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The tools in the Chat Completions ``tools`` format."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": dict(tool.parameters),
            },
        }
        for tool in tools
    ]


def openai_messages(conversation: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages, system prompt first."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    for message in conversation:
        if message.role == "tool":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id,
                    "content": message.content,
                }
            )
        elif message.role == "assistant" and message.tool_calls:
            messages.append(
                {
                    "role": "assistant",
                    "content": message.content or None,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {
                                "name": call.name,
                                "arguments": json.dumps(dict(call.arguments)),
                            },
                        }
                        for call in message.tool_calls
                    ],
                }
            )
        else:
            messages.append({"role": message.role, "content": message.content})
    return messages


def _arguments(raw: str | None) -> dict[str, Any]:
    """A model's argument string as a dict. Unparseable text is passed on as it came
    (under ``_unparsed``), so the server's schema check refuses it and says why."""
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {"_unparsed": raw}
    return value if isinstance(value, dict) else {"_unparsed": raw}


class OpenAIProvider:
    """A model behind the Chat Completions API (OpenAI by default)."""

    name = "openai"
    key_variable = "OPENAI_API_KEY"
    model_variable = "OPENAI_MODEL"
    default_model = DEFAULT_OPENAI_MODEL
    base_url: str | None = None

    def __init__(
        self,
        *,
        model: str | None = None,
        api_key: str | None = None,
        client: Any = None,
        http_client: Any = None,
    ) -> None:
        """``client``: a ready ``AsyncOpenAI``; else one is made from the API key
        (argument or environment variable) and ``http_client`` (the SDK's own)."""
        self.model = model or os.environ.get(self.model_variable) or self.default_model
        if client is None:
            key = api_key or os.environ.get(self.key_variable, "")
            if not key:
                raise ValueError(f"{self.name}: set {self.key_variable} to an API key")
            try:
                from openai import AsyncOpenAI
            except ImportError as exc:
                raise ValueError(
                    f"{self.name}: needs the openai package: "
                    "pip install 'effect-broker[demo-agent]'"
                ) from exc
            # max_retries=0: the SDK's own resends are not ours to hide; a failed
            # model call fails the turn, and nothing about it reaches the broker.
            client = AsyncOpenAI(
                api_key=key,
                base_url=self.base_url,
                max_retries=0,
                http_client=http_client,
            )
        self.client = client

    async def next_turn(
        self, conversation: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelTurn:
        """One Chat Completions request; its tool calls or its text."""
        response = await self.client.chat.completions.create(
            model=self.model,
            messages=openai_messages(conversation),
            tools=openai_tools(tools),
        )
        message = response.choices[0].message
        calls = tuple(
            ToolCall(call.id, call.function.name, _arguments(call.function.arguments))
            for call in (message.tool_calls or [])
            if getattr(call, "function", None) is not None
        )
        if calls:
            return ModelTurn(tool_calls=calls, text=message.content or "")
        return ModelTurn(final=message.content or "")


class GrokProvider(OpenAIProvider):
    """xAI's Grok through its OpenAI-compatible base URL."""

    name = "grok"
    key_variable = "XAI_API_KEY"
    model_variable = "XAI_MODEL"
    default_model = DEFAULT_GROK_MODEL
    base_url = XAI_BASE_URL
