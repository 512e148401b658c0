"""Issue 22, items 2 and 3: reading MCP answers in text, and keys that fit a name.

The upstream is a real stdio MCP server written here (``mcp_text_server.py``) that
answers as common servers do: text blocks, and failures raised as the SDK's ``isError``
text. Its records live in its own SQLite file, the truth these tests count.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from effect_broker.adapters.base import DispatchRequest, ProbeRequest
from effect_broker.adapters.conformance import make_effect_record
from effect_broker.adapters.mcp_adapter import McpAdapter
from effect_broker.domain.contracts import EffectContract, parse_contracts
from effect_broker.domain.errors import (
    ContractError,
    OutcomeUnknownError,
    RetryableAdapterError,
)
from effect_broker.domain.keys import downstream_key, spell_key
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import ProbeStatus

ROOT = Path(__file__).resolve().parents[2]
ARGUMENTS = {"order": "42", "amount_minor": 1999}
TENANT_KEY = b"t" * 32

CALL_TEXT = """
[contract.upstream.answer]
pattern = "Created|already exists"
committed = ["Created"]
already_done = ["already exists"]
id_pattern = "id (rec_[0-9]+)"
"""
LOOKUP_TEXT = """
[contract.upstream.lookup_answer]
pattern = "^Record|no record named"
committed = ["Record"]
not_committed = ["no record named"]
id_pattern = "id (rec_[0-9]+)"
"""


def contracts_toml(
    store: Path,
    *,
    safety: str = "idempotent",
    tool: str = "create_record",
    answer: str = CALL_TEXT,
    lookup: str = "",
    key: str = 'key_template = "eb-{key}"\nkey_alphabet = "hex"\n',
) -> str:
    bounds = (
        'key_retention = "24h"\n'
        if safety == "idempotent"
        else 'settlement_bound = "1s"\n'
    )
    lookup_lines = 'lookup_tool = "find_record"\n' if lookup else ""
    return f"""
