"""Versioned effect contracts from TOML: every rule names file, contract and field."""

from __future__ import annotations

import textwrap
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from effect_broker.domain.contracts import (
    ContractRegistry,
    EffectContract,
    load_contracts,
    parse_contracts,
    parse_duration,
)
from effect_broker.domain.errors import ContractError, UnknownContractError
from effect_broker.domain.states import SafetyClass

VALID = """\
[[contract]]
name = "payments.charge"
version = "1"
tool = "charge_card"
safety = "idempotent"
retry_limit = 5
key_retention = "24h"
backoff_initial = "1s"
backoff_max = "1m"
adapter = "http"
preview_fields = ["amount", "currency"]
active = true
description = "Charge a card"
[contract.adapter_options]
url = "http://127.0.0.1:8081/charges"
[contract.adapter_options.headers]
x-team = "payments"

[[contract]]
name = "tickets.lookup_create"
version = "3"
safety = "reconcilable"
settlement_bound = "30s"

[[contract]]
name = "email.send"
version = "1"
safety = "unsafe"
retry_limit = 0
active = false

[[contract]]
name = "email.send"
version = "2"
safety = "unsafe"
"""

MINIMAL = 'name = "p.x"\nversion = "1"\nsafety = "unsafe"\n'


def _parse(text: str) -> ContractRegistry:
    return parse_contracts(textwrap.dedent(text), source="contracts.toml")


def _one(body: str) -> str:
    return "[[contract]]\n" + textwrap.dedent(body)


def test_given_valid_file_then_every_field_is_loaded() -> None:
    registry = _parse(VALID)
    charge = registry.for_tool("charge_card")
    assert charge == EffectContract(
        name="payments.charge",
        version="1",
        tool="charge_card",
        safety=SafetyClass.IDEMPOTENT,
        retry_limit=5,
        key_retention=timedelta(hours=24),
        settlement_bound=None,
        backoff_initial=timedelta(seconds=1),
        backoff_max=timedelta(minutes=1),
        adapter="http",
        adapter_options={
            "url": "http://127.0.0.1:8081/charges",
            "headers": {"x-team": "payments"},
        },
        preview_fields=("amount", "currency"),
        active=True,
        description="Charge a card",
    )
    assert charge.safety is SafetyClass.IDEMPOTENT


def test_given_defaults_then_tool_is_name_and_policy_is_the_documented_default() -> None:
    contract = _parse(VALID).for_tool("tickets.lookup_create")
    assert contract.tool == "tickets.lookup_create"
    assert contract.retry_limit == 3
    assert contract.backoff_initial == timedelta(seconds=1)
    assert contract.backoff_max == timedelta(seconds=60)
    assert contract.adapter == "simulated"
    assert contract.adapter_options == {}
    assert contract.preview_fields == ()
    assert contract.active is True
    assert contract.description == ""
    assert contract.settlement_bound == timedelta(seconds=30)


def test_given_registry_then_lookups_iteration_and_tools_work() -> None:
    registry = _parse(VALID)
    assert len(registry) == 4
    assert [(c.name, c.version) for c in registry] == [
        ("payments.charge", "1"),
        ("tickets.lookup_create", "3"),
        ("email.send", "1"),
        ("email.send", "2"),
    ]
    assert registry.tools() == ["charge_card", "email.send", "tickets.lookup_create"]
    assert registry.for_tool("email.send").version == "2"


def test_given_pinned_inactive_version_then_get_still_finds_it() -> None:
    # Spec: the version is pinned at reservation; in-flight effects keep their policy.
    old = _parse(VALID).get("email.send", "1")
    assert old.active is False
    assert old.retry_limit == 0


def test_given_unknown_tool_then_unknown_contract() -> None:
    with pytest.raises(UnknownContractError) as caught:
        _parse(VALID).for_tool("wire_money")
    assert str(caught.value) == "no active contract for tool 'wire_money'"


def test_given_unknown_version_then_unknown_contract() -> None:
    with pytest.raises(UnknownContractError) as caught:
        _parse(VALID).get("email.send", "9")
    assert str(caught.value) == "unknown contract 'email.send' v9"


def test_given_file_on_disk_then_load_contracts_names_it(tmp_path: Path) -> None:
    path = tmp_path / "contracts.toml"
    path.write_text(VALID, encoding="utf-8")
    assert len(load_contracts(path)) == 4
    path.write_text(_one('name = "p.x"\nversion = "1"\nsafety = "idempotent"\n'))
    with pytest.raises(ContractError) as caught:
        load_contracts(str(path))
    assert str(caught.value) == (
        f"{path}: contract 'p.x' v1: field 'key_retention': "
        "required for safety class idempotent"
    )


