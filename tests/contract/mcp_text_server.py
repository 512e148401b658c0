"""An upstream MCP server that answers in text, as common servers do (issue 22, item 2).

Most MCP servers in the wild answer a text block, not structured content, and report
every failure by raising ``ToolError`` (the official SDK's server turns that into
``isError`` with the text "Error executing tool NAME: <message>"). Its key is a
*name*: creating a record under a name that exists answers "already exists" - the
only proof the earlier attempt took effect.
Records live in the SQLite file ``$RECORDS_DB`` (the upstream's own store; a UNIQUE
name, so two creates of one name can never both commit). Tools:

* ``create_record(name, order, amount_minor)`` - text ``Created record NAME (id
  rec_N).``; a name that exists raises ``record 'NAME' already exists``.
* ``create_record_json(...)`` - the same, answered as JSON printed into a text block
  (``{"status": "created", "id": "rec_N"}``), the other common shape.
* ``find_record(name)`` - text ``Record NAME: id rec_N, order O, amount A``, or
  raises ``no record named 'NAME'``.

Run: ``RECORDS_DB=/path/records.db python -m tests.contract.mcp_text_server``
(``STARTS_FILE``, if set, gets the process id of every start).
"""

from __future__ import annotations

import json
import os
import sqlite3

import mcp.types as types
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("text-records")


def _db() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["RECORDS_DB"], timeout=10, isolation_level=None)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS records (n INTEGER PRIMARY KEY AUTOINCREMENT, "
        "name TEXT NOT NULL UNIQUE, body TEXT NOT NULL)"
    )
    return conn


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def _create(name: str, order: str, amount_minor: int) -> str:
    conn = _db()
    try:
        cursor = conn.execute(
            "INSERT INTO records (name, body) VALUES (?, ?)",
            [name, json.dumps({"order": order, "amount_minor": amount_minor})],
        )
    except sqlite3.IntegrityError:
        raise ToolError(f"record '{name}' already exists") from None
    finally:
        conn.close()
    return f"rec_{cursor.lastrowid}"


@server.tool()
def create_record(name: str, order: str, amount_minor: int) -> types.CallToolResult:
    """Create a record under a unique name."""
    record_id = _create(name, order, amount_minor)
    return _text(f"Created record {name} (id {record_id}).")


@server.tool()
def create_record_json(name: str, order: str, amount_minor: int) -> types.CallToolResult:
    """Create a record; the answer is JSON printed as text."""
    record_id = _create(name, order, amount_minor)
    return _text(json.dumps({"status": "created", "id": record_id}))


@server.tool()
def find_record(name: str) -> types.CallToolResult:
    """Find a record by name."""
    conn = _db()
    try:
        row = conn.execute(
            "SELECT n, body FROM records WHERE name = ?", [name]
        ).fetchone()
    finally:
        conn.close()
    if row is None:
        raise ToolError(f"no record named '{name}'")
    body = json.loads(row[1])
    return _text(
        f"Record {name}: id rec_{row[0]}, order {body['order']}, "
        f"amount {body['amount_minor']}"
    )


if __name__ == "__main__":
    if os.environ.get("STARTS_FILE"):
        # One line per process start: what "one process per worker" is counted by.
        with open(os.environ["STARTS_FILE"], "a", encoding="utf-8") as starts:
            starts.write(f"{os.getpid()}\n")
    server.run("stdio")