[[contract]]
name = "records.create"
version = "1"
safety = "{safety}"
{bounds}adapter = "mcp"
{key}
[contract.upstream]
command = "{sys.executable}"
args = ["-m", "tests.contract.mcp_text_server"]
cwd = "{ROOT}"
env = {{ RECORDS_DB = "{store}", STARTS_FILE = "{store}.starts" }}
tool = "{tool}"
key_argument = "name"
{lookup_lines}{answer}{lookup}"""


def contract_for(text: str) -> EffectContract:
    return next(iter(parse_contracts(text)))


def effect(contract: EffectContract) -> EffectRecord:
    operation_key = f"records:{uuid.uuid4().hex}"
    key = downstream_key(TENANT_KEY, "tenant", operation_key)
    return make_effect_record(contract, operation_key, ARGUMENTS, key)


def dispatch(adapter: McpAdapter, record: EffectRecord):  # type: ignore[no-untyped-def]
    return adapter.dispatch(
        DispatchRequest(
            effect=record,
            arguments=ARGUMENTS,
            attempt_id=str(uuid.uuid4()),
            contract=adapter.contract,
        )
    )


def probe(adapter: McpAdapter, record: EffectRecord):  # type: ignore[no-untyped-def]
    return adapter.probe(
        ProbeRequest(effect=record, arguments=ARGUMENTS, contract=adapter.contract)
    )


def names(store: Path) -> list[str]:
    with sqlite3.connect(store) as conn:
        return [row[0] for row in conn.execute("SELECT name FROM records ORDER BY n")]


def test_an_already_exists_answer_to_a_resend_is_the_commit_found_again(
    tmp_path: Path,
) -> None:
    # Given an idempotent contract whose upstream's key is a record name, and whose
    # answers are read in text ("Created ...", "... already exists")
    store = tmp_path / "records.db"
    adapter = McpAdapter(contract_for(contracts_toml(store)))
    record = effect(adapter.contract)
    # When the first attempt commits and a resend under the same key follows
    first = dispatch(adapter, record)
    again = dispatch(adapter, record)
    # Then the first is committed with the id read from the text
    assert first.external_id == "rec_1"
    assert first.output == {"text": f"Created record {names(store)[0]} (id rec_1)."}
    # and the resend's "already exists" is a commit too, the answer kept as evidence
    assert again.external_id is None
    assert again.output["already_done"] == "already exists"
    assert "already exists" in str(again.output["text"])
    # And the upstream's own store holds one record, named by the template in hex
    hex_key = spell_key(record.downstream_key, "hex")
    assert names(store) == [f"eb-{hex_key}"]


def test_without_answer_reading_already_exists_stays_unknown(tmp_path: Path) -> None:
    # Given the same upstream with no [contract.upstream.answer] (the code lists only)
    store = tmp_path / "records.db"
    adapter = McpAdapter(contract_for(contracts_toml(store, answer="")))
    record = effect(adapter.contract)
    dispatch(adapter, record)
    # When the resend is answered "already exists" (isError, no code)
    # Then it can only be unknown: nothing says what the text proves
    with pytest.raises(OutcomeUnknownError):
        dispatch(adapter, record)
    assert len(names(store)) == 1


def test_a_lookup_answering_in_text_proves_both_ways(tmp_path: Path) -> None:
    # Given a reconcilable contract whose lookup tool answers in text
    store = tmp_path / "records.db"
    contract = contract_for(
        contracts_toml(store, safety="reconcilable", lookup=LOOKUP_TEXT)
    )
    adapter = McpAdapter(contract)
    committed, absent = effect(contract), effect(contract)
    result = dispatch(adapter, committed)
    # When the lookup asks for a committed name and for one never sent
    found, missing = probe(adapter, committed), probe(adapter, absent)
    # Then it finds the first with its id, and proves the second absent
    assert (found.status, found.external_id) == (ProbeStatus.COMMITTED, "rec_1")
    assert result.external_id == "rec_1"
    assert found.evidence is not None
    assert str(found.evidence["text"]).startswith("Record eb-")
    assert missing.status is ProbeStatus.NOT_COMMITTED
    assert missing.evidence is not None
    assert "no record named" in str(missing.evidence["text"])


def test_a_json_answer_printed_as_text_is_read_by_pointer(tmp_path: Path) -> None:
    # Given an answer reading by JSON pointer, for a server printing JSON as text
    store = tmp_path / "records.db"
    answer = """
[contract.upstream.answer]
pointer = "/status"
id_pointer = "/id"
committed = ["created"]
"""
    adapter = McpAdapter(
        contract_for(contracts_toml(store, tool="create_record_json", answer=answer))
    )
    # When it answers {"status": "created", "id": "rec_1"} in a text block
    result = dispatch(adapter, effect(adapter.contract))
    # Then the value and the id are read from it
    assert result.external_id == "rec_1"
    assert result.output == {"status": "created", "id": "rec_1"}


def test_an_answer_the_reading_cannot_read_is_unknown(tmp_path: Path) -> None:
    # Given a reading whose pattern the server's success text does not match
    store = tmp_path / "records.db"
    answer = """
[contract.upstream.answer]
pattern = "(?P<status>OK|REJECTED)"
not_committed = ["REJECTED"]
"""
    adapter = McpAdapter(contract_for(contracts_toml(store, answer=answer)))
    # When the tool creates the record and answers "Created ..."
    # Then the outcome is unknown, never a success read from nothing
    with pytest.raises(OutcomeUnknownError) as caught:
        dispatch(adapter, effect(adapter.contract))
    assert caught.value.details["upstream_answer"] is None
    assert len(names(store)) == 1


def test_a_documented_not_committed_text_is_retryable(tmp_path: Path) -> None:
    # Given a reading that documents "already exists" as a refusal (a name shared
    # with someone else's record: NOT this key's commit)
    store = tmp_path / "records.db"
    answer = """
