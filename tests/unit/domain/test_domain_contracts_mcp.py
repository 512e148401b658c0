"""``[contract.mcp]``: a tool's MCP face (issue 10, item 3), parsed and refused early."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effect_broker.domain.contracts import load_contracts, parse_contracts
from effect_broker.domain.errors import ContractError

BASE = """
[[contract]]
name = "pay.charge"
version = "1"
tool = "charge_card"
safety = "unsafe"
description = "Charge a card"
"""


def test_inline_schema_is_parsed_with_defaults() -> None:
    registry = parse_contracts(
        BASE
        + """[contract.mcp]
[contract.mcp.input_schema]
type = "object"
required = ["amount"]
properties.amount.type = "integer"
"""
    )
    face = registry.for_tool("charge_card").mcp
    assert face is not None
    assert face.expose is True
    assert face.description == ""
    assert face.input_schema == {
        "type": "object",
        "required": ["amount"],
        "properties": {"amount": {"type": "integer"}},
    }


def test_an_output_schema_is_optional_and_parsed() -> None:
    face = (
        parse_contracts(
            BASE
            + """[contract.mcp]
input_schema = { type = "object" }
[contract.mcp.output_schema]
type = "object"
required = ["charge_id"]
"""
        )
        .for_tool("charge_card")
        .mcp
    )
    assert face is not None
    assert face.output_schema == {"type": "object", "required": ["charge_id"]}
    bare = parse_contracts(BASE + '[contract.mcp]\ninput_schema = { type = "object" }\n')
    assert bare.for_tool("charge_card").mcp.output_schema is None  # type: ignore[union-attr]


def test_a_contract_without_the_table_has_no_face() -> None:
    assert parse_contracts(BASE).for_tool("charge_card").mcp is None


def test_schema_file_is_read_relative_to_the_contracts_file(tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    schema = {"type": "object", "properties": {"to": {"type": "string"}}}
    (tmp_path / "schemas" / "charge.json").write_text(json.dumps(schema))
    path = tmp_path / "contracts.toml"
    path.write_text(
        BASE
        + "[contract.mcp]\nexpose = false\n"
        + 'input_schema_file = "schemas/charge.json"\n'
    )
    face = load_contracts(path).for_tool("charge_card").mcp
    assert face is not None
    assert face.expose is False
    assert face.input_schema == schema


@pytest.mark.parametrize(
    ("table", "field", "reason"),
    [
        (
            'exposed = true\ninput_schema = { type = "object" }',
            "mcp.exposed",
            "unknown key",
        ),
        ('expose = "yes"\ninput_schema = { type = "object" }', "mcp.expose", "true or"),
        ("expose = true", "mcp.input_schema", "exactly one"),
        ('input_schema = { type = "string" }', "mcp.input_schema", 'type = "object"'),
        (
            'input_schema = { type = "object", properties = { amount = { type = 5 } } }',
            "mcp.input_schema",
            "not a valid JSON Schema",
        ),
        (
            'input_schema = { type = "object", properties = { operation_key = {} } }',
            "mcp.input_schema",
            "must not declare operation_key",
        ),
        ('input_schema_file = "missing.json"', "mcp.input_schema_file", "cannot read"),
        (
            'input_schema = { type = "object" }\noutput_schema = { type = "array" }',
            "mcp.output_schema",
            'type = "object"',
        ),
        (
            'input_schema = { type = "object" }\n'
            'output_schema = { type = "object", required = "id" }',
            "mcp.output_schema",
            "not a valid JSON Schema",
        ),
    ],
)
def test_a_bad_face_is_refused_naming_the_field(
    table: str, field: str, reason: str
) -> None:
    with pytest.raises(ContractError) as raised:
        parse_contracts(BASE + "[contract.mcp]\n" + table + "\n", source="c.toml")
    assert raised.value.details["field"] == field
    assert reason in str(raised.value)
