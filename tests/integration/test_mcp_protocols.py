"""The MCP server under every protocol revision the installed ``mcp`` SDK negotiates,
the proxy tools' annotations, where an operation key may come from, and a caller's
``traceparent`` in ``_meta`` continuing through submit and dispatch (issue 21).

Real client sessions of the SDK's own ``Client``, in process (the transports have
their own tests: test_mcp_stdio.py, test_mcp_http.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp.client.session as client_session
import mcp.shared._otel as mcp_otel
import mcp.types as types
import pytest
from mcp import Client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from effect_broker.mcp.server import McpSettings, build_server
from effect_broker.models import EffectIntent
from effect_broker.services.dispatch import dispatch
from tests.integration.mcp_support import World, charge, open_world
from tests.span_recording import recording_spans

pytestmark = pytest.mark.django_db(transaction=True)

#: Every revision the installed SDK negotiates (README "MCP server" lists them).
REVISIONS = (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS)
PROXY_ANNOTATIONS = {
    "readOnlyHint": False,
    "destructiveHint": True,
    "idempotentHint": True,
    "openWorldHint": True,
}
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with open_world(tmp_path) as opened:
        yield opened


def in_session(
    world: World,
    body: Callable[[Client], Awaitable[Any]],
    revision: str = MODERN_PROTOCOL_VERSIONS[-1],
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> Any:
    """Run ``body`` in a client session that negotiated ``revision``."""
    server = build_server(lambda ctx: world.tenant, McpSettings(wait_seconds=0.1))
    if revision in HANDSHAKE_PROTOCOL_VERSIONS:
        # The SDK's client asks for its latest handshake revision; an older client
        # asks for its own, which this stands in for.
        assert monkeypatch is not None
        monkeypatch.setattr(client_session, "LATEST_HANDSHAKE_VERSION", revision)
        mode = "legacy"
    else:
        mode = revision

    async def main() -> Any:
        async with Client(server, mode=mode) as client:
            assert client.protocol_version == revision
            return await body(client)

    return anyio.run(main)


@pytest.mark.parametrize("revision", REVISIONS)
def test_every_revision_lists_proxy_tools_as_idempotent_and_replays_by_key(
    world: World, monkeypatch: pytest.MonkeyPatch, revision: str
) -> None:
    async def body(client: Client) -> tuple[dict[str, Any], list[Any]]:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        calls = [
            await client.call_tool("charge_idempotent", charge(f"k:{revision}"))
            for _ in range(2)
        ]
        return listed, calls

    listed, calls = in_session(world, body, revision, monkeypatch)
    for name in ("charge_unsafe", "charge_idempotent"):
        annotations = listed[name].annotations
        assert annotations is not None
        assert annotations.model_dump(by_alias=True, exclude_none=True) == (
            PROXY_ANNOTATIONS
        )
    first, again = (call.structured_content or {} for call in calls)
    assert first["effect_id"] == again["effect_id"]
    assert world.intents() == 1


def test_the_operation_key_comes_only_from_the_tool_arguments(world: World) -> None:
    # Given calls whose request ids and _meta differ or carry key-like values
    meta: Any = {"operation_key": "from-meta", "idempotency_key": "from-meta"}

    async def body(client: Client) -> list[types.CallToolResult]:
        no_key = {"order": "42", "amount_minor": 1999}
        return [
            # No key in the arguments: refused, whatever the request id or _meta
            await client.call_tool("charge_idempotent", no_key, meta=meta),
            # The same key in the arguments under another request id: one effect
            await client.call_tool("charge_idempotent", charge("run:1:step:1")),
        ]

    refused, first = in_session(world, body)
    again = in_session(
        world, lambda c: c.call_tool("charge_idempotent", charge("run:1:step:1"))
    )
    assert refused.is_error
    assert (refused.structured_content or {})["code"] == "invalid_arguments"
    assert (refused.structured_content or {})["details"]["fields"] == ["operation_key"]
    # A second session (another session id, request id 1 again) replays it
    assert (first.structured_content or {})["effect_id"] == (
        (again.structured_content or {})["effect_id"]
    )
    keys = list(EffectIntent.objects.values_list("operation_key", flat=True))
    assert keys == ["run:1:step:1"]


def test_a_traceparent_in_meta_continues_through_submit_and_dispatch(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the SDK's MCP spans and the broker's recorded in memory
    mcp_exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(mcp_exporter))
    monkeypatch.setattr(mcp_otel, "_tracer", provider.get_tracer("mcp-python-sdk"))
    meta: Any = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    with recording_spans() as broker_spans:
        # When a caller in a trace calls a proxy tool
        result = in_session(
            world,
            lambda c: c.call_tool("charge_idempotent", charge("traced:1"), meta=meta),
        )
        effect_id = (result.structured_content or {})["effect_id"]
        # ... and a worker dispatches the effect later, from the ledger alone
        assert dispatch(effect_id, worker="w1").status.value == "succeeded"
    provider.shutdown()
    # Then the MCP server span follows the MCP conventions, as the caller's child
    (served,) = [
        s for s in mcp_exporter.get_finished_spans() if s.name.startswith("tools/call")
    ]
    assert served.name == "tools/call charge_idempotent"
    assert served.kind is SpanKind.SERVER
    assert format(served.context.trace_id, "032x") == CALLER_TRACE
    assert served.parent is not None
    assert format(served.parent.span_id, "016x") == CALLER_SPAN
    assert served.attributes is not None
    assert served.attributes["mcp.method.name"] == "tools/call"
    assert served.attributes["gen_ai.tool.name"] == "charge_idempotent"
    # ... the submit is its child, and the dispatch the submit's, in the same trace
    finished = {s.name: s for s in broker_spans.get_finished_spans()}
    submitted = finished["effect_broker.submit"]
    executed = finished["execute_tool charge_idempotent"]
    assert submitted.parent is not None
    assert submitted.parent.span_id == served.context.span_id
    assert executed.parent is not None
    assert executed.parent.span_id == submitted.context.span_id
    assert {submitted.context.trace_id, executed.context.trace_id} == {
        served.context.trace_id
    }
    assert executed.attributes is not None
    assert executed.attributes["gen_ai.tool.call.id"] == effect_id
    assert "error.type" not in executed.attributes