def test_given_missing_file_then_contract_error_names_it(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ContractError) as caught:
        load_contracts(path)
    assert str(caught.value).startswith(f"{path}: cannot read contracts file: ")


def test_given_empty_file_then_registry_is_empty() -> None:
    assert len(_parse("")) == 0


RULES = [
    pytest.param(
        _one('version = "1"\nsafety = "unsafe"\n'),
        "contract #1: field 'name': is required",
        id="name required",
    ),
    pytest.param(
        _one('name = "p.x"\nsafety = "unsafe"\n'),
        "contract 'p.x': field 'version': is required",
        id="version required",
    ),
    pytest.param(
        _one('name = "p.x"\nversion = "1"\n'),
        "contract 'p.x' v1: field 'safety': is required",
        id="safety required",
    ),
    pytest.param(
        _one('name = ""\nversion = "1"\nsafety = "unsafe"\n'),
        "contract #1: field 'name': must be a non-empty string without surrounding "
        "whitespace",
        id="name empty",
    ),
    pytest.param(
        _one('name = "p.x"\nversion = 1\nsafety = "unsafe"\n'),
        "contract 'p.x': field 'version': must be a string (write version = \"1\")",
        id="version integer",
    ),
    pytest.param(
        _one('name = "p.x"\nversion = "1"\nsafety = "exactly_once"\n'),
        "contract 'p.x' v1: field 'safety': must be one of transactional, idempotent, "
        "reconcilable, unsafe, got 'exactly_once'",
        id="safety unknown",
    ),
    pytest.param(
        _one(MINIMAL + "retry_limit = -1\n"),
        "contract 'p.x' v1: field 'retry_limit': must be an integer >= 0",
        id="retry_limit negative",
    ),
    pytest.param(
        _one(MINIMAL + 'retry_limit = "3"\n'),
        "contract 'p.x' v1: field 'retry_limit': must be an integer >= 0",
        id="retry_limit string",
    ),
    pytest.param(
        _one(MINIMAL + "retry_limit = true\n"),
        "contract 'p.x' v1: field 'retry_limit': must be an integer >= 0",
        id="retry_limit bool",
    ),
    pytest.param(
        _one('name = "p.x"\nversion = "1"\nsafety = "idempotent"\n'),
        "contract 'p.x' v1: field 'key_retention': required for safety class idempotent",
        id="idempotent needs key_retention",
    ),
    pytest.param(
        _one('name = "p.x"\nversion = "1"\nsafety = "reconcilable"\n'),
        "contract 'p.x' v1: field 'settlement_bound': required for safety class "
        "reconcilable",
        id="reconcilable needs settlement_bound",
    ),
    pytest.param(
        _one(MINIMAL + "key_retention = 24\n"),
        "contract 'p.x' v1: field 'key_retention': expected a duration string such as "
        "'500ms', '30s', '5m', '24h' or '7d', got int",
        id="duration integer",
    ),
    pytest.param(
        _one(MINIMAL + 'settlement_bound = "30 sec"\n'),
        "contract 'p.x' v1: field 'settlement_bound': expected a duration string such "
        "as '500ms', '30s', '5m', '24h' or '7d', got '30 sec'",
        id="duration bad unit",
    ),
    pytest.param(
        _one(MINIMAL + 'backoff_initial = "0s"\n'),
        "contract 'p.x' v1: field 'backoff_initial': must be positive, got '0s'",
        id="duration zero",
    ),
    pytest.param(
        _one(MINIMAL + 'backoff_initial = "2m"\nbackoff_max = "1m"\n'),
        "contract 'p.x' v1: field 'backoff_initial': must not exceed backoff_max",
        id="backoff order",
    ),
    pytest.param(
        _one(MINIMAL + 'adapter_options = "url=http://x"\n'),
        "contract 'p.x' v1: field 'adapter_options': must be a table "
        "([contract.adapter_options])",
        id="adapter_options not a table",
    ),
    pytest.param(
        _one(MINIMAL + 'preview_fields = "amount"\n'),
        "contract 'p.x' v1: field 'preview_fields': must be a list of strings",
        id="preview_fields not a list",
    ),
    pytest.param(
        _one(MINIMAL + 'preview_fields = ["amount", 3]\n'),
        "contract 'p.x' v1: field 'preview_fields': must be a list of strings",
        id="preview_fields with int",
    ),
    pytest.param(
        _one(MINIMAL + 'active = "yes"\n'),
        "contract 'p.x' v1: field 'active': must be true or false",
        id="active not bool",
    ),
    pytest.param(
        _one(MINIMAL + 'adapter = ""\n'),
        "contract 'p.x' v1: field 'adapter': must be a non-empty string without "
        "surrounding whitespace",
        id="adapter empty",
    ),
    pytest.param(
        _one(MINIMAL + "retry_limt = 5\n"),
        "contract 'p.x' v1: field 'retry_limt': unknown key; did you mean "
        "'retry_limit'? (allowed: active, adapter, adapter_options, approval, "
        "approval_ttl, approval_when, attempt_timeout, backoff_initial, backoff_max, "
        "description, key_alphabet, key_retention, key_template, max_in_flight, mcp, "
        "name, preview_fields, rate_limit, retry_limit, safety, sandbox, secrets, "
        "settlement_bound, tenant_secrets, tool, unknown_alert_after, upstream, "
        "version)",
        id="unknown key",
    ),
    pytest.param(
        _one(MINIMAL + 'secrets = "env:STRIPE_KEY"\n'),
        "contract 'p.x' v1: field 'secrets': must be a list such as [\"env:STRIPE_KEY\"]",
        id="secrets not a list",
    ),
    pytest.param(
        _one(MINIMAL + 'secrets = ["STRIPE_KEY"]\n'),
        "contract 'p.x' v1: field 'secrets': 'STRIPE_KEY' is not a secret reference: "
        "write 'env:NAME' or 'file:NAME' (one file name, no path)",
        id="secrets entry without scheme",
    ),
    pytest.param(
        _one(MINIMAL + 'secrets = ["file:../other-tenant/key"]\n'),
        "contract 'p.x' v1: field 'secrets': 'file:../other-tenant/key' is not a "
        "secret reference: write 'env:NAME' or 'file:NAME' (one file name, no path)",
        id="secrets entry with a path",
    ),
    pytest.param(
        _one(MINIMAL + 'tenant_secrets = ["env:K"]\n'),
        "contract 'p.x' v1: field 'tenant_secrets': must be a table "
        "([contract.tenant_secrets]) of tenant name = [references]",
        id="tenant_secrets not a table",
    ),
    pytest.param(
        _one(MINIMAL + "tenant_secrets = { acme = [3] }\n"),
        "contract 'p.x' v1: field 'tenant_secrets.acme': 3 is not a secret reference: "
        "write 'env:NAME' or 'file:NAME' (one file name, no path)",
        id="tenant_secrets entry not text",
    ),
    pytest.param(
        _one(MINIMAL) + _one(MINIMAL),
        "contract 'p.x' v1: field 'version': duplicate (name, version); each contract "
        "version is defined once",
        id="duplicate name and version",
    ),
    pytest.param(
        _one(MINIMAL)
        + _one('name = "p.y"\nversion = "1"\nsafety = "unsafe"\ntool = "p.x"\n'),
        "contract 'p.y' v1: field 'active': tool 'p.x' already has active contract "
        "'p.x' v1; at most one active per tool",
        id="two active contracts for one tool",
    ),
    pytest.param(
        "retry_limit = 3\n" + _one(MINIMAL),
        "field 'retry_limit': unknown top-level key; the file holds only [[contract]] "
        "and [[passthrough]] tables",
        id="unknown top-level key",
    ),
    pytest.param(
        "[contract]\n" + MINIMAL,
        "field 'contract': must be an array of tables: write [[contract]], not "
        "[contract]",
        id="single table instead of array",
    ),
]