[contract.upstream.answer]
pattern = "Created|already exists"
not_committed = ["already exists"]
"""
    adapter = McpAdapter(contract_for(contracts_toml(store, answer=answer)))
    record = effect(adapter.contract)
    dispatch(adapter, record)
    with pytest.raises(RetryableAdapterError):
        dispatch(adapter, record)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            '[contract.upstream.answer]\npointer = "/s"\npattern = "x"\n'
            'committed = ["a"]\n',
            "field 'upstream.answer.pointer': give exactly one of pointer",
        ),
        (
            '[contract.upstream.answer]\npattern = "("\ncommitted = ["a"]\n',
            "field 'upstream.answer.pattern': not a regular expression",
        ),
        (
            '[contract.upstream.answer]\npointer = "status"\ncommitted = ["a"]\n',
            "field 'upstream.answer.pointer': must be a JSON pointer",
        ),
        (
            '[contract.upstream.answer]\npattern = "x"\n',
            "field 'upstream.answer.committed': list at least one of",
        ),
        (
            '[contract.upstream.answer]\npattern = "x"\ncommitted = ["a"]\n'
            'failed = ["a"]\n',
            "field 'upstream.answer.failed': 'a' is also in committed",
        ),
    ],
)
def test_a_bad_answer_reading_is_refused_at_load(
    tmp_path: Path, table: str, message: str
) -> None:
    with pytest.raises(ContractError) as caught:
        parse_contracts(contracts_toml(tmp_path / "r.db", answer=table))
    assert message in str(caught.value)


def test_a_lookup_reading_must_prove_both_ways(tmp_path: Path) -> None:
    lookup = '[contract.upstream.lookup_answer]\npattern = "x"\ncommitted = ["x"]\n'
    with pytest.raises(ContractError) as caught:
        parse_contracts(
            contracts_toml(tmp_path / "r.db", safety="reconcilable", lookup=lookup)
        )
    assert "field 'upstream.lookup_answer.not_committed': required" in str(caught.value)


# --- item 3: keys that fit the upstream ---------------------------------------------


def test_a_hex_key_never_starts_with_a_dash() -> None:
    # Given many operation keys (a base64url key starts with "-" 1 time in 64)
    keys = [downstream_key(TENANT_KEY, "t", f"op:{n}") for n in range(2000)]
    dashed = [k for k in keys if k.startswith("-")]
    assert dashed, "the sample must contain base64url keys that start with '-'"
    # Then the hex spelling of every one is 64 hex digits, never "-"-first
    for key in keys:
        spelled = spell_key(key, "hex")
        assert len(spelled) == 64
        assert set(spelled) <= set("0123456789abcdef")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('key_template = "-{key}"', "field 'key_template': must not start with '-'"),
        (
            'key_template = "eb-"',
            "field 'key_template': must contain \"{key}\" exactly once",
        ),
        ('key_template = "{key}-{key}"', 'must contain "{key}" exactly once'),
        ('key_template = "{op}-{key}"', 'may hold no braces other than "{key}"'),
        (
            'key_alphabet = "base32"',
            "field 'key_alphabet': must be one of base64url, hex",
        ),
    ],
)
def test_a_bad_key_spelling_is_refused_at_load(line: str, message: str) -> None:
    text = f"""
