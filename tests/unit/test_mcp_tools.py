"""The MCP tool list and argument checks, without a database (issue 10, item 3)."""

from __future__ import annotations

import jsonschema
import pytest

from effect_broker.domain.contracts import parse_contracts
from effect_broker.mcp.output_schemas import RUNNING
from effect_broker.mcp.server import _schema_problems
from effect_broker.mcp.tools import MANAGEMENT_NAMES, list_tools, proxy_input_schema

FACE = """
[contract.mcp]
[contract.mcp.input_schema]
type = "object"
required = ["items"]
properties.items = { type = "array", items = { type = "object", required = ["sku"] } }
"""


def _registry(safety: str, extra: str = "") -> str:
    return (
        f'[[contract]]\nname = "c.{safety}"\nversion = "1"\ntool = "t_{safety}"\n'
        f'safety = "{safety}"\n{extra}' + FACE
    )


@pytest.mark.parametrize(
    ("safety", "extra"),
    [
        ("unsafe", ""),
        ("idempotent", 'key_retention = "1h"\n'),
        ("reconcilable", 'settlement_bound = "2s"\n'),
        ("transactional", ""),
    ],
)
def test_proxy_annotations_are_the_same_for_every_safety_class(
    safety: str, extra: str
) -> None:
    tools = {t.name: t for t in list_tools(parse_contracts(_registry(safety, extra)))}
    tool = tools[f"t_{safety}"]
    assert set(tools) == MANAGEMENT_NAMES | {f"t_{safety}"}
    assert tool.annotations is not None
    # Issue 21: one effect per operation key, enforced by the broker for every class;
    # every target is outside the broker; destructive unless the contract says not.
    assert tool.annotations.model_dump(exclude_none=True) == {
        "read_only_hint": False,
        "destructive_hint": True,
        "idempotent_hint": True,
        "open_world_hint": True,
    }


def test_a_contract_can_say_its_tool_is_not_destructive() -> None:
    text = _registry("unsafe").replace(
        "[contract.mcp]\n", "[contract.mcp]\ndestructive = false\n"
    )
    tool = {t.name: t for t in list_tools(parse_contracts(text))}["t_unsafe"]
    assert tool.annotations is not None
    assert tool.annotations.destructive_hint is False
    assert tool.annotations.idempotent_hint is True


def test_schema_problems_name_nested_and_missing_fields() -> None:
    contract = parse_contracts(_registry("unsafe")).for_tool("t_unsafe")
    schema = proxy_input_schema(contract)
    problems = _schema_problems(schema, {"items": [{"sku": "a"}, {}, 3]})
    # Top-level problems first, then by path
    assert [p.split(":", 1)[0] for p in problems] == [
        "operation_key",
        "items.1",
        "items.2",
    ]
    assert _schema_problems(schema, {"operation_key": "k", "items": []}) == []


def test_a_paused_answer_fits_the_proxy_tools_output_schema() -> None:
    # Issue 24: an operator's pause holds the effect; the answer says why. A client
    # checks it against the listed outputSchema, declared output schema or not.
    paused = {
        "effect_id": "e",
        "status": "prepared",
        "done": False,
        "paused": {"reason": "incident", "since": "2026-12-05T08:00:00Z", "scope": "t"},
    }
    jsonschema.validate(paused, RUNNING)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**paused, "paused": {"reason": "incident"}}, RUNNING)
