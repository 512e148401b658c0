"""``[contract.upstream]`` and ``[[passthrough]]``: the safety class of a tool behind the
mcp adapter follows what the upstream can prove, refused at load time with the file,
the contract and the field (issue 10, item 4)."""

from __future__ import annotations

import re
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from effect_broker.domain.contracts import EffectContract, load_contracts, parse_contracts
from effect_broker.domain.errors import ContractError
from effect_broker.domain.states import SafetyClass
from effect_broker.domain.upstream import METHOD_NOT_FOUND, McpUpstream
from tests import docs_pages


def contract(safety: str, upstream: str, extra: str = "", adapter: str = "mcp") -> str:
    return f"""
[[contract]]
name = "up.charge"
version = "2"
safety = "{safety}"
adapter = "{adapter}"
{extra}
[contract.upstream]
{upstream}
"""


STDIO = 'command = "python"\nargs = ["-m", "payments"]\ntool = "charge"\n'


def refused(text: str) -> str:
    with pytest.raises(ContractError) as caught:
        parse_contracts(text, source="contracts.toml")
    return str(caught.value)


def test_an_upstream_tool_is_unsafe_by_default_and_reads_its_defaults() -> None:
    registry = parse_contracts(contract("unsafe", STDIO), source="/etc/eb/c.toml")
    upstream = next(iter(registry)).upstream
    assert upstream == McpUpstream(
        tool="charge",
        command=("python", "-m", "payments"),
        # Issue 19, item 1: an isError with no documented code may follow a side
        # effect (the SDK's server answers every exception so): unknown, not final.
        tool_error="unknown",
        terminal_rpc_codes=(METHOD_NOT_FOUND,),
        timeout=timedelta(seconds=10),
    )


def test_idempotent_needs_the_argument_that_carries_the_key() -> None:
    message = refused(contract("idempotent", STDIO, 'key_retention = "24h"'))
    assert message.startswith(
        "contracts.toml: contract 'up.charge' v2: field 'upstream.key_argument': "
        "required for safety class idempotent"
    )
    ok = contract(
        "idempotent",
        STDIO + 'key_argument = "idempotency_key"\n',
        'key_retention = "24h"',
    )
    assert next(iter(parse_contracts(ok))).safety is SafetyClass.IDEMPOTENT


def test_reconcilable_needs_a_lookup_tool_and_a_settlement_bound() -> None:
    keyed = STDIO + 'key_argument = "reference"\n'
    assert (
        "field 'upstream.lookup_tool': required for safety class reconcilable"
        in refused(contract("reconcilable", keyed, 'settlement_bound = "2s"'))
    )
    assert "field 'settlement_bound': required" in refused(
        contract("reconcilable", keyed + 'lookup_tool = "lookup_charge"\n')
    )
    ok = contract(
        "reconcilable",
        keyed + 'lookup_tool = "lookup_charge"\n',
        'settlement_bound = "2s"',
    )
    upstream = next(iter(parse_contracts(ok))).upstream
    assert upstream is not None
    assert upstream.lookup_key_argument == "reference"


def test_a_lookup_by_the_downstream_key_needs_the_call_to_carry_it() -> None:
    message = refused(
        contract(
            "reconcilable",
            STDIO + 'lookup_tool = "lookup_charge"\n',
            'settlement_bound = "2s"',
        )
    )
    assert (
        "field 'upstream.lookup_by': a lookup by the downstream key needs key_argument"
        in message
    )
    # a business key in the arguments is another way to find the call
    by_order = STDIO + 'lookup_tool = "lookup_charge"\nlookup_by = "order"\n'
    parse_contracts(contract("reconcilable", by_order, 'settlement_bound = "2s"'))


def test_an_upstream_never_claims_transactional() -> None:
    assert "field 'safety': an upstream MCP server cannot share" in refused(
        contract("transactional", STDIO)
    )