[[contract]]
name = "x"
version = "1"
safety = "unsafe"
{line}
"""
    with pytest.raises(ContractError) as caught:
        parse_contracts(text)
    assert message in str(caught.value)


def test_the_template_is_what_every_attempt_and_lookup_sends() -> None:
    contract = EffectContract(
        name="x",
        version="1",
        tool="x",
        safety="idempotent",  # type: ignore[arg-type]
        key_retention=timedelta(hours=1),
        key_template="eb-{key}",
        key_alphabet="hex",
    )
    record = effect(contract)
    request = DispatchRequest(
        effect=record, arguments={}, attempt_id="a", contract=contract
    )
    lookup = ProbeRequest(effect=record, arguments={}, contract=contract)
    expected = "eb-" + spell_key(record.downstream_key, "hex")
    assert request.downstream_key == lookup.downstream_key == expected


def test_the_docs_example_of_reading_text_answers_loads_as_written() -> None:
    readme = (ROOT / "docs" / "how-to" / "mcp-upstream.md").read_text(encoding="utf-8")
    after = readme.split("An upstream\nwhose key is a name, with both:", 1)[1]
    snippet = after.split("```toml\n", 1)[1].split("```", 1)[0]
    contract = next(iter(parse_contracts(snippet)))
    upstream = contract.upstream
    assert upstream is not None
    assert upstream.answer is not None
    assert upstream.answer.already_done == ("already exists",)
    assert upstream.lookup_answer is not None
    assert contract.upstream_key("A" * 43).startswith("eb-000000")


# --- item 4: one stdio process per worker, restarted when it dies ---------------------


def starts(store: Path) -> list[int]:
    path = Path(f"{store}.starts")
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_a_stdio_upstream_is_started_once_for_attempts_and_lookups(
    tmp_path: Path,
) -> None:
    # Given a reconcilable contract in front of a stdio server
    store = tmp_path / "records.db"
    contract = contract_for(
        contracts_toml(store, safety="reconcilable", lookup=LOOKUP_TEXT)
    )
    adapter = McpAdapter(contract)
    try:
        # When three effects are dispatched and each is looked up
        records = [effect(contract) for _ in range(3)]
        for record in records:
            dispatch(adapter, record)
        found = [probe(adapter, record).status for record in records]
        # Then one process served all six calls
        assert found == [ProbeStatus.COMMITTED] * 3
        assert len(starts(store)) == 1
    finally:
        adapter.close()


def test_a_stdio_upstream_that_died_is_restarted_before_the_next_call(
    tmp_path: Path,
) -> None:
    # Given a kept stdio server that served one attempt
    store = tmp_path / "records.db"
    adapter = McpAdapter(contract_for(contracts_toml(store)))
    try:
        dispatch(adapter, effect(adapter.contract))
        [first_pid] = starts(store)
        # When its process dies between two attempts
        os.kill(first_pid, signal.SIGKILL)
        wait_gone(first_pid)
        # Then the next attempt starts a new one (before anything is sent) and commits
        result = dispatch(adapter, effect(adapter.contract))
        assert result.external_id == "rec_2"
        assert len(starts(store)) == 2
        assert starts(store)[1] != first_pid
        assert len(names(store)) == 2
    finally:
        adapter.close()


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            if stat.read().split()[2] == "Z":  # a zombie: dead, not yet reaped
                return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not die")


def test_warm_up_starts_the_kept_server_and_sends_nothing(tmp_path: Path) -> None:
    # Given a stdio upstream not started yet
    store = tmp_path / "records.db"
    adapter = McpAdapter(contract_for(contracts_toml(store)))
    try:
        # When it is warmed up (the conformance kit does so before each attempt)
        adapter.warm_up()
        # Then its process runs, and no tool was called (the tool's store is not
        # even created)
        assert len(starts(store)) == 1
        assert not store.exists()
        # And the attempt and a second warm-up use that process: no other start
        assert dispatch(adapter, effect(adapter.contract)).external_id == "rec_1"
        adapter.warm_up()
        assert len(starts(store)) == 1
        assert len(names(store)) == 1
    finally:
        adapter.close()


def test_warm_up_of_a_server_that_never_initializes_is_retryable(
    tmp_path: Path,
) -> None:
    # Given a stdio "server" that reads its input and never answers the handshake
    contract = contract_for(contracts_toml(tmp_path / "records.db"))
    assert contract.upstream is not None
    silent = replace(
        contract.upstream,
        command=(sys.executable, "-c", "import sys; sys.stdin.read()"),
        connect_timeout=timedelta(milliseconds=500),
    )
    adapter = McpAdapter(replace(contract, upstream=silent))
    try:
        # When it is warmed up
        # Then it is unavailable within connect_timeout, proved not sent: retryable
        with pytest.raises(RetryableAdapterError) as raised:
            adapter.warm_up()
        assert raised.value.details["reason"] == "upstream_unavailable"
    finally:
        adapter.close()
