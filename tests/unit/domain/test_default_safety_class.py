"""Issue 22, item 6: "the default-class sentence made true".

The README said ``unsafe`` was the default class of an upstream tool while a contract
without ``safety`` was refused. Decided: no class is assumed - what a target can prove
is a claim someone writes down on purpose (as ``read_only`` for a pass-through) - so
the refusal stays and the README says so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from effect_broker.domain.contracts import parse_contracts
from effect_broker.domain.errors import ContractError

README = Path(__file__).resolve().parents[3] / "README.md"
UPSTREAM_WITHOUT_SAFETY = """
[[contract]]
name = "upstream.charge"
version = "1"
adapter = "mcp"
[contract.upstream]
command = "python"
tool = "charge"
"""


def test_an_upstream_contract_without_safety_is_refused() -> None:
    with pytest.raises(ContractError) as caught:
        parse_contracts(UPSTREAM_WITHOUT_SAFETY, source="contracts.toml")
    assert str(caught.value) == (
        "contracts.toml: contract 'upstream.charge' v1: field 'safety': is required"
    )


def test_the_readme_claims_no_default_class() -> None:
    text = README.read_text(encoding="utf-8")
    assert not re.search(r"default class", text)
    row = next(line for line in text.splitlines() if line.startswith("| nothing |"))
    assert '"safety: is required"' in row
    assert "no class is assumed" in row
