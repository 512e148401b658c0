"""Reading an upstream MCP tool's answer (issue 22, item 2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp.types as types
from pydantic import ValidationError

from effect_broker.domain.upstream import McpUpstream


def external_id_of_rpc(message: Mapping[str, Any], upstream: McpUpstream) -> str | None:
    """The external id in a JSON-RPC ``tools/call`` answer, read as the adapter reads
    it (None for an error, or an answer that names none)."""
    from effect_broker.adapters.mcp_adapter import json_path, result_document

    try:
        result = types.CallToolResult.model_validate(message.get("result"))
    except ValidationError:
        return None
    if result.is_error:
        return None
    document = result_document(result)
    if document is None:
        return None
    value = json_path(document, upstream.external_id_field)
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return str(value)