@pytest.mark.parametrize(
    ("upstream", "extra", "adapter", "field", "reason"),
    [
        (STDIO, "", "http", "upstream", 'only for adapter = "mcp"'),
        ('tool = "charge"\n', "", "mcp", "upstream.command", "exactly one of command"),
        (
            STDIO + 'url = "http://x/mcp"\n',
            "",
            "mcp",
            "upstream.command",
            "exactly one of command",
        ),
        (
            'url = "ftp://x"\ntool = "c"\n',
            "",
            "mcp",
            "upstream.url",
            "http:// or https://",
        ),
        (STDIO + "retries = 2\n", "", "mcp", "upstream.retries", "unknown key"),
        (STDIO + 'tool_error = "retry"\n', "", "mcp", "upstream.tool_error", "one of"),
        (
            STDIO + "terminal_rpc_codes = [-32000]\n",
            "",
            "mcp",
            "upstream.terminal_rpc_codes",
            "can never be terminal",
        ),
        (
            STDIO + 'retryable_errors = ["x"]\nunknown_errors = ["x"]\n',
            "",
            "mcp",
            "upstream.unknown_errors",
            "one meaning",
        ),
        (STDIO + 'timeout = "10"\n', "", "mcp", "upstream.timeout", "duration"),
    ],
)
def test_a_bad_upstream_table_names_its_field(
    upstream: str, extra: str, adapter: str, field: str, reason: str
) -> None:
    message = refused(contract("unsafe", upstream, extra, adapter=adapter))
    assert f"field '{field}'" in message
    assert reason in message


def test_an_mcp_contract_without_an_upstream_is_refused_in_code_too() -> None:
    with pytest.raises(ContractError, match=re.escape("field 'upstream'")):
        EffectContract(
            name="x", version="1", tool="x", safety=SafetyClass.UNSAFE, adapter="mcp"
        )


PASS = """
[[passthrough]]
tool = "charge_stats"
read_only = true
[passthrough.upstream]
url = "http://127.0.0.1:9/mcp"
"""


def test_a_passthrough_is_parsed_with_its_upstream_tool_defaulting_to_its_name() -> None:
    registry = parse_contracts(PASS)
    (passthrough,) = registry.passthroughs
    assert passthrough.tool == passthrough.upstream.tool == "charge_stats"
    assert passthrough.read_only is True
    assert len(registry) == 0


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        (
            PASS.replace("read_only = true\n", ""),
            "passthrough['charge_stats'].read_only",
            "required",
        ),
        (
            PASS + 'key_argument = "k"\n',
            "passthrough['charge_stats'].upstream.key_argument",
            "has no ledger",
        ),
        (PASS + PASS, "passthrough.tool", "must be unique"),
        (
            PASS + contract("unsafe", STDIO).replace("up.charge", "charge_stats"),
            "passthrough.tool",
            "not a contract's tool",
        ),
        ("passthrough = 1", "passthrough", "[[passthrough]]"),
    ],
)
def test_a_bad_passthrough_names_its_field(text: str, field: str, reason: str) -> None:
    message = refused(text)
    assert f"field {field!r}" in message
    assert reason in message


def test_the_example_contracts_put_each_class_behind_the_payments_server() -> None:
    root = Path(__file__).resolve().parents[3]
    registry = load_contracts(root / "examples" / "contracts.toml")
    classes = {
        c.tool: (c.safety.value, c.upstream.tool if c.upstream else None)
        for c in registry
    }
    assert classes["upstream_charge"] == ("idempotent", "charge")
    assert classes["upstream_charge_by_reference"] == (
        "reconcilable",
        "charge_by_reference",
    )
    assert classes["upstream_charge_unkeyed"] == ("unsafe", "charge_unkeyed")
    (stats,) = registry.passthroughs
    # cwd = ".." is the repository root, wherever the broker runs from
    assert stats.upstream.cwd == str(root)
    # "{python}" is the interpreter running the broker, not whatever "python" the
    # PATH finds (issue 20: a clean machine's is not the venv's, or none)
    assert stats.upstream.command[:3] == (
        sys.executable,
        "-m",
        "examples.mcp_upstream.payments_server",
    )


def test_python_placeholder_is_the_brokers_interpreter_and_plain_names_stay() -> None:
    braced = STDIO.replace('command = "python"', 'command = "{python}"')
    (placeholder,) = parse_contracts(contract("unsafe", braced), source="t")
    assert placeholder.upstream is not None
    assert placeholder.upstream.command == (sys.executable, "-m", "payments")
    (plain,) = parse_contracts(contract("unsafe", STDIO), source="t")
    assert plain.upstream is not None
    assert plain.upstream.command[0] == "python"


def test_the_readme_worked_example_loads_as_written_and_matches_the_example_file() -> (
    None
):
    root = Path(__file__).resolve().parents[3]
    block = docs_pages.snippet("mcp-adapter-contract")
    # Read as if it were examples/contracts.toml (its cwd is relative to that file)
    (shown,) = parse_contracts(block, source=str(root / "examples" / "contracts.toml"))
    example = load_contracts(root / "examples" / "contracts.toml").for_tool(shown.tool)
    assert (shown.name, shown.safety, shown.key_retention, shown.adapter) == (
        example.name,
        example.safety,
        example.key_retention,
        example.adapter,
    )
    assert shown.upstream == example.upstream
    assert shown.mcp == example.mcp