@pytest.mark.parametrize(("text", "message"), RULES)
def test_given_rule_violated_then_error_names_file_contract_and_field(
    text: str, message: str
) -> None:
    with pytest.raises(ContractError) as caught:
        parse_contracts(text, source="contracts.toml")
    assert str(caught.value) == f"contracts.toml: {message}"
    assert caught.value.details["file"] == "contracts.toml"
    assert caught.value.details["field"] is not None


def test_given_toml_syntax_error_then_error_names_file_and_line() -> None:
    text = _one('name = "p.x"\nversion = \nsafety = "unsafe"\n')
    with pytest.raises(ContractError) as caught:
        parse_contracts(text, source="contracts.toml")
    assert str(caught.value) == (
        "contracts.toml: invalid TOML: Invalid value (at line 3, column 11)"
    )
    assert caught.value.details["line"] == 3


def test_given_inactive_second_version_for_a_tool_then_it_is_allowed() -> None:
    text = _one(MINIMAL) + _one('name = "p.x"\nversion = "2"\nsafety = "unsafe"\n')
    text = text.replace('version = "2"\n', 'version = "2"\nactive = false\n')
    assert [c.version for c in _parse(text)] == ["1", "2"]


# --- durations --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500ms", timedelta(milliseconds=500)),
        ("1.5s", timedelta(seconds=1.5)),
        ("0.1s", timedelta(microseconds=100_000)),
        ("30s", timedelta(seconds=30)),
        ("1m", timedelta(minutes=1)),
        ("24h", timedelta(hours=24)),
        ("7d", timedelta(days=7)),
    ],
)
def test_given_duration_string_then_it_parses_exactly(
    text: str, expected: timedelta
) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "value",
    ["24", "1 h", "1H", "-1s", "1.s", ".5s", "1e3s", "", "1h30m", 24, 1.5, True, None],
)
def test_given_malformed_duration_then_value_error_shows_the_form(value: Any) -> None:
    with pytest.raises(ValueError, match=r"expected a duration string such as '500ms'"):
        parse_duration(value)


