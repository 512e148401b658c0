"""Issue 24, item 1: the approval fields of a contract - a small rule language,
validated strictly when the file is loaded - and what an approval is bound to."""

from __future__ import annotations

from datetime import timedelta

import pytest

from effect_broker.domain.approval import (
    MISSING,
    approval_binding,
    contract_fingerprint,
    resolve_pointer,
)
from effect_broker.domain.contracts import (
    EffectContract,
    check_contracts_text,
    parse_contracts,
)
from effect_broker.domain.errors import ContractError

BASE = """
[[contract]]
name = "payments.charge"
version = "1"
tool = "charge_card"
safety = "idempotent"
key_retention = "24h"
"""


def contract(extra: str = "") -> EffectContract:
    registry = parse_contracts(BASE + extra, source="contracts.toml")
    return registry.get("payments.charge", "1")


def test_required_waits_for_every_effect_for_an_hour_by_default() -> None:
    rule = contract('approval = "required"').approval
    assert rule is not None
    assert rule.always
    assert rule.ttl == timedelta(hours=1)
    assert rule.applies_to({})
    assert rule.applies_to({"amount_minor": 1})
    assert rule.describe() == "every effect"


def test_no_approval_fields_means_no_rule() -> None:
    assert contract().approval is None


@pytest.mark.parametrize(
    ("arguments", "waits"),
    [
        ({"amount_minor": 50000}, False),
        ({"amount_minor": 50000.5}, True),
        ({"amount_minor": 0}, False),
        ({"amount_minor": "60000"}, True),
        ({"amount_minor": None}, True),
        ({"amount_minor": True}, True),
        ({"amount_minor": {"value": 1}}, True),
        ({}, True),
    ],
)
def test_approval_when_asks_above_the_threshold_and_whenever_in_doubt(
    arguments: dict[str, object], waits: bool
) -> None:
    rule = contract(
        'approval_when = { pointer = "/amount_minor", above = 50000 }\n'
        'approval_ttl = "15m"'
    ).approval
    assert rule is not None
    assert rule.ttl == timedelta(minutes=15)
    assert rule.applies_to(arguments) is waits
    assert rule.describe() == "/amount_minor above 50000 (or not a number)"


def test_a_pointer_reaches_into_objects_and_lists_as_rfc_6901_says() -> None:
    document = {"order": {"lines": [{"a/b": 7, "m~n": 8}]}}
    assert resolve_pointer(document, "/order/lines/0/a~1b") == 7
    assert resolve_pointer(document, "/order/lines/0/m~0n") == 8
    for missing in ("/order/lines/1", "/order/lines/01", "/order/x", "/order/lines/-"):
        assert resolve_pointer(document, missing) is MISSING


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        (
            'approval = "required"\napproval_when = { pointer = "/a", above = 1 }',
            "approval",
            "not both",
        ),
        ('approval = "yes"', "approval", 'the only value is "required"'),
        ("approval = true", "approval", 'the only value is "required"'),
        ('approval_ttl = "1h"', "approval_ttl", "only with approval"),
        ('approval = "required"\napproval_ttl = "0s"', "approval_ttl", "positive"),
        ('approval = "required"\napproval_ttl = 60', "approval_ttl", "duration"),
        ('approval_when = "big"', "approval_when", "must be a table"),
        ('approval_when = { pointer = "/a" }', "approval_when.above", "is required"),
        ("approval_when = { above = 1 }", "approval_when.pointer", "is required"),
        (
            'approval_when = { pointer = "amount", above = 1 }',
            "approval_when.pointer",
            "JSON pointer",
        ),
        (
            'approval_when = { pointer = "/a~2", above = 1 }',
            "approval_when.pointer",
            "RFC 6901",
        ),
        (
            'approval_when = { pointer = "/a", above = "50000" }',
            "approval_when.above",
            "must be a number",
        ),
        (
            'approval_when = { pointer = "/a", above = true }',
            "approval_when.above",
            "must be a number",
        ),
        (
            'approval_when = { pointer = "/a", above = inf }',
            "approval_when.above",
            "finite",
        ),
        (
            'approval_when = { pointer = "/a", above = 1, below = 9 }',
            "approval_when.below",
            "unknown key",
        ),
    ],
)
def test_a_malformed_rule_is_refused_naming_the_field(
    fields: str, field: str, reason: str
) -> None:
    with pytest.raises(ContractError) as refused:
        parse_contracts(BASE + fields, source="contracts.toml")
    assert refused.value.details["field"] == field
    assert reason in str(refused.value)
    assert str(refused.value).startswith(
        "contracts.toml: contract 'payments.charge' v1: field"
    )
    # contracts validate reports it the same way
    _, problems = check_contracts_text(BASE + fields, source="contracts.toml")
    assert [p.details["field"] for p in problems] == [field]


def test_the_fingerprint_follows_what_is_sent_not_how_it_is_shown() -> None:
    terms = 'approval = "required"\n[contract.adapter_options]\nurl = "https://a/x"\n'
    base = contract_fingerprint(contract(terms))
    # Deactivating (a newer version deployed) or describing it changes nothing
    for same in ("active = false\n", 'description = "Charge"\n'):
        assert contract_fingerprint(contract(same + terms)) == base
    # Another target, retry budget or safety promise does
    moved = terms.replace("https://a/x", "https://b/x")
    assert contract_fingerprint(contract(moved)) != base
    retried = "retry_limit = 9\n" + terms
    assert contract_fingerprint(contract(retried)) != base


def test_the_binding_names_one_effect_one_payload_one_contract() -> None:
    pinned = contract('approval = "required"')
    binding = approval_binding("e1", b"hash-1", pinned)
    assert binding == approval_binding("e1", b"hash-1", pinned)
    assert binding != approval_binding("e2", b"hash-1", pinned)
    assert binding != approval_binding("e1", b"hash-2", pinned)
    edited = contract('approval = "required"\nretry_limit = 9')
    assert binding != approval_binding("e1", b"hash-1", edited)
