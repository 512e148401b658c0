"""An upstream MCP server on the official SDK's high-level server (``MCPServer``, once
``FastMCP``) whose charge tool can raise AFTER it charged (issue 19, item 1).

The SDK's server turns every exception a tool raises into an ``isError`` result with
no code, so the broker sees the same answer whether the tool refused or charged and
then failed (a timeout on a follow-up call, a failed receipt write). Charges are lines
in ``$CHARGES_FILE``, the target's own truth. Tools:

* ``charge`` - charges once per ``idempotency_key`` when one is given (the same key
  returns the charge already made); an ``amount_minor`` below 1 is refused before
  charging with ``{"error": "invalid_amount"}``. When ``$RAISE_NEXT_FILE`` exists it
  is removed and the tool raises right after the charge line is written.
* ``lookup_charge`` - ``{"found": true, "id": ...}`` for a ``reference`` charged under
  that key, else ``{"found": false}``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp.server.mcpserver import MCPServer

server = MCPServer("raising-payments")


def _charges() -> list[dict[str, Any]]:
    path = Path(os.environ["CHARGES_FILE"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _answer(document: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(document))],
        structured_content=document,
        is_error=is_error,
    )


@server.tool()
def charge(
    order: str, amount_minor: int, idempotency_key: str | None = None
) -> types.CallToolResult:
    """Charge ``amount_minor`` for ``order`` (once per ``idempotency_key``)."""
    if amount_minor < 1:
        # Documented: refused before charging.
        return _answer({"error": "invalid_amount"}, is_error=True)
    if idempotency_key is not None:
        for row in _charges():
            if row["key"] == idempotency_key:
                return _answer({"id": row["id"], "order": row["order"]})
    row = {
        "id": f"ch_{len(_charges()) + 1}",
        "key": idempotency_key,
        "order": order,
        "amount_minor": amount_minor,
    }
    with open(os.environ["CHARGES_FILE"], "a", encoding="utf-8") as charges:
        charges.write(json.dumps(row) + "\n")
    raise_next = Path(os.environ["RAISE_NEXT_FILE"])
    if raise_next.exists():
        raise_next.unlink()
        # Charged, then failed: what the SDK answers is indistinguishable from a
        # refusal (isError, no code).
        raise TimeoutError("the receipt service did not answer")
    return _answer({"id": row["id"], "order": order})


@server.tool()
def lookup_charge(reference: str) -> dict[str, Any]:
    """The charge made under ``reference``, if any."""
    for row in _charges():
        if row["key"] == reference:
            return {"found": True, "id": row["id"]}
    return {"found": False}


if __name__ == "__main__":
    server.run("stdio")