@pytest.mark.parametrize("value", ["0s", "0ms", "0.0h"])
def test_given_zero_duration_then_value_error(value: str) -> None:
    with pytest.raises(ValueError, match=r"^must be positive"):
        parse_duration(value)


def test_given_absurd_duration_then_value_error_not_overflow() -> None:
    with pytest.raises(ValueError, match=r"^too large"):
        parse_duration("99999999999d")


# --- the dataclass itself ---------------------------------------------------------------


def _contract(**overrides: Any) -> EffectContract:
    fields: dict[str, Any] = {
        "name": "p.x",
        "version": "1",
        "tool": "p.x",
        "safety": SafetyClass.UNSAFE,
        "retry_limit": 3,
        "key_retention": None,
        "settlement_bound": None,
    }
    fields.update(overrides)
    return EffectContract(**fields)


def test_given_backoff_then_it_doubles_from_initial_and_caps_at_max() -> None:
    contract = _contract(
        backoff_initial=timedelta(milliseconds=500), backoff_max=timedelta(seconds=5)
    )
    delays = [contract.backoff(attempt) for attempt in range(1, 7)]
    assert delays == [
        timedelta(milliseconds=500),
        timedelta(seconds=1),
        timedelta(seconds=2),
        timedelta(seconds=4),
        timedelta(seconds=5),
        timedelta(seconds=5),
    ]
    assert contract.backoff(10_000) == timedelta(seconds=5)


def test_given_attempt_zero_then_backoff_refuses() -> None:
    with pytest.raises(ValueError, match=r"^attempt is 1-based, got 0$"):
        _contract().backoff(0)


def test_given_contract_built_in_code_then_same_invariants_apply_without_a_file() -> None:
    with pytest.raises(ContractError) as caught:
        _contract(safety=SafetyClass.IDEMPOTENT)
    assert str(caught.value) == (
        "contract 'p.x' v1: field 'key_retention': required for safety class idempotent"
    )


def test_given_safety_string_in_code_then_it_becomes_the_enum() -> None:
    assert _contract(safety="unsafe").safety is SafetyClass.UNSAFE


def test_given_adapter_options_then_they_are_deeply_frozen() -> None:
    contract = _contract(adapter_options={"headers": {"a": "1"}, "codes": [500, 502]})
    assert isinstance(contract.adapter_options, MappingProxyType)
    assert contract.adapter_options["codes"] == (500, 502)
    headers: Any = contract.adapter_options["headers"]
    with pytest.raises(TypeError):
        headers["a"] = "2"


def test_given_contracts_then_they_are_hashable_and_equal_by_value() -> None:
    assert hash(_contract()) == hash(_contract())
    assert {_contract(), _contract()} == {_contract()}


def test_given_registry_built_in_code_then_it_checks_uniqueness_too() -> None:
    with pytest.raises(ContractError) as caught:
        ContractRegistry([_contract(), _contract()])
    assert str(caught.value) == (
        "contract 'p.x' v1: field 'version': duplicate (name, version); each contract "
        "version is defined once"
    )


def test_a_preview_field_may_not_start_with_a_dollar() -> None:
    # "$hidden_fields" counts what a preview leaves out; a field must not shadow it.
    toml = """
[[contract]]
name = "payments.charge"
version = "1"
tool = "charge_card"
safety = "unsafe"
adapter = "simulated"
preview_fields = ["$hidden_fields"]
"""
    with pytest.raises(ContractError, match="preview_fields"):
        parse_contracts(toml, source="inline")


def test_declared_secrets_are_the_contracts_and_the_tenants_own() -> None:
    text = _one(
        MINIMAL + 'secrets = ["env:SHARED"]\n'
        'tenant_secrets = { acme = ["env:ACME_KEY", "file:card-token"] }\n'
    )
    contract = parse_contracts(text).for_tool("p.x")
    assert contract.secrets == ("env:SHARED",)
    assert contract.declared_secrets("acme") == {
        "env:SHARED",
        "env:ACME_KEY",
        "file:card-token",
    }
    assert contract.declared_secrets("globex") == {"env:SHARED"}


def test_a_contract_without_secrets_declares_none() -> None:
    assert parse_contracts(_one(MINIMAL)).for_tool("p.x").declared_secrets("acme") == (
        frozenset()
    )
