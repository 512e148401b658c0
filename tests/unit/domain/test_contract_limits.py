"""``max_in_flight`` and ``rate_limit`` in a contracts file (issue 24, item 7):
checked by the parser and so by ``contracts validate``, each problem naming the file,
the contract and the field."""

from __future__ import annotations

import pytest

from effect_broker.domain import contract_fields
from effect_broker.domain.contracts import check_contracts_text, parse_contracts
from effect_broker.domain.dispatch_limits import DispatchLimits

BASE = """[[contract]]
name = "payments.charge"
version = "1"
safety = "idempotent"
key_retention = "24h"
"""


def test_limits_are_read_and_a_rate_may_be_a_fraction() -> None:
    (contract,) = parse_contracts(BASE + "max_in_flight = 10\nrate_limit = 0.5\n")
    assert contract.limits == DispatchLimits(max_in_flight=10, rate_limit=0.5)
    assert contract.limits.limited


def test_without_limits_a_contract_is_unlimited() -> None:
    (contract,) = parse_contracts(BASE)
    assert contract.limits == DispatchLimits()
    assert not contract.limits.limited


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ("max_in_flight = 0", "max_in_flight", "must be an integer >= 1"),
        ("max_in_flight = 2.5", "max_in_flight", "must be an integer >= 1"),
        ("max_in_flight = true", "max_in_flight", "must be an integer >= 1"),
        ("rate_limit = 0", "rate_limit", "attempts per second > 0"),
        ("rate_limit = -1", "rate_limit", "attempts per second > 0"),
        ('rate_limit = "100/s"', "rate_limit", "attempts per second > 0"),
        ("rate_limit = inf", "rate_limit", "attempts per second > 0"),
        ("rate_limt = 5", "rate_limt", "did you mean 'rate_limit'?"),
    ],
)
def test_a_bad_limit_is_refused_with_file_contract_and_field(
    line: str, field: str, reason: str
) -> None:
    _, errors = check_contracts_text(BASE + line + "\n", source="contracts.toml")
    (error,) = errors
    text = str(error)
    assert text.startswith(
        f"contracts.toml: contract 'payments.charge' v1: field '{field}': "
    )
    assert reason in text


def test_a_transactional_contract_takes_no_limit() -> None:
    toml = """[[contract]]
name = "local.charge"
version = "1"
safety = "transactional"
adapter = "simulated-local"
max_in_flight = 4
"""
    _, errors = check_contracts_text(toml, source="c.toml")
    (error,) = errors
    assert "field 'max_in_flight': limits are for remote targets" in str(error)


def test_the_editors_schema_knows_the_limits() -> None:
    properties = contract_fields.json_schema()["properties"]["contract"]["items"][
        "properties"
    ]
    assert properties["max_in_flight"]["minimum"] == 1
    assert properties["rate_limit"]["exclusiveMinimum"] == 0
