"""Issue 22, item 6: "the default-class sentence made true".

The README said ``unsafe`` was the default class of an upstream tool while a contract
without ``safety`` was refused. Decided: no class is assumed - what a target can prove
is a claim someone writes down on purpose (as ``read_only`` for a pass-through) - so
the refusal stays and the docs say so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from effect_broker.domain.contracts import parse_contracts
from effect_broker.domain.errors import ContractError

ROOT = Path(__file__).resolve().parents[3]
#: Where the sentence lives now (the README's reference moved to docs/).
PAGES = (ROOT / "README.md", ROOT / "docs" / "how-to" / "mcp-upstream.md")
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


def test_the_docs_claim_no_default_class() -> None:
    text = "\n".join(page.read_text(encoding="utf-8") for page in PAGES)
    assert not re.search(r"default class", text)
    row = next(line for line in text.splitlines() if line.startswith("| nothing |"))
    assert '"safety: is required"' in row
    assert "no class is assumed" in row
