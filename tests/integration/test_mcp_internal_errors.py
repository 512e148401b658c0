"""An unexpected failure inside an MCP tool call reaches the agent as a plain
``internal_error`` with the advice to call again under the same key, never as a
traceback or an internal message (issue 12, item 1: no 5xx-like leak on any surface).

A real MCP client session, in process over memory streams, against the real server.
"""

from __future__ import annotations

from typing import Any

import mcp.types as types
import pytest

from effect_broker.mcp import server as mcp_server
from effect_broker.services.tenants import create_tenant
from tests.integration.mcp_support import call_in_memory

pytestmark = pytest.mark.django_db(transaction=True)

LEAK = 'relation "effect_intents" violates ... card 4111111111111111'


def test_an_unexpected_error_is_internal_error_without_its_message(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = create_tenant("mcp-internal")[0]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(LEAK)

    monkeypatch.setattr(mcp_server, "_call", broken)
    result = call_in_memory(
        tenant, "get_effect", {"effect_id": "00000000-0000-0000-0000-000000000000"}
    )
    assert result.is_error
    text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
    assert "internal_error" in text
    assert "same operation_key" in text
    assert LEAK not in text
    assert "Traceback" not in text
    assert LEAK not in str(result.structured_content)
    assert LEAK in caplog.text  # the operator's log keeps the detail
