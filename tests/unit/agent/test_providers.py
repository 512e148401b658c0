"""The demo agent's model side, offline: the scripted model's steps, the tool and
message formats of the Chat Completions API, and the OpenAI and Grok providers on the
real ``openai`` SDK with its HTTP answered locally (issue 10, item 7)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest

from examples.agent.loop import is_proxy_tool, model_schema, tool_specs
from examples.agent.providers import (
    XAI_BASE_URL,
    GrokProvider,
    Message,
    OpenAIProvider,
    ScriptedProvider,
    ToolCall,
    ToolSpec,
    openai_messages,
    openai_tools,
)

CHARGE_SCHEMA = {
    "type": "object",
    "required": ["operation_key", "order"],
    "additionalProperties": False,
    "properties": {
        "operation_key": {"type": "string", "minLength": 1},
        "order": {"type": "string"},
    },
}
TOOLS = [
    ToolSpec("charge_order", "Charge an order", model_schema(CHARGE_SCHEMA)),
    ToolSpec("get_receipt", "Read a receipt", {"type": "object"}),
]


def turn(provider: Any, conversation: list[Message]) -> Any:
    return anyio.run(provider.next_turn, conversation, TOOLS)


def test_a_model_is_shown_proxy_tools_without_the_operation_key() -> None:
    listed = [
        types.Tool(name="charge_order", input_schema=CHARGE_SCHEMA),
        types.Tool(
            name="get_receipt",
            input_schema={"type": "object", "required": ["effect_id"]},
        ),
    ]
    assert [is_proxy_tool(t) for t in listed] == [True, False]
    shown = tool_specs(listed)[0].parameters
    assert shown["properties"] == {"order": {"type": "string"}}
    assert shown["required"] == ["order"]
    assert shown["additionalProperties"] is False
    # the server's schema itself is left as it was
    assert "operation_key" in CHARGE_SCHEMA["properties"]


def test_the_scripted_model_charges_then_reads_the_receipt_then_answers() -> None:
    provider = ScriptedProvider()
    asked = [Message("user", "charge order 42")]

    first = turn(provider, asked)
    assert first.tool_calls == (
        ToolCall(
            "call-1",
            "charge_order",
            {"order": "42", "amount_minor": 1999, "currency": "EUR"},
        ),
    )
    charged = {"is_error": False, "effect_id": "ef_1", "text": "{}", "structured": {}}
    asked += [
        Message("assistant", tool_calls=first.tool_calls),
        Message("tool", json.dumps(charged), tool_call_id="call-1"),
    ]
    second = turn(provider, asked)
    assert second.tool_calls == (
        ToolCall("call-2", "get_receipt", {"effect_id": "ef_1"}),
    )
    receipt = {"receipt_id": "rc_1", "result": {"id": "ch_1"}}
    asked += [
        Message("assistant", tool_calls=second.tool_calls),
        Message("tool", json.dumps({"structured": receipt}), tool_call_id="call-2"),
    ]
    third = turn(provider, asked)
    assert third.tool_calls == ()
    assert third.final == (
        "Order 42 is charged (EUR 19.99): target charge ch_1, receipt rc_1 of "
        "effect ef_1."
    )


def test_the_scripted_model_reports_an_error_and_does_not_call_again() -> None:
    unknown = {"is_error": True, "effect_id": "ef_1", "text": "[outcome_unknown] ..."}
    conversation = [
        Message("user", "charge order 42"),
        Message("assistant", tool_calls=(ToolCall("call-1", "charge_order", {}),)),
        Message("tool", json.dumps(unknown), tool_call_id="call-1"),
    ]
    answer = turn(ScriptedProvider(), conversation)
    assert answer.tool_calls == ()
    assert answer.final == "Order 42 was not confirmed: [outcome_unknown] ..."


@pytest.mark.parametrize(
    ("prompt", "final"),
    [
        ("refund order 42", 'I only know how to "charge order <id>".'),
        ("charge order 7", "Order 7 is not in my order book."),
    ],
)
def test_the_scripted_model_refuses_what_it_was_not_scripted_for(
    prompt: str, final: str
) -> None:
    answer = turn(ScriptedProvider(), [Message("user", prompt)])
    assert (answer.tool_calls, answer.final) == ((), final)


def test_tools_and_messages_take_the_chat_completions_shapes() -> None:
    assert openai_tools(TOOLS[:1]) == [
        {
            "type": "function",
            "function": {
                "name": "charge_order",
                "description": "Charge an order",
                "parameters": model_schema(CHARGE_SCHEMA),
            },
        }
    ]
    messages = openai_messages(
        [
            Message("user", "charge order 42"),
            Message("assistant", tool_calls=(ToolCall("c1", "charge_order", {"a": 1}),)),
            Message("tool", '{"ok": true}', tool_call_id="c1"),
        ]
    )
    assert messages[0]["role"] == "system"
    assert messages[1:] == [
        {"role": "user", "content": "charge order 42"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "charge_order", "arguments": '{"a": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'},
    ]


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
    }


class Answering:
    """The model's HTTP side, answered locally; it records every request."""

    def __init__(self, message: dict[str, Any]) -> None:
        self.message = message
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        return httpx2.Response(200, json=completion(self.message))

    def client(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(transport=httpx2.MockTransport(self))


@pytest.mark.parametrize(
    ("provider_class", "url", "variable"),
    [
        (OpenAIProvider, "https://api.openai.com/v1/chat/completions", "OPENAI_API_KEY"),
        (GrokProvider, f"{XAI_BASE_URL}/chat/completions", "XAI_API_KEY"),
    ],
)
def test_a_provider_sends_the_tools_and_returns_the_models_tool_calls(
    provider_class: type[OpenAIProvider],
    url: str,
    variable: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv(variable, "sk-test")
    model = Answering(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "charge_order", "arguments": '{"order": "42"}'},
                },
                {
                    "id": "call_bad",
                    "type": "function",
                    "function": {"name": "charge_order", "arguments": "{not json"},
                },
            ],
        }
    )
    provider = provider_class(model="test-model", http_client=model.client())

    answer = turn(provider, [Message("user", "charge order 42")])

    # The model's own call ids come back (the loop builds keys from them); text that
    # is not JSON is passed on for the server's schema check to refuse
    assert answer.tool_calls == (
        ToolCall("call_abc", "charge_order", {"order": "42"}),
        ToolCall("call_bad", "charge_order", {"_unparsed": "{not json"}),
    )
    (request,) = model.requests
    assert str(request.url) == url
    assert request.headers["authorization"] == "Bearer sk-test"
    body = json.loads(request.content)
    assert body["model"] == "test-model"
    assert body["tools"] == openai_tools(TOOLS)
    assert body["messages"][-1] == {"role": "user", "content": "charge order 42"}


def test_a_provider_returns_the_models_text_as_the_final_answer() -> None:
    model = Answering({"role": "assistant", "content": "Done."})
    provider = OpenAIProvider(api_key="sk-test", http_client=model.client())
    answer = turn(provider, [Message("user", "hello")])
    assert (answer.tool_calls, answer.final) == ((), "Done.")


@pytest.mark.parametrize(
    ("provider_class", "variable"),
    [(OpenAIProvider, "OPENAI_API_KEY"), (GrokProvider, "XAI_API_KEY")],
)
def test_a_provider_without_a_key_says_which_variable_to_set(
    provider_class: type[OpenAIProvider], variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ValueError, match=f"set {variable} to an API key"):
        provider_class()


def test_the_model_is_configurable_by_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XAI_MODEL", "grok-other")
    assert GrokProvider(api_key="k").model == "grok-other"
    assert GrokProvider(api_key="k", model="explicit").model == "explicit"
