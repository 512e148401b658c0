"""The contracts file's JSON Schema, from the one definition of its fields (issue 20).

Editors check ``contracts.toml`` against ``examples/contracts.schema.json`` through its
``#:schema`` line. The schema must come from the same table the parser takes its keys
from, accept every shipped contracts file, and refuse what the parser refuses by shape.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from effect_broker.domain import contract_fields
from effect_broker.domain.contracts import parse_contracts
from effect_broker.domain.errors import ContractError

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "examples" / "contracts.schema.json"
FILES = sorted(ROOT.joinpath("examples").rglob("contracts.toml"))
VALID = """
[[contract]]
name = "pay.charge"
version = "1"
safety = "unsafe"
"""


def errors_of(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(contract_fields.json_schema())
    return [error.message for error in validator.iter_errors(document)]


def test_the_shipped_schema_is_the_generated_one() -> None:
    # `effect-broker contracts schema > examples/contracts.schema.json` regenerates it
    assert SHIPPED.read_text(encoding="utf-8") == contract_fields.schema_text()


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(contract_fields.json_schema())


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_contracts_file_names_the_schema_and_passes_it(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#:schema "), "editors find the schema by this first line"
    named = (path.parent / text.split()[1]).resolve()
    assert named == SHIPPED
    assert errors_of(tomllib.loads(text)) == []


def test_the_schema_and_the_parser_know_the_same_keys() -> None:
    contract = contract_fields.json_schema()["properties"]["contract"]["items"]
    assert tuple(contract["properties"]) == contract_fields.names(
        contract_fields.CONTRACT
    )
    upstream = contract["properties"]["upstream"]["properties"]
    assert tuple(upstream) == contract_fields.names(contract_fields.UPSTREAM)
    # and a key the parser does not know is refused by both
    with pytest.raises(ContractError, match="unknown key"):
        parse_contracts(VALID + "retry_limt = 3\n", source="t.toml")
    assert any(
        "retry_limt" in e for e in errors_of(tomllib.loads(VALID + "retry_limt = 3\n"))
    )


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('safety = "maybe"', "is not one of"),
        ('key_retention = "24 hours"', "does not match"),
        ("retry_limit = -1", "less than the minimum"),
        ('preview_fields = "amount"', "is not of type 'array'"),
    ],
)
def test_the_schema_refuses_a_bad_value_as_the_parser_does(line: str, why: str) -> None:
    key = line.split(" =")[0]
    text = VALID.replace('safety = "unsafe"\n', "") + (
        line + "\n" if key == "safety" else 'safety = "unsafe"\n' + line + "\n"
    )
    assert any(why in e for e in errors_of(tomllib.loads(text))), errors_of(
        tomllib.loads(text)
    )
    with pytest.raises(ContractError):
        parse_contracts(text, source="t.toml")


def test_a_missing_required_field_is_refused() -> None:
    document = {"contract": [{"name": "x", "version": "1"}]}
    assert errors_of(document) == ["'safety' is a required property"]


def test_the_schema_describes_every_field() -> None:
    for fields in (
        contract_fields.CONTRACT,
        contract_fields.MCP,
        contract_fields.UPSTREAM,
    ):
        for item in fields:
            assert item.schema()["description"].strip(), item.name
    assert json.loads(contract_fields.schema_text()) == contract_fields.json_schema()
